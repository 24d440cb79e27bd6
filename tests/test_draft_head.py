"""A draft head (``hf_specdec.DraftHead``, EAGLE-style) as ``assistant_model``: exact output, and reads right.

Exactness alone cannot show that a head reads the right inputs (a random head's drafts are all rejected and
the output is still the target's), so besides greedy equality, the sampled law and the output_scores /
EOS paths, two tests look at what the head reads:

- a *perfect* head for a target whose attention contributes nothing (``perfect_pair``): its next token depends
  on the current token only, and the head copies the target's layer, so every draft is accepted exactly when the
  head reads token t_{i+1} at position i and its logits are taken at each row's last committed pair;
- spies on the head's forwards (``record_head_reads``): the features of its prefill and of each round's first read
  are the target's own last hidden states at those positions (a plain forward of the final sequences), the tokens
  are the sequence's next ones, every position is read once, and later draft steps read the head's own output;
  also across bucket rebuilds (rows in waves) and shrinks.

On CPU the runner runs without CUDA graphs (the same code the graphs capture).
"""
import inspect
import itertools

import pytest
import torch

import hf_specdec
from hf_specdec.round.policy.speculation_length import SpeculationLength
from hf_specdec.round.proposers import HeadProposer
from hf_specdec.runner import prefill, runner_for
from hf_specdec.runner.paged_model import PagedModel
from hf_specdec.runner.spec_runner import SpecRunner
from models import VOCAB, left_padded_prompts, make_model
from reduced_models import make_gemma

MAX_NEW = 13  # not a multiple of k+1 for any k tested
BLOCK = 4


@pytest.fixture(scope="module")
def targets():
    models = {"llama": make_model("llama", seed=0), "qwen2": make_model("qwen2", seed=1),
              "gpt2": make_model("gpt2", seed=2), "gemma3": make_gemma(3, VOCAB, softcap=30.0)}
    return {family: hf_specdec.enable(m) for family, m in models.items()}


@pytest.fixture(scope="module")
def perfect():
    return perfect_pair(seed=5)


def head_for(target, seed=0, **kw):
    torch.manual_seed(seed)
    return hf_specdec.DraftHead.for_target(target, **kw)


def spec(k, adaptive=False, **kw):
    """adaptive=False: every live row drafts k tokens each round; None: the default policy (rounds of k = 0 too)."""
    return hf_specdec.SpecConfig(num_speculative_tokens=k, block_size=BLOCK, adaptive=adaptive, **kw)


def perfect_pair(seed):
    """A 1-layer Llama whose attention adds nothing (o_proj = 0: each next token depends on the current token only)
    and a head that computes exactly its next feature: fc keeps the embedding half (f_i is not needed), its layer and
    norm are the target's. Head position i then reads t_{i+1} and outputs f_{i+1}, whose logits are the target's."""
    target = make_model("llama", seed=seed, layers=1)
    layer = target.model.layers[0]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
    target = hf_specdec.enable(target)
    head = hf_specdec.DraftHead.for_target(target)
    assert type(head.layers[0]) is type(layer)  # so that the target's layer weights load as they are
    H = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1))
    head.layers[0].load_state_dict(layer.state_dict())
    head.norm.load_state_dict(target.model.norm.state_dict())
    return target, head


def alternate_k(monkeypatch, k):
    """The adaptive policy decides 0, k, 0, k, ...: rounds of k = 0 (the head still reads) between drafting ones."""
    monkeypatch.setattr(SpeculationLength, "_choose",
                        lambda self, bucket, rows, remaining: k if sum(self.histogram.values()) % 2 else 0)


