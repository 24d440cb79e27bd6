"""A reduced-vocabulary draft (hf_specdec/reduced_vocab.py): greedy exactness on both paths, the head
itself (fill, soft-capping, processors, torch.compile), errors, and the save/load round trip."""
import copy

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper
from transformers.generation.logits_process import EtaLogitsWarper, TopPLogitsWarper, TypicalLogitsWarper

import hf_specdec
from safetensors.torch import load_file

from hf_specdec.reduced_vocab import (ReducedVocabHead, check_token_ids, fill_value, reduce_vocab, reduced_head,
                                      restrict_output_layer)
from hf_specdec.reduced_vocab_io import load_reduced_draft, save_reduced_draft
from hf_specdec.round.logits.graph_logits import graph_safe_logits
from models import left_padded_prompts
from reduced_models import make_gemma, make_phi, make_target, random_kept, reduced_copy

V, KEEP, K, MAX_NEW = 512, 128, 3, 13


@pytest.fixture(scope="module")
def targets():
    return {family: hf_specdec.enable(make_target(family, seed=i + 30, vocab=V))
            for i, family in enumerate(["llama", "gemma3"])}


def greedy_tokens(target, ids, mask, n):
    """The target's own greedy continuation (n tokens) of every row, as a set of ids."""
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, eos_token_id=None)
    return out[:, ids.shape[1]:].unique()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["full", "partial"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_greedy_equals_target_greedy(targets, family, kind, batch):
    """'full': the target's head reduced to a quarter of the vocabulary that holds every token of its greedy
    path, so every draft is accepted. 'partial': a quarter without half of those tokens, so drafts are
    rejected where the target's choice is not in the kept set; the output is the target's either way."""
    target = targets[family]
    ids, mask = left_padded_prompts(batch, seed=batch * 7 + 1, vocab=V)
    path = greedy_tokens(target, ids, mask, MAX_NEW + K + 1)
    if kind == "full":
        kept = random_kept(V, KEEP, seed=batch, include=path)
    else:
        kept = random_kept(V, KEEP, seed=batch, include=path[::2], exclude=path[1::2])
    draft = reduced_copy(target, kept)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False,
                          max_new_tokens=MAX_NEW, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=4,
                                                            adaptive=False))
    assert torch.equal(out.sequences, expected)
    assert out.spec_metrics.fast_path == "bucketed"
    if kind == "full":
        assert out.spec_metrics.acceptance_rate == 1.0
    else:
        assert 0.0 < out.spec_metrics.acceptance_rate < 1.0


@pytest.mark.parametrize("acceptance", ["rejection", "typical"])
def test_sampling_with_processors_runs_on_both_paths(targets, acceptance):
    """Temperature, top-p and repetition penalty on the draft's filled logits; the runner keeps its
    graph-safe processors (no fallback to eager) and every emitted token is a real vocabulary id."""
    target = targets["gemma3"]
    ids, mask = left_padded_prompts(3, seed=5, vocab=V)
    draft = reduced_copy(target, random_kept(V, KEEP, seed=3), noise=0.3)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=True, temperature=0.7,
                          top_p=0.9, top_k=0, repetition_penalty=1.3, max_new_tokens=MAX_NEW, eos_token_id=None,
                          return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=4,
                                                            acceptance=acceptance,
                                                            generator=torch.Generator().manual_seed(0)))
    new = out.sequences[:, ids.shape[1]:]
    assert new.shape == (3, MAX_NEW) and bool(((new >= 0) & (new < V)).all())
    assert out.spec_metrics.fast_path == "bucketed"
    assert out.spec_metrics.num_draft_tokens > 0


def test_head_scatters_kept_logits_and_caps_only_them():
    """Soft-capping moves into the head: kept logits equal the original model's, the rest stay at the fill."""
    target = make_gemma(seed=1, vocab=64, softcap=3.0)
    kept = torch.tensor([0, 1, 2, 5, 17, 40, 63])
    draft = reduce_vocab(copy.deepcopy(target), kept)
    assert draft.config.final_logit_softcapping is None and reduced_head(draft).softcap == 3.0
    ids = torch.randint(3, 64, (2, 9))
    with torch.no_grad():
        want, got = target(ids).logits, draft(ids).logits
    torch.testing.assert_close(got[..., kept], want[..., kept], rtol=1e-5, atol=1e-5)
    others = torch.ones(64, dtype=torch.bool)
    others[kept] = False
    assert bool((got[..., others] == fill_value(got.dtype)).all())
    assert float(want.abs().max()) <= 3.0  # capping did act on the original
    # logits_to_keep (what the paged forward passes) selects rows before the head
    with torch.no_grad():
        last = draft(ids, logits_to_keep=torch.tensor([3, 8])).logits
    torch.testing.assert_close(last[0], got[0, [3, 8]])


