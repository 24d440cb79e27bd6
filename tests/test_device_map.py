"""Models that accelerate dispatched with a ``device_map`` (CPU: no second device exists here).

* A target split by accelerate's hooks, its embedding and final norm offloaded to disk (weights on
  "meta", run on the CPU by hooks): inputs and ``logits_to_keep`` go to the hooks' execution
  device, and speculative output equals plain generate (greedy) and the undispatched model's
  output with the same generator (sampling), on both paths.
* Where the last hidden states live is the final norm's device, not the embedding's
  (the bug of a target split over two GPUs); found from accelerate's hooks.
* accelerate's hook on the whole model would send ``logits_to_keep`` to the first device (the
  error of the two-GPU split): it passes the hook untouched during a paged forward, and the hook's
  ``skip_keys`` are as before afterwards.
* Paged-attention metadata is copied once per device and forward.
* A model spread over devices other than the inputs' is refused CUDA graphs, with the reason.

The real two-GPU split runs in benchmarks/multi_gpu_smoke.py.
"""
import copy

import pytest
import torch
from accelerate import dispatch_model
from accelerate.hooks import AlignDevicesHook, add_hook_to_module

import hf_specdec
from hf_specdec.cache import PagedKVCache, hidden_states_device, input_device, model_devices
from hf_specdec.call.path_choice import spread_over_devices
from models import left_padded_prompts, make_draft, make_model

OFFLOADED = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "disk",
             "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = make_model("llama", 0)
    draft = make_draft(target, "mix")
    reference = hf_specdec.enable(copy.deepcopy(target))
    split = dispatch_model(target, device_map=OFFLOADED, offload_dir=str(tmp_path_factory.mktemp("offload")))
    return hf_specdec.enable(split), draft, reference


def _generate(target, draft, ids, mask, **kw):
    return target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, eos_token_id=None, pad_token_id=0,
                           assistant_model=draft, return_dict_in_generate=True,
                           spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3,
                                                             generator=kw.pop("generator", None)), **kw)


def test_offloaded_target_runs_on_hook_devices(models):
    split, _, _ = models
    assert split.model.embed_tokens.weight.device.type == "meta" and split.model.norm.weight.device.type == "meta"
    assert input_device(split) == torch.device("cpu") and hidden_states_device(split) == torch.device("cpu")
    assert model_devices(split) == {torch.device("cpu")}


def test_logits_to_keep_passes_the_top_hook_untouched(models, monkeypatch):
    split, draft, _ = models
    top = [h for h in getattr(split._hf_hook, "hooks", [split._hf_hook]) if isinstance(h, AlignDevicesHook)][0]
    before, seen = top.skip_keys, []
    original = top.pre_forward

    def spy(module, *args, **kwargs):
        seen.append((list(top.skip_keys or []), kwargs.get("logits_to_keep")))
        return original(module, *args, **kwargs)

    monkeypatch.setattr(top, "pre_forward", spy)
    ids, mask = left_padded_prompts(2, seed=5)
    _generate(split, draft, ids, mask, do_sample=False)
    paged = [keys for keys, keep in seen if isinstance(keep, torch.Tensor)]
    assert paged and all("logits_to_keep" in keys for keys in paged)
    assert top.skip_keys == before


@pytest.mark.parametrize("batch", [1, 4])
def test_split_target_greedy_equals_plain(models, batch):
    split, draft, reference = models
    ids, mask = left_padded_prompts(batch, seed=batch)
    plain = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    out = _generate(split, draft, ids, mask, do_sample=False)
    assert torch.equal(out.sequences, plain)
    assert out.spec_metrics.num_rounds > 0


def test_split_target_samples_as_the_undispatched_model(models):
    split, draft, reference = models
    ids, mask = left_padded_prompts(4, seed=5)
    outs = [_generate(m, draft, ids, mask, do_sample=True, top_k=0,
                      generator=torch.Generator().manual_seed(3)).sequences for m in (split, reference)]
    assert torch.equal(outs[0], outs[1])
    assert len({tuple(r) for r in outs[0][:, ids.shape[1]:].tolist()}) == 4


def _split_over_cpu_and_meta():
    """A model whose hooks say: embedding and layers on the CPU, final norm and head on 'meta'."""
    model = make_model("llama", 1)
    add_hook_to_module(model.model.norm, AlignDevicesHook(execution_device="meta"))
    model.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "meta",
                           "lm_head": "meta"}
    return model


def test_last_hidden_states_device_is_the_final_norms():
    model = _split_over_cpu_and_meta()
    assert input_device(model) == torch.device("cpu")
    assert hidden_states_device(model) == torch.device("meta")
    assert model_devices(model) == {torch.device("cpu"), torch.device("meta")}


def test_spread_models_get_no_cuda_graphs():
    model = _split_over_cpu_and_meta()
    reason = spread_over_devices((model, None), torch.device("cpu"))
    assert reason == "CUDA graphs capture one GPU; the target runs on cpu, meta, the inputs on cpu"
    draft = make_model("llama", 2)
    assert spread_over_devices((draft, None), torch.device("cpu")) is None
    assert "the draft runs on cpu, the inputs on meta" in spread_over_devices((None, draft), torch.device("meta"))


def test_metadata_copied_once_per_device():
    cache = PagedKVCache(4, 4, 2, 16, "cpu")
    cache.add_sequences(2)
    cache.reserve([0, 1], [5, 3])
    batch = cache.batch(torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([5, 3]), 5, 8)
    assert batch.on(torch.device("cpu")) is batch
    moved = batch.on(torch.device("meta"))
    assert moved is batch.on(torch.device("meta"))
    assert {t.device.type for t in (moved.block_tables, moved.seq_lens, moved.query_start_loc, moved.slot_mapping,
                                    moved.positions)} == {"meta"}
    assert moved.max_query_len == 5 and moved.cache is cache