def record_head_reads(monkeypatch, K):
    """What the head reads: ``rounds``, each round's first head forward (features given, q = K+1 tokens a row), with
    the bucket's rows as the proposer saw them (batch row, tokens committed by the last round, length, the round's
    k); ``prompts``, each prefill's head forward (packed (feature, next token) pairs) with the batch rows it read;
    ``steps``, for each later draft step, whether it read the g that the step before output at each row."""
    reads, bucket, started = {"rounds": [], "prompts": [], "steps": []}, {}, []
    propose, forward, read_prompts, packed = (HeadProposer.propose, PagedModel.forward, SpecRunner.prefill,
                                              prefill.paged_forward)
    names = inspect.signature(forward)

    def propose_spy(self, s, models, spec, k):
        bucket.update(batch_row=s.batch_row.clone(), keep=s.keep.clone(), length=s.length.clone(), k=k)
        return propose(self, s, models, spec, k)

    def forward_spy(self, *args, **kwargs):
        a = names.bind(self, *args, **kwargs).arguments
        first = self.reads_hidden and a.get("features") is not None and a["q"] == K + 1
        if first:
            reads["rounds"].append(dict(bucket, ids=a["input_ids"].clone(), pos=a["positions"].clone(),
                                        features=a["features"].clone(), rows=a["rows"].clone()))
        elif self.reads_hidden:  # a later draft step reads the head's own g of the step before
            reads["steps"].append(torch.equal(a["features"], bucket["g"]))
        out = forward(self, *args, **kwargs)
        if self.reads_hidden:
            bucket["g"] = (out[1][a["rows"]] if first else out[1]).clone()
        return out

    def prefill_spy(self, rows):
        started[:] = rows
        return read_prompts(self, rows)

    def packed_spy(model, input_ids, batch, *args, features=None, **kwargs):
        if features is not None:
            reads["prompts"].append(dict(rows=list(started), ids=input_ids.clone(), pos=batch.positions.clone(),
                                         slots=batch.slot_mapping.clone(), starts=batch.query_start_loc.tolist(),
                                         features=features.clone()))
        return packed(model, input_ids, batch, *args, features=features, **kwargs)

    monkeypatch.setattr(HeadProposer, "propose", propose_spy)
    monkeypatch.setattr(PagedModel, "forward", forward_spy)
    monkeypatch.setattr(SpecRunner, "prefill", prefill_spy)
    monkeypatch.setattr(prefill, "paged_forward", packed_spy)
    return reads


def real_lengths(sequences, mask, eos):
    """Each row's tokens from its first real one through its first EOS (or the end)."""
    pads = (mask == 0).sum(1)
    out = []
    for b, seq in enumerate(sequences):
        row = seq[pads[b]:]
        L = int(mask[b].sum())
        hits = (row[L:] == eos).nonzero() if eos is not None else []
        out.append(L + int(hits[0]) + 1 if len(hits) else len(row))
    return out


def check_head_reads(target, reads, sequences, mask, K, eos=None):
    """Every pair the head read holds the target's own last hidden state at its position p (a plain forward of the
    final sequence) and the sequence's token p+1: in the prefill each prompt position but the last (the last writes
    no K/V), then in each round's first step the pairs the last round committed (rows j <= each row's pick), right
    after what the head read before; so each row's reads cover all its positions, in order, none twice. Later
    draft steps read the head's own g."""
    pads, lens = (mask == 0).sum(1), mask.sum(1).tolist()
    ends = real_lengths(sequences, mask, eos)
    rows = [sequences[b, pads[b]: pads[b] + ends[b]] for b in range(len(sequences))]
    with torch.no_grad():
        hidden = [target.get_decoder()(input_ids=row[None]).last_hidden_state[0].float() for row in rows]
    seen = {b: [] for b in range(len(rows))}

    def check(b, p, token, feature):
        assert int(token) == int(rows[b][p + 1]), (b, p)
        torch.testing.assert_close(feature.float(), hidden[b][p], atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"row {b} position {p}: {m}")
        seen[b].append(p)

    for r in reads["prompts"]:
        for i, b in enumerate(r["rows"]):
            for t in range(r["starts"][i], r["starts"][i + 1]):
                p = int(r["pos"][t])
                if p == lens[b] - 1:
                    assert r["slots"][t] == -1  # the first round reads this pair
                else:
                    assert r["slots"][t] >= 0
                    check(b, p, r["ids"][t], r["features"][t])
    assert all(reads["steps"])
    width = K + 1
    for r in reads["rounds"]:
        B = r["keep"].shape[0]
        ids, pos, feats = r["ids"].view(B, width), r["pos"].view(B, width), r["features"].view(B, width, -1)
        pick = torch.arange(B) * width + (r["keep"] - 1).clamp(min=0)
        assert torch.equal(r["rows"], pick if r["k"] else pick[:0])  # logits of each row's last committed pair
        for i in range(B):
            keep, b = int(r["keep"][i]), int(r["batch_row"][i])
            for j in range(keep):  # keep = 0: a done or padding row, nothing committed
                assert int(pos[i, j]) == int(r["length"][i]) - keep - 1 + j
                check(b, int(pos[i, j]), ids[i, j], feats[i, j])
    for b, positions in seen.items():
        assert positions == list(range(len(positions))), b  # in order, no gap, none twice
        assert len(positions) >= ends[b] - K - 2, b  # all but the call's last round's