def test_a_head_of_every_token_returns_its_logits_in_place(monkeypatch):
    """Every token kept (a narrow draft head's own output layer): the ids are 0..V-1 in order, so the logits are the
    matmul's own (capped), with no scatter into a filled row."""
    gen = torch.Generator().manual_seed(4)
    weight, bias, hidden = torch.randn(10, 6, generator=gen), torch.randn(10, generator=gen), torch.randn(3, 6)
    head = ReducedVocabHead(weight, torch.arange(10), 10, softcap=2.0, bias=bias)
    mirrored = ReducedVocabHead(weight.flip(0), torch.arange(9, -1, -1), 10, softcap=2.0, bias=bias.flip(0))
    assert torch.equal(mirrored.token_ids, torch.arange(10))  # rows given in the ids' order, kept sorted by id
    with torch.no_grad(), monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "index_copy", lambda *a, **k: pytest.fail("every token kept: no scatter"))
        got = head(hidden)
    torch.testing.assert_close(got, torch.tanh(torch.nn.functional.linear(hidden, weight, bias) / 2.0) * 2.0)
    assert torch.equal(got, head.kept_logits(hidden)) and torch.equal(mirrored(hidden), got)


@pytest.mark.parametrize("runner", [False, True], ids=["hf", "graph_safe"])
def test_processed_draft_probabilities_are_zero_outside_the_kept_set(runner):
    """Through temperature, top-p, typical, eta and repetition penalty (Hugging Face's and the runner's
    fixed-shape rebuilds): no NaN, no mass outside the kept set, kept mass renormalised."""
    kept = torch.tensor([0, 3, 4, 9, 20, 31])
    head = ReducedVocabHead(torch.randn(len(kept), 8), kept, 32)
    with torch.no_grad():
        scores = head(torch.randn(4, 8) * 3)
    history = torch.tensor([[3, 4, 9, 9, 30], [1, 2, 3, 4, 5]])
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(0.5),
                                      TypicalLogitsWarper(0.95), EtaLogitsWarper(1e-4, device="cpu"),
                                      TopPLogitsWarper(0.99)])
    if runner:
        pipeline, reason = graph_safe_logits(processors)
        assert reason is None
        out = pipeline(scores, history, torch.tensor([0, 0, 1, 1]), torch.tensor([4, 5, 3, 5]))
    else:
        out = processors(history[[0, 0, 1, 1]], scores)
    probs = torch.softmax(out, -1).detach()
    assert not torch.isnan(probs).any()
    outside = torch.ones(32, dtype=torch.bool)
    outside[kept] = False
    assert float(probs[:, outside].sum()) == 0.0
    torch.testing.assert_close(probs[:, kept].sum(-1), torch.ones(4))


