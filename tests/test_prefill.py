"""Fixed-shape prefill (``runner/prefill.py``): bucketed token counts, padding tokens that touch no row.

On CPU the fixed-shape forward runs eagerly (what CUDA graphs capture on a GPU), so these tests check
the packing itself: its logits equal the unpadded ragged prefill's, and generation stays exact.
"""
import pytest
import torch

import hf_specdec
import hf_specdec.runner.prefill as prefill
from hf_specdec.runner import runner_for
from hf_specdec.runner.spec_runner import SpecRunner
from models import left_padded_prompts, make_draft, make_model


def test_token_bucket_ladder():
    values = [prefill.token_bucket(n) for n in range(1, 5000)]
    for n, b in enumerate(values, start=1):
        assert b >= n and b >= 16
        assert n <= 16 or b <= 1.25 * n  # at most a quarter of a prefill is padding
    assert values == sorted(values)
    assert len({prefill.token_bucket(n) for n in range(50, 401)}) <= 13  # few shapes to capture


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=5))


def _recorded_prefills(monkeypatch, target, draft, ids, mask, max_tokens):
    """Greedy spec output and the target logits every prefill of the call returned."""
    monkeypatch.setattr(prefill, "PREFILL_MAX_TOKENS", max_tokens)
    seen, original = [], SpecRunner.prefill

    def recording(self, rows):
        out = original(self, rows)
        seen.append(out.clone())
        return out

    monkeypatch.setattr(SpecRunner, "prefill", recording)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                          assistant_model=draft, pad_token_id=0, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(block_size=4, num_speculative_tokens=3,
                                                            adaptive=False))
    monkeypatch.undo()
    return out, seen


@pytest.mark.parametrize("batch", [1, 3, 6])
def test_fixed_prefill_equals_the_ragged_prefill(monkeypatch, target, batch):
    """Rows of different lengths packed with padding tokens (and padding rows: 3 -> bucket 4, 6 -> 8) give
    the logits of the unpadded prefill, and the call's output is plain greedy generate's; the draft model
    read the same prompts too (its acceptance, which greedy output does not show, is the same). The unpadded
    prefill attends through the model's own attention (prompt spans, ``PagedBatch.fresh``), the packed one of
    several rows through the paged kernel: the two agree."""
    ids, mask = left_padded_prompts(batch, seed=60 + batch, min_len=3, max_len=23)
    draft = make_draft(target, "mix")
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                               pad_token_id=0)
    fixed, fixed_logits = _recorded_prefills(monkeypatch, target, draft, ids, mask, prefill.PREFILL_MAX_TOKENS)
    runner = runner_for(target, draft)
    lens = mask.sum(1).tolist()
    shapes = [key[2] for key in runner.prefills.models if key[0] == "target"]
    assert shapes == [prefill.token_bucket(sum(lens))] and shapes[0] > sum(lens)  # padding tokens packed
    ragged, ragged_logits = _recorded_prefills(monkeypatch, target, draft, ids, mask, 0)  # 0: never fits
    assert torch.equal(fixed.sequences, expected) and torch.equal(ragged.sequences, expected)
    assert len(fixed_logits) == len(ragged_logits) == 1
    torch.testing.assert_close(fixed_logits[0], ragged_logits[0], rtol=1e-5, atol=1e-5)
    f, r = fixed.spec_metrics, ragged.spec_metrics
    assert f.num_drafts > 0 and (f.num_accepted_tokens, f.accepted_per_position) == (
        r.num_accepted_tokens, r.accepted_per_position)


def test_rows_starting_in_waves_use_their_own_shapes(target):
    """A cache budget of two rows: rows start in several prefills of different shapes, output still exact."""
    ids, mask = left_padded_prompts(5, seed=77, min_len=4, max_len=19)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    expected = target.generate(**kw)
    width = ids.shape[1] + 10 + 2 + 1
    draft = make_draft(target, "full")
    out = target.generate(**kw, assistant_model=draft, spec_config=hf_specdec.SpecConfig(
        block_size=4, num_speculative_tokens=2, cache_tokens=2 * width))
    assert torch.equal(out, expected)
    shapes = {key[1:3] for key in runner_for(target, draft).prefills.models}
    assert len(shapes) >= 2  # (rows, tokens) of the first wave and of later ones