# -- 1. greedy output is the target's ---------------------------------------------------------------------------

CASES = [("llama", batch, k, adaptive) for batch, k, adaptive in itertools.product([1, 3, 8], [1, 3, 6], [False, None])]
CASES += [(family, batch, k, adaptive) for family in ("qwen2", "gpt2", "gemma3")
          for batch, k, adaptive in [(1, 3, False), (3, 6, None), (8, 3, False)]]


@pytest.mark.parametrize("family,batch,k,adaptive", CASES)
def test_greedy_with_a_random_head_equals_target_greedy(targets, family, batch, k, adaptive):
    target = targets[family]
    ids, mask = left_padded_prompts(batch, seed=batch * 10 + k)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head_for(target), do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(k, adaptive), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.fast_path == "bucketed"
    assert sum(m.k_histogram.values()) == m.num_rounds
    assert m.num_accepted_tokens <= m.num_draft_tokens <= m.num_drafts * k
    if adaptive is False:
        assert m.k_histogram == {k: m.num_rounds} and m.num_draft_tokens == m.num_drafts * k > 0


def test_greedy_with_a_two_layer_head(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=4)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head_for(target, num_layers=2),
                          do_sample=False, max_new_tokens=MAX_NEW, spec_config=spec(4))
    assert torch.equal(out, expected)


# -- 2. a perfect head accepts every draft ----------------------------------------------------------------------