@pytest.mark.parametrize("bias", [False, True])
def test_head_compiles_once_for_every_row_count(bias):
    """The head is one graph (fullgraph) that later row counts reuse (dynamic shapes: no recompilation),
    and computes what it computes eagerly (its bias too)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    head = ReducedVocabHead(torch.randn(5, 8), torch.tensor([1, 4, 6, 7, 9]), 12, softcap=2.0,
                            bias=torch.randn(5) if bias else None)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(head, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    with torch.no_grad():
        for rows in (2, 3, 7):
            x = torch.randn(1, rows, 8)
            torch.testing.assert_close(compiled(x), head(x))
            frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[-1] == frames[0]
    torch._dynamo.reset()


def test_bad_token_ids_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        check_token_ids([1, 10], 10)
    with pytest.raises(ValueError, match="duplicates"):
        check_token_ids([1, 1, 2], 10)
    with pytest.raises(ValueError, match="at least one"):
        check_token_ids([], 10)
    draft = reduce_vocab(make_target("llama", seed=0, vocab=40), [0, 1, 2, 5])
    with pytest.raises(ValueError, match="already has a reduced"):
        reduce_vocab(draft, [0, 1])


def test_save_load_round_trip(targets, tmp_path):
    """With the target: the file omits the embedding and the loaded draft shares the target's tensor; without:
    the embedding is stored. Both give the saved draft's logits and greedy output; a wrong or missing target
    is refused by name."""
    target = targets["gemma3"]
    draft = reduced_copy(target, random_kept(V, KEEP, seed=11), noise=0.2)
    ids, mask = left_padded_prompts(2, seed=3, vocab=V)
    with torch.no_grad():
        want = draft(ids, attention_mask=mask).logits
    save_reduced_draft(draft, tmp_path / "shared", target=target)
    save_reduced_draft(draft, tmp_path / "stored")
    size = {name: (tmp_path / name / "model.safetensors").stat().st_size for name in ("shared", "stored")}
    assert size["shared"] < size["stored"]
    shared = load_reduced_draft(tmp_path / "shared", target=target)
    assert shared.get_input_embeddings().weight is target.get_input_embeddings().weight
    stored = load_reduced_draft(tmp_path / "stored")
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=K))
    expected = target.generate(assistant_model=draft, **kw)
    for loaded in (shared, stored):
        assert torch.equal(reduced_head(loaded).token_ids, reduced_head(draft).token_ids)
        with torch.no_grad():
            assert torch.equal(loaded(ids, attention_mask=mask).logits, want)
        assert torch.equal(target.generate(assistant_model=loaded, **kw), expected)
    with pytest.raises(ValueError, match="pass the target"):
        load_reduced_draft(tmp_path / "shared")
    with pytest.raises(ValueError, match="not the one"):
        load_reduced_draft(tmp_path / "shared", target=targets["llama"])
    half = load_reduced_draft(tmp_path / "shared", target=target, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and target.dtype == torch.float32  # a cast copy, the target untouched
    with pytest.raises(ValueError, match="reduce_vocab"):
        save_reduced_draft(target, tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="not a reduced-vocabulary draft"):
        load_reduced_draft(tmp_path / "nothing")


def test_an_output_bias_is_kept_and_round_trips(tmp_path):
    """A Phi-style output layer with a bias: the restricted layer and a reduced draft keep its kept entries, so
    their logits are the target's at the kept ids (fp32); save / load keeps it (``lm_head.bias`` in the file)."""
    target = make_phi(seed=5, vocab=64)
    kept = torch.tensor([0, 1, 2, 7, 19, 33, 63])
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = target(ids).logits[..., kept]
        kept_logits = restrict_output_layer(target, kept).kept_logits(target.model(ids).last_hidden_state)
        draft = reduce_vocab(copy.deepcopy(target), kept)
        torch.testing.assert_close(kept_logits, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(draft(ids).logits[..., kept], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(reduced_head(draft).bias, target.lm_head.bias[kept])
    save_reduced_draft(draft, tmp_path / "phi", target=target)
    assert "lm_head.bias" in load_file(str(tmp_path / "phi" / "model.safetensors"))
    loaded = load_reduced_draft(tmp_path / "phi", target=target)
    assert torch.equal(reduced_head(loaded).bias, reduced_head(draft).bias)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, draft(ids).logits)
    with pytest.raises(ValueError, match="one bias entry per kept token"):
        ReducedVocabHead(torch.randn(3, 8), torch.tensor([1, 2, 3]), 8, bias=torch.randn(4))


def test_a_file_without_a_bias_loads_bias_free(tmp_path):
    """A bias-free head is saved as before heads had biases (no ``lm_head.bias`` key): such a file, old or new,
    loads with no bias and the saved logits."""
    draft = reduce_vocab(make_target("llama", seed=2, vocab=40), [0, 1, 2, 5, 9, 30])
    save_reduced_draft(draft, tmp_path / "plain")
    assert not [k for k in load_file(str(tmp_path / "plain" / "model.safetensors")) if k.endswith(".bias")]
    loaded = load_reduced_draft(tmp_path / "plain")
    assert reduced_head(loaded).bias is None
    ids = torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, draft(ids).logits)