def test_prompt_attention_ignores_garbage_in_padding_tokens(target):
    """A fixed-shape prefill's padding tokens follow the real ones; whatever they hold (NaN from uninitialised
    memory) must not reach a real token through the model's own attention over the padded span."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from hf_specdec.cache.attention import _prompt_attention

    module = target.model.layers[0].self_attn
    H, KVH, D, n, T = 4, 2, 8, 11, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, T, D, generator=g) for h in (H, KVH, KVH))
    for t in (q, k, v):
        t[:, :, n:] = float("nan")
    real = torch.arange(T) < n
    out = _prompt_attention(module, q, k, v, D ** -0.5, ((0, T),), real)
    want, _ = sdpa_attention_forward(module, q[:, :, :n], k[:, :, :n], v[:, :, :n], None, scaling=D ** -0.5)
    assert torch.isfinite(out[:, :n]).all()
    torch.testing.assert_close(out[:, :n], want)


class _OrderStreamer:
    """Records, in one list with the draft's forwards, when each token reaches the streamer."""

    def __init__(self, events):
        self.events = events

    def put(self, value):
        self.events.append(("put", value.numel()))

    def end(self):
        self.events.append(("end", 0))


def _draft_spy(monkeypatch, draft, events):
    original = type(draft).forward

    def spy(self, *args, **kwargs):
        if self.lm_head is draft.lm_head:  # the draft, or the runner's shallow copy of it (runner/paged_model.py)
            events.append(("draft", 0))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(draft), "forward", spy)


def test_first_token_reaches_the_streamer_before_the_draft_reads_the_prompt(monkeypatch, target):
    """The draft model reads a prompt after the row's first token is out: a streamer's time to first token is the
    target's prefill alone. Output unchanged."""
    draft, events = make_draft(target, "mix"), []
    ids = torch.tensor([[3, 9, 4, 17, 5, 8, 2, 11]])
    expected = target.generate(input_ids=ids, do_sample=False, max_new_tokens=8, pad_token_id=0)
    _draft_spy(monkeypatch, draft, events)
    got = target.generate(input_ids=ids, do_sample=False, max_new_tokens=8, pad_token_id=0, assistant_model=draft,
                          streamer=_OrderStreamer(events),
                          spec_config=hf_specdec.SpecConfig(block_size=4, num_speculative_tokens=3, adaptive=False))
    assert torch.equal(got, expected)
    kinds = [e[0] for e in events]
    assert kinds[:2] == ["put", "put"], events  # the prompt, then the first token
    assert "draft" in kinds and kinds.index("draft") > 1, events


@pytest.mark.parametrize("batch", [1, 3])
def test_rows_done_at_their_first_token_cost_the_draft_nothing(monkeypatch, target, batch):
    """max_new_tokens=1: every row ends with the target's prefill; the draft model never runs."""
    draft, events = make_draft(target, "mix"), []
    ids, mask = left_padded_prompts(batch, seed=batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=1, pad_token_id=0)
    _draft_spy(monkeypatch, draft, events)
    got = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=1, pad_token_id=0,
                          assistant_model=draft, spec_config=hf_specdec.SpecConfig(block_size=4))
    assert torch.equal(got, expected)
    assert events == []


def test_the_draft_reads_the_prompts_in_the_targets_shapes(monkeypatch, target):
    """The draft's later prefill reads each row's prompt alone (not the first token too): the target's lengths,
    so its fixed shapes are the target's (no extra graphs on a GPU)."""
    seen, original = [], prefill.FixedPrefill.run

    def recording(self, models, batch, rows, lens, width, graphs, skip=()):
        seen.append((skip, list(rows), list(lens)))
        return original(self, models, batch, rows, lens, width, graphs, skip)

    monkeypatch.setattr(prefill.FixedPrefill, "run", recording)
    ids, mask = left_padded_prompts(3, seed=7)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    got = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0,
                          assistant_model=make_draft(target, "full"),
                          spec_config=hf_specdec.SpecConfig(block_size=4, num_speculative_tokens=3, adaptive=False))
    assert torch.equal(got, expected)
    assert [s for s, _, _ in seen] == [("draft",), ("target",)], seen
    assert seen[0][1:] == seen[1][1:] == (list(range(3)), mask.sum(1).tolist())
