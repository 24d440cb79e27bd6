"""Graph-safe logits processors equal Hugging Face's own, row by row, on a fixed-width history.

Each round has 3 buffer rows (pad-token prefixes of different widths, as left padding leaves them)
and 4 score rows per buffer row at consecutive lengths, one buffer row running to the full width;
columns past a buffer row's longest history hold wild garbage (negative and huge ids) in the
buffer the pipeline sees. Histories draw from a 6-token alphabet so that n-grams, bad words and
repeated tokens actually occur. Hugging Face gets row ``i`` as ``history[rows[i], :lengths[i]]``
with that garbage cleaned (its gather would fail on it; it never reads it anyway).
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from hf_specdec.round.logits.graph_logits import graph_safe_logits

V, W, PROMPT, PAD, ALPHABET = 64, 32, 8, 7, 6
STARTS = (1, 9, W - 3)  # first length of each buffer row; 4 consecutive lengths each
PADS = (0, 3, 5)


def make_round(seed: int):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, ALPHABET, (len(STARTS), W), generator=g)
    for b, pads in enumerate(PADS):
        clean[b, :pads] = PAD
    rows = torch.tensor([b for b in range(len(STARTS)) for _ in range(4)])
    lengths = torch.tensor([s + j for s in STARTS for j in range(4)])
    history = clean.clone()
    for b, s in enumerate(STARTS):
        junk = torch.randint(-(10**6), 10**9, (W - (s + 3),), generator=g)
        history[b, s + 3:] = junk
        clean[b, s + 3:] = torch.randint(0, ALPHABET, (W - (s + 3),), generator=g)
    scores = torch.randn(len(rows), V, generator=g) * 3
    return scores, history, clean, rows, lengths


def hf_reference(processors, scores, clean, rows, lengths, batch_layout=False):
    """Row by row, as plain generate calls the list; with ``batch_layout`` the row sits in its own place of
    the whole batch (processors with per-batch-row state)."""
    out = torch.empty_like(scores)
    for i, (b, n) in enumerate(zip(rows.tolist(), lengths.tolist())):
        if batch_layout:
            full = torch.zeros(clean.shape[0], V)
            full[b] = scores[i]
            out[i] = processors(clean[:, :n].clone(), full)[b]
        else:
            out[i] = processors(clean[b:b + 1, :n].clone(), scores[i:i + 1].clone())[0]
    return out


def assert_same(got, want):
    for special in (torch.isneginf, torch.isposinf, torch.isnan):
        assert torch.equal(special(got), special(want)), special.__name__
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-6, atol=1e-6)


def pipeline_for(processors):
    pipeline, reason = graph_safe_logits(processors)
    assert reason is None and pipeline is not None, reason
    return pipeline


def check(processors, seeds=(0, 1), batch_layout=False, inject=None):
    processors = LogitsProcessorList(processors)
    pipeline = pipeline_for(processors)
    for seed in seeds:
        scores, history, clean, rows, lengths = make_round(seed)
        if inject is not None:
            inject(scores)
        want = hf_reference(processors, scores, clean, rows, lengths, batch_layout)
        assert_same(pipeline(scores.clone(), history, rows, lengths), want)
    return pipeline


def pad_lengths():
    """Each row's padding length, as transformers >= 5.23 passes it; None where the installed version
    accepts only an int (5.17)."""
    try:
        RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=torch.tensor(PADS))
    except ValueError:
        return None
    return torch.tensor(PADS)


SINGLE = {
    "temperature": lambda: TemperatureLogitsWarper(0.7),
    "top_k": lambda: TopKLogitsWarper(5),
    "top_k_keep": lambda: TopKLogitsWarper(3, filter_value=-100.0, min_tokens_to_keep=6),
    "top_p": lambda: TopPLogitsWarper(0.8),
    "top_p_keep": lambda: TopPLogitsWarper(0.3, filter_value=-50.0, min_tokens_to_keep=3),
    "min_p": lambda: MinPLogitsWarper(0.1),
    "min_p_keep": lambda: MinPLogitsWarper(0.5, min_tokens_to_keep=4),
    "typical": lambda: TypicalLogitsWarper(0.9),
    "typical_keep": lambda: TypicalLogitsWarper(0.5, filter_value=-9.0, min_tokens_to_keep=3),
    "epsilon": lambda: EpsilonLogitsWarper(0.02),
    "epsilon_keep": lambda: EpsilonLogitsWarper(0.05, min_tokens_to_keep=5),
    "eta": lambda: EtaLogitsWarper(0.02),
    "eta_keep": lambda: EtaLogitsWarper(0.3, filter_value=-7.0, min_tokens_to_keep=2),
    "logit_normalization": lambda: LogitNormalization(),
    "repetition": lambda: RepetitionPenaltyLogitsProcessor(1.3),
    "repetition_reward": lambda: RepetitionPenaltyLogitsProcessor(0.7),
    "repetition_ignore_int": lambda: RepetitionPenaltyLogitsProcessor(1.2, prompt_ignore_length=5),
    "min_length": lambda: MinLengthLogitsProcessor(11, eos_token_id=[1, 3]),
    "min_new_tokens": lambda: MinNewTokensLengthLogitsProcessor(PROMPT, 3, eos_token_id=2),
    "suppress": lambda: SuppressTokensLogitsProcessor([1, 4, 60]),
    "suppress_at_begin": lambda: SuppressTokensAtBeginLogitsProcessor([2, 5], begin_index=10),
    "no_repeat_1gram": lambda: NoRepeatNGramLogitsProcessor(1),
    "no_repeat_2gram": lambda: NoRepeatNGramLogitsProcessor(2),
    "no_repeat_3gram": lambda: NoRepeatNGramLogitsProcessor(3),
    "bad_words_single": lambda: NoBadWordsLogitsProcessor([[4], [9], [2]], eos_token_id=2),
    "bad_words_multi": lambda: NoBadWordsLogitsProcessor([[1, 2], [3, 1, 2], [5], [0, 4, 4, 1]]),
    "sequence_bias_single": lambda: SequenceBiasLogitsProcessor({(1,): 2.5, (3,): -1.5}),
    "sequence_bias_multi": lambda: SequenceBiasLogitsProcessor(
        {(1,): 2.5, (2, 3): -1.5, (0, 1, 2): 4.0, (5, 3): 0.5, (4, 4, 4, 4): -3.0}
    ),
    "forced_bos": lambda: ForcedBOSTokenLogitsProcessor(7),
    "forced_eos": lambda: ForcedEOSTokenLogitsProcessor(11, eos_token_id=[2, 6]),
}


@pytest.mark.parametrize("name", list(SINGLE))
def test_single_processor_matches_hf(name):
    check([SINGLE[name]()])


def test_repetition_penalty_per_row_ignore_length():
    """transformers >= 5.23 passes each row's padding length; that state is per batch row."""
    if pad_lengths() is None:
        pytest.skip("this transformers accepts only an int prompt_ignore_length")
    check([RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=pad_lengths())], batch_layout=True)


