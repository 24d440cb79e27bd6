"""The kernels as custom ops under torch.compile (CPU, aot_eager), and the samplers' random draws.

``torch.compile(..., backend="aot_eager")`` needs no C++ compiler: it checks that each kernel
is one opaque ``hf_specdec::*`` node (fullgraph, fake shapes, the caches' mutation) and that a
loop over layers compiles once.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch._dynamo

from compile_recorder import Recorder, fresh_dynamo  # noqa: E402, F401  (an autouse fixture)
from hf_specdec import kernels as K  # noqa: E402

H, KVH, D, BS = 4, 2, 16, 4
OPS = ("write_kv_to_slots", "paged_attention", "rejection_sample", "typical_accept")




def _paged(gen, qlens, ctx_lens, num_layers=1):
    """Block tables, lengths after the step, query offsets, new tokens' slots, and per-layer caches."""
    qlens = torch.tensor(qlens)
    seq_lens = torch.tensor(ctx_lens) + qlens
    B = len(qlens)
    max_blocks = int((seq_lens.max() + BS - 1) // BS) + 1  # room for a longer next round
    block_tables = torch.randperm(B * max_blocks + 2, generator=gen)[: B * max_blocks].view(B, max_blocks).int()
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlens.cumsum(0)]).int()
    pos = torch.cat([torch.arange(int(s) - int(q), int(s)) for q, s in zip(qlens, seq_lens)])
    seq_of = torch.repeat_interleave(torch.arange(B), qlens)
    slots = block_tables[seq_of, pos // BS].long() * BS + pos % BS
    caches = [tuple(torch.randn(B * max_blocks + 2, BS, KVH, D, generator=gen) for _ in range(2))
              for _ in range(num_layers)]
    return block_tables, seq_lens.int(), qsl, int(qlens.max()), slots, caches


def _sampler_batch(gen, B=3, k=2, V=11):
    cu = torch.arange(1, B + 1) * k
    target = torch.softmax(torch.randn(B * (k + 1), V, generator=gen) * 2, -1)
    draft_probs = torch.softmax(torch.randn(B * k, V, generator=gen), -1)
    target_argmax = target.view(B, k + 1, V)[:, :k].reshape(B * k, V).argmax(-1)
    other = torch.randint(0, V, (B * k,), generator=gen)
    drafts = torch.where(torch.rand(B * k, generator=gen) < 0.5, target_argmax, other)
    return drafts, cu, draft_probs, target, k


def _op_cases():
    gen = torch.Generator().manual_seed(1)
    bt, seq_lens, qsl, max_q, slots, [(kc, vc)] = _paged(gen, [3, 1], [5, 9])
    T = slots.shape[0]
    query, new_k = torch.randn(T, H, D, generator=gen), torch.randn(T, KVH, D, generator=gen)
    drafts, cu, q, target, k = _sampler_batch(gen)
    u, e = K.draw_acceptance_noise(cu, drafts.shape[0], target.shape[-1], target.device)
    mixed = torch.tensor([True, False, True])
    ops = torch.ops.hf_specdec
    return {
        "write_kv_to_slots": (ops.write_kv_to_slots.default, (new_k, new_k, kc, vc, slots)),
        "paged_attention": (ops.paged_attention.default, (query, kc, vc, bt, seq_lens, qsl, max_q, 0.25, 6, 20.0)),
        "paged_attention_plain": (ops.paged_attention.default, (query, kc, vc, bt, seq_lens, qsl, max_q, 0.25,
                                                                None, None)),
        "rejection_sample": (ops.rejection_sample.default, (drafts, cu, q, target, mixed, k, u, e)),
        "rejection_sample_placeholders": (ops.rejection_sample.default, (drafts, cu, None, target, mixed | True, k,
                                                                         *K.greedy_noise_placeholders(cu.device))),
        "typical_accept": (ops.typical_accept.default, (drafts, cu, target, k, 0.09, 0.3, e)),
        "rotary_paged_attention": (ops.rotary_paged_attention.default, (
            query, new_k, new_k, *[torch.randn(T, D, generator=gen)] * 2, kc, vc, bt, seq_lens, qsl, slots, max_q,
            0.25, 6)),
        "rotary_paged_attention_plain": (ops.rotary_paged_attention.default, (
            query, new_k, new_k, *[torch.randn(T, D, generator=gen)] * 2, kc, vc, bt, seq_lens, qsl, slots, max_q,
            0.25, None)),
        "ngram_drafts": (ops.ngram_drafts.default, (torch.randint(0, 3, (3, 40), generator=gen),
                                                     torch.tensor([0, 5, 9]), torch.tensor([40, 30, 20]), 4, 1, 3)),
    }


@pytest.mark.parametrize("case", list(_op_cases()))
def test_opcheck(case):
    """torch.library.opcheck: schema (declared mutation), fake implementation and AOT dispatch agree with the real op."""
    op, args = _op_cases()[case]
    torch.library.opcheck(op, args)


def test_compiled_ops_match_eager():
    gen = torch.Generator().manual_seed(0)
    bt, seq_lens, qsl, max_q, slots, [(kc, vc)] = _paged(gen, [3, 1], [5, 9])
    T = slots.shape[0]
    new_k, new_v = (torch.randn(T, KVH, D, generator=gen) for _ in range(2))
    drafts, cu, q, target, k = _sampler_batch(gen)
    mixed = torch.tensor([True, False, False])

    def step(query, kc, vc, scale):
        K.write_kv_to_slots(new_k, new_v, kc, vc, slots)
        attn = K.paged_attention(query, kc, vc, bt, seq_lens, qsl, max_q, scale, 6, 20.0)
        plain = K.paged_attention(query, kc, vc, bt, seq_lens, qsl, max_q, scale)
        return (attn, plain, *K.rejection_sample(drafts, cu, q, target, mixed, k),
                *K.rejection_sample(drafts, cu, None, target, mixed, k, all_greedy=True),
                *K.typical_accept(drafts, cu, target, k, 0.09, 0.3))

    backend = Recorder()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for round_ in range(2):  # new values, same shapes and scale: the graph is reused
            query = torch.randn(T, H, D, generator=gen)
            want_caches, got_caches = (kc.clone(), vc.clone()), (kc.clone(), vc.clone())
            torch.manual_seed(round_)
            want = step(query, *want_caches, 0.25)
            torch.manual_seed(round_)
            got = compiled(query, *got_caches, 0.25)
            for w, g in zip(want, got):
                assert torch.equal(w, g), (w, g)
            assert all(torch.equal(w, g) for w, g in zip(want_caches, got_caches))
            assert not torch.equal(got_caches[0], kc)  # the write reached the caller's cache
    assert len(backend.codes) == 1
    for name in OPS:
        assert f"torch.ops.hf_specdec.{name}.default" in backend.codes[0], name


def test_layer_loop_compiles_once():
    """A python loop over layers (own caches, python int layer index) is one graph, and new
    lengths, queries and caches on the next round reuse it: no guard per layer, no recompile."""
    gen = torch.Generator().manual_seed(2)
    L = 4
    bt, seq_lens, qsl, max_q, slots, caches = _paged(gen, [2, 1, 3], [4, 11, 0], num_layers=L)
    T = slots.shape[0]

    def forward(x, caches, seq_lens):
        for layer_idx in range(L):
            kc, vc = caches[layer_idx]
            kv = x[:, :KVH] * (layer_idx + 1)
            K.write_kv_to_slots(kv, kv, kc, vc, slots)
            x = K.paged_attention(x, kc, vc, bt, seq_lens, qsl, max_q, D ** -0.5)
        return x

    backend = Recorder()
    compiled = torch.compile(forward, backend=backend, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for round_ in range(2):
            x = torch.randn(T, H, D, generator=gen)
            fresh = [(kc.clone(), vc.clone()) for kc, vc in caches]
            want = forward(x, [(kc.clone(), vc.clone()) for kc, vc in caches], seq_lens + round_)
            torch.testing.assert_close(compiled(x, fresh, seq_lens + round_), want, atol=0, rtol=0)
    assert len(backend.codes) == 1
    assert backend.codes[0].count("torch.ops.hf_specdec.paged_attention.default") == L


@pytest.mark.parametrize("with_q", [False, True])
def test_all_greedy_draws_no_random_numbers(with_q):
    gen = torch.Generator().manual_seed(3)
    drafts, cu, q, target, k = _sampler_batch(gen, B=5, k=3, V=17)
    q = q if with_q else None
    greedy = torch.ones(5, dtype=torch.bool)
    user_gen = torch.Generator().manual_seed(7)
    rng, user_rng = torch.get_rng_state(), user_gen.get_state()
    got = K.rejection_sample(drafts, cu, q, target, greedy, k, [user_gen] * 5, all_greedy=True)
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(user_gen.get_state(), user_rng)
    want = K.rejection_sample(drafts, cu, q, target, greedy, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_shared_generator_draws_in_one_batch():
    """One generator for every row: one batched draw, without reading the draft counts
    (they sit on the meta device here, so any host read would fail)."""
    B, N, V = 4, 10, 9
    cu_meta = torch.empty(B, dtype=torch.long, device="meta")
    g = torch.Generator().manual_seed(5)
    u, e = K.draw_acceptance_noise(cu_meta, N, V, torch.device("cpu"), [g] * B)
    ref = torch.Generator().manual_seed(5)
    want_u = torch.empty(N, dtype=torch.float64).uniform_(generator=ref)
    want_e = torch.empty(B, V).exponential_(generator=ref).clamp_(min=1e-10)
    assert torch.equal(u, want_u) and torch.equal(e, want_e)
    # typical acceptance draws no uniforms
    u2, _ = K.draw_acceptance_noise(cu_meta, N, V, torch.device("cpu"), [g] * B, with_uniform=False)
    assert u2.shape == (0,)


def test_seeded_samplers_reproduce():
    gen = torch.Generator().manual_seed(6)
    drafts, cu, q, target, k = _sampler_batch(gen, B=4, k=2, V=13)
    random = torch.zeros(4, dtype=torch.bool)

    def run(shared):
        one = torch.Generator().manual_seed(11)
        gens = [one] * 4 if shared else [torch.Generator().manual_seed(i) for i in range(4)]
        return (*K.rejection_sample(drafts, cu, q, target, random, k, gens),
                *K.typical_accept(drafts, cu, target, k, 0.09, 0.3, gens))

    for shared in (True, False):
        a, b = run(shared), run(shared)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