@pytest.mark.parametrize("batch,k", [(1, 1), (3, 3), (8, 6)])
def test_perfect_head_accepts_every_draft(perfect, batch, k):
    target, head = perfect
    ids, mask = left_padded_prompts(batch, seed=50 + batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head, do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(k), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.num_drafts > 0 and m.acceptance_rate == 1.0 and m.mean_acceptance_length == k + 1


def test_perfect_head_accepts_every_draft_after_rounds_of_zero(perfect, monkeypatch):
    """Rounds of k = 0 commit one token without drafting; the head still reads it (no catch-up), so the next
    drafting round's drafts are all accepted."""
    target, head = perfect
    alternate_k(monkeypatch, 3)
    ids, mask = left_padded_prompts(3, seed=53)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head, do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(3, adaptive=True), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.k_histogram[0] >= 2 and m.k_histogram[3] >= 2
    assert m.acceptance_rate == 1.0


# -- 3. the features are the target's, at the right positions ---------------------------------------------------

@pytest.mark.parametrize("family,batch,k,adaptive,prefill_kind", [
    ("llama", 3, 3, False, "fixed"), ("llama", 4, 2, True, "fixed"), ("llama", 3, 3, True, "eager"),
    ("gemma3", 3, 3, True, "fixed")])
def test_head_reads_the_targets_features_at_the_right_positions(targets, monkeypatch, family, batch, k, adaptive,
                                                                  prefill_kind):
    """adaptive=True: rounds alternate k = 0 and k (``alternate_k``). eager: the unpadded prefill (tensor-parallel
    targets, long prompts) instead of the fixed-shape one."""
    target = targets[family]
    if adaptive:
        alternate_k(monkeypatch, k)
    if prefill_kind == "eager":
        monkeypatch.setattr(prefill, "PREFILL_MAX_TOKENS", 0)
    ids, mask = left_padded_prompts(batch, seed=60 + batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    reads = record_head_reads(monkeypatch, k)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head_for(target), do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(k, adaptive), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert len(reads["rounds"]) == out.spec_metrics.num_rounds  # every round reads, k = 0 ones too
    assert len(reads["steps"]) == (k - 1) * out.spec_metrics.k_histogram[k]
    if adaptive:
        assert out.spec_metrics.k_histogram.get(0, 0) >= 2
    check_head_reads(target, reads, out.sequences, mask, k)


# -- 5. rows in waves and shrinking buckets ---------------------------------------------------------------------

def two_rows_budget(mask, k):
    """cache_tokens that hold any two rows of this batch at once and never three."""
    needs = sorted(-(-(int(n) + MAX_NEW + k + 1) // BLOCK) for n in mask.sum(1))
    assert 3 * needs[0] > 2 * needs[-1]
    return 2 * needs[-1] * BLOCK


def eos_kw(target, ids, mask, row=3, step=4, **extra):
    """generate() arguments (and ``extra``) with an EOS id some rows hit early (row ``row``'s token ``step``)."""
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0, **extra)
    plain = target.generate(**kw, eos_token_id=None)
    return dict(kw, eos_token_id=int(plain[row, ids.shape[1] + step]))


@pytest.mark.parametrize("kind", ["random", "perfect"])
def test_rows_in_waves(targets, perfect, monkeypatch, kind):
    """A budget of two rows: rows start as others finish and the bucket is rebuilt with the survivors
    (``row_blocks.rejoin``): what the survivors' head reads next (features, keep) carries over."""
    from hf_specdec.call import waves
    target, head = perfect if kind == "perfect" else (targets["llama"], head_for(targets["llama"]))
    K = 3
    ids, mask = left_padded_prompts(8, seed=31)
    kw = eos_kw(target, ids, mask)
    expected = target.generate(**kw)
    survivors, rejoin = [], waves.rejoin
    monkeypatch.setattr(waves, "rejoin",
                        lambda runner, live, *a: (survivors.append(len(live)), rejoin(runner, live, *a)))
    reads = record_head_reads(monkeypatch, K)
    out = target.generate(**kw, assistant_model=head, spec_config=spec(K, cache_tokens=two_rows_budget(mask, K)),
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.num_drafts <= 2 * m.num_rounds  # at most two rows at a time
    assert any(survivors)  # rows joined a bucket with live rows in it
    check_head_reads(target, reads, out.sequences, mask, K, kw["eos_token_id"])
    if kind == "perfect":
        assert m.acceptance_rate == 1.0 and m.mean_acceptance_length == K + 1


@pytest.mark.parametrize("kind", ["random", "perfect"])
def test_rows_move_to_smaller_buckets(targets, perfect, monkeypatch, kind):
    """Nine rows (bucket 16), some ending early on EOS: the survivors move to smaller buckets (``load_rows``)."""
    target, head = perfect if kind == "perfect" else (targets["llama"], head_for(targets["llama"]))
    K = 3
    ids, mask = left_padded_prompts(9, seed=41)
    kw = eos_kw(target, ids, mask, row=0, step=2)
    expected = target.generate(**kw)
    reads = record_head_reads(monkeypatch, K)
    out = target.generate(**kw, assistant_model=head, spec_config=spec(K), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert len({int(r["keep"].shape[0]) for r in reads["rounds"]}) > 1  # rounds ran in buckets of several sizes
    runner = runner_for(target, head)
    assert 16 in runner.slot.states and runner.state.size < 16
    check_head_reads(target, reads, out.sequences, mask, K, kw["eos_token_id"])
    if kind == "perfect":
        assert out.spec_metrics.acceptance_rate == 1.0


# -- 6. output_scores / output_logits and EOS inside an accepted run --------------------------------------------

@pytest.mark.parametrize("kind", ["random", "perfect"])
def test_scores_logits_and_eos_match_plain_generate(targets, perfect, kind):
    """EOS at row 0's 5th token, inside a run of 7 (k = 6) a perfect head has all accepted; repetition_penalty
    processes the head's drafts and the target's scores alike."""
    target, head = perfect if kind == "perfect" else (targets["llama"], head_for(targets["llama"]))
    ids, mask = left_padded_prompts(3, seed=5)
    kw = eos_kw(target, ids, mask, row=0, step=4, repetition_penalty=1.3)
    kw.update(output_scores=True, output_logits=True, return_dict_in_generate=True)
    expected = target.generate(**kw)
    out = target.generate(**kw, assistant_model=head, spec_config=spec(6))
    assert out.spec_metrics.fast_path == "bucketed"
    assert torch.equal(out.sequences, expected.sequences)
    assert (out.sequences[0, ids.shape[1] + 5:] == 0).all()  # padded after EOS
    assert len(out.scores) == len(expected.scores) and len(out.logits) == len(expected.logits)
    for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    if kind == "perfect":
        assert out.spec_metrics.acceptance_rate == 1.0