def test_per_batch_row_state_in_a_compacted_bucket():
    """A runner's bucket may hold the batch's survivors in other rows, plus padding rows: per-row state is
    looked up through ``batch_rows``, never through the buffer row."""
    if pad_lengths() is None:
        pytest.skip("this transformers accepts only an int prompt_ignore_length")
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=pad_lengths()),
                                      NoRepeatNGramLogitsProcessor(2), TemperatureLogitsWarper(0.7)])
    pipeline = pipeline_for(processors)
    assert pipeline.needs_batch_rows
    assert not pipeline_for(LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])).needs_batch_rows
    scores, history, clean, rows, lengths = make_round(6)
    survivors = torch.tensor([2, 1])  # bucket rows 0, 1 hold batch rows 2, 1; bucket row 2 is padding
    bucket = torch.cat([history[survivors], torch.full((1, W), -3)])
    real = rows != 0
    bucket_rows = torch.where(real, (rows[:, None] == survivors).int().argmax(1), 2)
    batch_rows = torch.where(real, rows, 0)
    got = pipeline(scores.clone(), bucket, bucket_rows, torch.where(real, lengths, 2), batch_rows)
    want = hf_reference(processors, scores, clean, rows, lengths, batch_layout=True)
    assert_same(got[real], want[real])


def test_inf_nan_remove():
    def inject(scores):
        scores[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
        scores[5, 10] = float("nan")
    check([InfNanRemoveLogitsProcessor()], inject=inject)


def test_sequences_longer_than_the_row():
    """Row 0 (lengths 3, 4) ends with the prefix or holds exactly it: 5.17 skips the entry at length 3 (entry
    longer than the row), later versions apply it. Row 1 (length 2) would match if the columns before the
    row's start, clamped to column 0, were read."""
    processors = LogitsProcessorList([SequenceBiasLogitsProcessor({(0, 0, 1, 9): 3.0})])
    history = torch.tensor([[0, 0, 1, 99, 99], [0, 1, 99, 99, 99]])
    rows, lengths = torch.tensor([0, 0, 1]), torch.tensor([3, 4, 2])
    scores = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    want = hf_reference(processors, scores, history.clamp(max=5), rows, lengths)
    assert_same(pipeline_for(processors)(scores.clone(), history, rows, lengths), want)


COMBOS = {
    "sampling": lambda: [
        RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=pad_lengths()),
        TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.9),
    ],
    "lengths_and_ngrams": lambda: [
        MinNewTokensLengthLogitsProcessor(PROMPT, 3, eos_token_id=[2, 5]), NoRepeatNGramLogitsProcessor(2),
    ],
    "everything": lambda: [
        NoBadWordsLogitsProcessor([[1, 2], [4]], eos_token_id=2),
        SequenceBiasLogitsProcessor({(3,): 1.5, (0, 5): -2.0}),
        RepetitionPenaltyLogitsProcessor(1.2, prompt_ignore_length=4), NoRepeatNGramLogitsProcessor(3),
        MinLengthLogitsProcessor(10, eos_token_id=2), SuppressTokensLogitsProcessor([40]),
        SuppressTokensAtBeginLogitsProcessor([6], begin_index=11), ForcedEOSTokenLogitsProcessor(12, 2),
        TemperatureLogitsWarper(0.8), TopKLogitsWarper(20), MinPLogitsWarper(0.05), TypicalLogitsWarper(0.95),
        EpsilonLogitsWarper(1e-4), EtaLogitsWarper(1e-3), InfNanRemoveLogitsProcessor(), LogitNormalization(),
    ],
}


