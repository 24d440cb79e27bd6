"""A model changed between calls (``model.double()``, ``load_state_dict(assign=True)``, a module replaced): the next
call runs on what the model is now, as a fresh process would. Graphs, prefill graphs and the paged caches hold the
weights' addresses, dtype and device of the call that made them, and a compiled copy holds the modules of its moment;
the runner keys them on the models' modules and tensors. CPU: the runner without graphs (the caches are what carries
over there), the fused projections and the compile job by themselves."""
import copy

import torch

import hf_specdec
from cache_models import build_model
from hf_specdec.runner import runner_for
from hf_specdec.runner.background_compile import compile_job
from hf_specdec.runner.fused_projections import shared_projections
from models import left_padded_prompts, make_draft, make_model

IDS = torch.tensor([[5, 9, 17, 33, 2, 40, 11]])


def _logits(target, draft):
    ids, mask = left_padded_prompts(3, seed=1)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=8,
                          do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False))
    return out.sequences, torch.stack(out.logits)


def test_a_new_dtype_runs_as_a_fresh_process_would():
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    fresh_target, fresh_draft = copy.deepcopy(target).double(), copy.deepcopy(draft).double()
    _logits(target, draft)  # float32 caches
    target.double()
    draft.double()
    sequences, logits = _logits(target, draft)
    want_sequences, want_logits = _logits(fresh_target, fresh_draft)
    assert torch.equal(sequences, want_sequences)
    assert torch.equal(logits, want_logits), (logits - want_logits).abs().max()
    caches = runner_for(target, draft).caches.values()
    assert all(pool.dtype == torch.float64 for cache in caches for pool in cache.key_pools.values())


def test_new_weights_by_assignment_are_read():
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    other = make_model("llama", seed=5)
    _logits(target, draft)
    target.load_state_dict(other.state_dict(), assign=True)  # new tensors, new addresses
    got = _logits(target, draft)
    fresh = hf_specdec.enable(copy.deepcopy(target))
    want = _logits(fresh, copy.deepcopy(draft))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@torch.no_grad()
def test_a_replaced_projection_is_fused_again():
    """An adapter layer (here a new nn.Linear) in place of a fused k_proj: the compiled copy reads it, not the old."""
    model = build_model("llama_gqa")
    shared = shared_projections(model)
    attn = model.model.layers[0].self_attn
    new = torch.nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=False)
    attn.k_proj = new
    again = shared_projections(model)
    assert again is not shared
    torch.testing.assert_close(again.module_copy(model)(IDS).logits, model(IDS).logits, rtol=1e-5, atol=1e-5)
    assert new.weight.untyped_storage().data_ptr() == attn.q_proj.weight.untyped_storage().data_ptr()
    assert shared_projections(model) is again


def test_a_model_with_a_replaced_module_gets_a_new_compile_job():
    model = build_model("llama_gqa")
    job = compile_job(model, 96, 4, 16)
    assert compile_job(model, 96, 4, 16) is job
    model.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    again = compile_job(model, 96, 4, 16)
    assert again is not job and again.model is model
    assert compile_job(model, 96, 4, 16) is again


def test_the_signatures_see_every_kind_of_change_and_nothing_else():
    """The runner's key (``models_signature``) and a compile job's (``module_signature``) are computed each call by
    one pass over the modules' own dicts: each change that graphs or a compiled copy would miss alters them, whether
    made through ``setattr`` or straight into a module's dicts (as accelerate's ``set_module_tensor_to_device``
    does); an unchanged model keeps them."""
    from hf_specdec.runner.runner_slots import models_signature, module_signature

    model = make_model("llama", seed=0)
    draft = make_draft(model, "mix")
    before = models_signature([model, draft]), module_signature(model)
    assert before == (models_signature([model, draft]), module_signature(model))
    layer = model.model.layers[0]
    proj = layer.mlp.down_proj
    changes = {
        "activation replaced (no tensor)": lambda: setattr(layer.mlp, "act_fn", torch.nn.GELU()),
        "parameter written into the dict": lambda: proj._parameters.__setitem__(
            "weight", torch.nn.Parameter(proj.weight.detach().clone())),
        "new storage in place": lambda: setattr(proj.weight, "data", proj.weight.detach().clone()),
        "new dtype": lambda: proj.double(),
        "a layer deleted": lambda: model.model.layers.__delitem__(1),
    }
    modules_change = {"activation replaced (no tensor)", "a layer deleted"}
    for name, change in changes.items():
        m0, s0 = models_signature([model, draft]), module_signature(model)
        change()
        assert models_signature([model, draft]) != m0, name
        assert (module_signature(model) != s0) == (name in modules_change), name
    assert models_signature([draft]) == models_signature([draft])