@pytest.mark.parametrize("name", list(COMBOS))
def test_combination_matches_hf(name):
    check(COMBOS[name](), batch_layout=True)


SYNCING_OPS = {"aten.nonzero", "aten._local_scalar_dense", "aten.masked_select", "aten.is_nonzero", "aten.equal",
               "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.repeat_interleave"}


def host_syncing_ops(fn, *args) -> list[str]:
    """ATen ops of one traced call that read a device value on the host, size a result by one, or copy host
    data in. Dynamo keeps ``x[mask] = v`` in its graph, but on CUDA that boolean index runs nonzero."""
    graph = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args).graph
    found = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = str(node.target).rsplit(".", 1)[0]
        indices = node.args[1] if name in ("aten.index", "aten.index_put", "aten.index_put_") else ()
        bool_index = any(isinstance(i, torch.fx.Node) and i.meta["val"].dtype == torch.bool for i in indices)
        # Host data turned into a tensor during the call (0-d ones are scalars such as HF's `x[..., -k:] = 0`).
        host_copy = name == "aten.lift_fresh_copy" and node.meta["val"].dim() > 0
        if name in SYNCING_OPS or bool_index or host_copy:
            found.append(str(node.target))
    return found


@pytest.mark.parametrize("name", list(COMBOS) + ["forced_bos", "eta", "bad_words_multi", "no_repeat_1gram"])
def test_graph_safe(name):
    """fullgraph=True fails on any .item(), host read or value-dependent shape; the ATen trace catches what
    dynamo lets through."""
    processors = LogitsProcessorList(COMBOS[name]() if name in COMBOS else [SINGLE[name]()])
    pipeline = pipeline_for(processors)
    scores, history, _, rows, lengths = make_round(4)
    want = pipeline(scores.clone(), history, rows, lengths)  # eager warm-up builds the constants, as before capture
    torch._dynamo.reset()
    compiled = torch.compile(pipeline.__call__, fullgraph=True, backend="eager", dynamic=False)
    assert_same(compiled(scores.clone(), history, rows, lengths), want)
    assert host_syncing_ops(lambda *a: pipeline(*a), scores.clone(), history, rows, lengths) == []


def test_empty_list_is_identity():
    scores, history, _, rows, lengths = make_round(5)
    for processors in (None, LogitsProcessorList()):
        pipeline = pipeline_for(processors)
        assert pipeline.signature == ()
        assert torch.equal(pipeline(scores.clone(), history, rows, lengths), scores)


def test_refuses_unknown_processors_by_name():
    class ShoutingProcessor(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores * 2

    class MyTopK(TopKLogitsWarper):
        pass

    for odd in (ShoutingProcessor(), MyTopK(5)):
        pipeline, reason = graph_safe_logits(LogitsProcessorList([TemperatureLogitsWarper(0.7), odd]))
        assert pipeline is None and type(odd).__name__ in reason

    pipeline, reason = graph_safe_logits(LogitsProcessorList([ForcedEOSTokenLogitsProcessor(None, 2)]))
    assert pipeline is None and "ForcedEOSTokenLogitsProcessor" in reason


def test_signature():
    def build(temperature, bad_words=((1, 2),)):
        return graph_safe_logits(LogitsProcessorList([
            RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=pad_lengths()),
            NoBadWordsLogitsProcessor([list(w) for w in bad_words]),
            TemperatureLogitsWarper(temperature), TopPLogitsWarper(0.9),
        ]))[0].signature

    assert build(0.7) == build(0.7) and hash(build(0.7)) == hash(build(0.7))
    assert build(0.7) != build(0.8)
    assert build(0.7) != build(0.7, bad_words=((1, 3),))
    filters = [pipeline_for(LogitsProcessorList([TopKLogitsWarper(5, filter_value=v)])).signature
               for v in (float("-inf"), -1.0)]
    assert filters[0] != filters[1]
    order = [pipeline_for(LogitsProcessorList(p)).signature
             for p in ([TopKLogitsWarper(5), TopPLogitsWarper(0.9)], [TopPLogitsWarper(0.9), TopKLogitsWarper(5)])]
    assert order[0] != order[1]
