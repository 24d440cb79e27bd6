"""Fused q/k/v and gate/up projections (runner/fused_projections.py).

The user's parameters become views of one fused tensor per group (same values, no extra memory, the same
modules); the runner's compiled copy computes each group as one matmul (the CSE pass keeps one of the three
identical ones). Checked: values, memory, the user's modules, save/load, the matmul count in the compiled
graphs and in Inductor's code, and the repair after a parameter got new storage.
"""
import gc
import re
import shutil
import weakref

import pytest
import safetensors.torch
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.utils import run_and_get_code

from cache_models import build_model
from compile_recorder import fresh_dynamo  # noqa: F401  (an autouse fixture)
from hf_specdec.runner.compiled_regions import compile_model
from hf_specdec.runner import fused_projections
from hf_specdec.runner.fused_projections import FusedSliceLinear, shared_projections
from hf_specdec.runner.inductor_passes import SharedMatmulCSE

IDS = torch.tensor([[5, 9, 17, 33, 2, 40, 11]])


def _storage_bytes(model) -> int:
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


@pytest.mark.parametrize("family", ["llama_gqa", "qwen2", "mistral", "gemma2_softcap_sliding"])
@torch.no_grad()
def test_shared_storage_keeps_values_modules_and_memory(family):
    model = build_model(family)
    want = model(IDS).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _storage_bytes(model)
    shared = shared_projections(model)
    assert len(shared.groups) == 2 * model.config.num_hidden_layers
    attn = model.model.layers[0].self_attn
    assert type(attn.q_proj) is torch.nn.Linear and "fused_weight" not in dict(attn.q_proj.named_buffers())
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr()
    assert _storage_bytes(model) == before, "the fused tensors are a second copy of the weights"
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(IDS).logits, want, rtol=0, atol=0)
    fused = shared.module_copy(model)
    assert type(fused.model.layers[0].self_attn.q_proj) is FusedSliceLinear
    assert fused.model.embed_tokens is model.model.embed_tokens
    torch.testing.assert_close(fused(IDS).logits, want, rtol=1e-5, atol=1e-5)
    assert shared_projections(model) is shared
    alive = weakref.ref(model)
    del model, fused, shared
    gc.collect()
    assert alive() is None, "the model is kept alive by its shared projections"


def test_unfusable_groups_are_left_alone():
    model = build_model("gpt2")  # c_attn is already one projection
    assert not shared_projections(model).groups
    model = build_model("llama_gqa")
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda *a: None)
    names = {names for _, names in shared_projections(model).groups}
    assert len(shared_projections(model).groups) == 2 * model.config.num_hidden_layers - 1
    assert names == {("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")}


class _MatmulCounter:
    """An aot backend that applies the CSE pass (or not) and counts the matmuls left in each graph."""

    def __init__(self, cse: bool):
        self.cse, self.matmuls, self.graphs = cse, [], []

    def compiler(self, gm, example_inputs):
        if self.cse:
            SharedMatmulCSE()(gm.graph)
            gm.recompile()
        packets = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.hf_specdec.decode_linear}
        self.matmuls.append(sum(getattr(n.target, "overloadpacket", None) in packets for n in gm.graph.nodes))
        self.graphs.append(gm.graph)
        return gm.forward

    def backend(self):
        return aot_autograd(fw_compiler=self.compiler)


@pytest.mark.parametrize("family", ["llama_gqa", "qwen2"])
@torch.no_grad()
def test_compiled_copy_runs_one_matmul_per_group(family):
    model = build_model(family)
    want = model(IDS).logits
    counts = {}
    for cse in (False, True):
        torch._dynamo.reset()
        counter = _MatmulCounter(cse)
        got = compile_model(model, backend=counter.backend())(IDS).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        counts[cse] = max(counter.matmuls)  # the decoder layer's graph (lm_head is a graph of its own)
    assert counts == {False: 7, True: 4}, counts  # q, k, v, o, gate, up, down -> qkv, o, gate/up, down


@torch.no_grad()
def test_compiled_copy_calls_decode_linear_where_it_applies(monkeypatch):
    """Where ``uses_decode_linear`` holds (CUDA, inference), every projection of the copy calls the op: one call
    per fused group (the CSE pass), o_proj, down_proj and the output layer; the user's modules stay nn.Linear."""
    model = build_model("llama_gqa")
    want = model(IDS).logits
    monkeypatch.setattr(fused_projections, "uses_decode_linear", lambda weight: True)  # as on CUDA
    counter = _MatmulCounter(cse=True)
    got = compile_model(model, backend=counter.backend())(IDS).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert max(counter.matmuls) == 4 and 1 in counter.matmuls, counter.matmuls  # a layer's 4, the output layer's 1
    mms = [n for graph in counter.graphs for n in graph.nodes
           if getattr(n.target, "overloadpacket", None) in (torch.ops.aten.mm, torch.ops.aten.addmm)]
    assert not mms, mms  # every matmul is a decode_linear call
    copy = shared_projections(model).module_copy(model)
    assert type(copy.model.layers[0].self_attn.o_proj) is fused_projections.DecodeLinear
    assert type(copy.lm_head) is fused_projections.DecodeLinear and copy.lm_head.weight is model.lm_head.weight
    assert type(model.model.layers[0].self_attn.o_proj) is torch.nn.Linear


def test_hooked_or_subclassed_linears_are_not_copied():
    model = build_model("llama_gqa")
    hooked = model.model.layers[0].self_attn.o_proj
    hooked.register_forward_pre_hook(lambda *a: None)

    class Quantised(torch.nn.Linear):
        pass

    model.model.layers[1].mlp.down_proj.__class__ = Quantised
    copy = shared_projections(model).module_copy(model)
    assert copy.model.layers[0].self_attn.o_proj is hooked
    assert type(copy.model.layers[1].mlp.down_proj) is Quantised
    assert type(copy.model.layers[1].self_attn.o_proj) is fused_projections.DecodeLinear


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="Inductor on CPU needs a C++ compiler")
@torch.no_grad()
def test_inductor_keeps_one_matmul_per_group():
    model = build_model("llama_gqa")
    want = model(IDS).logits
    got, codes = run_and_get_code(lambda: compile_model(model)(IDS).logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    per_graph = [len(re.findall(r"extern_kernels\.(?:mm|addmm)\(", code)) for code in codes]
    assert max(per_graph) == 4, per_graph


@torch.no_grad()
def test_new_storage_is_shared_again_with_its_values():
    model = build_model("qwen2")
    shared = shared_projections(model)
    fused = shared.module_copy(model)
    group = next(iter(shared.groups.values()))
    address = group.weight.data_ptr()
    k = model.model.layers[0].self_attn.k_proj
    k.weight.data = k.weight.data * 2  # new storage, new values (as load_state_dict(assign=True) would)
    k.bias.data = k.bias.data + 1
    assert not shared.intact()
    want = model(IDS).logits
    assert shared_projections(model) is shared and shared.intact()
    assert group.weight.data_ptr() == address, "the fused tensor moved: captured graphs would read freed memory"
    torch.testing.assert_close(fused(IDS).logits, want, rtol=1e-5, atol=1e-5)
    model.double()  # another dtype: new fused tensors
    shared_projections(model)
    assert shared.intact() and group.weight.dtype == torch.float64
    torch.testing.assert_close(fused(IDS.clone()).logits, model(IDS).logits, rtol=1e-9, atol=1e-9)


def test_save_and_load_after_sharing(tmp_path):
    model = build_model("qwen2")
    shared_projections(model)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    safetensors.torch.save_file(model.state_dict(), tmp_path / "raw.safetensors")
    raw = safetensors.torch.load_file(tmp_path / "raw.safetensors")
    assert all(torch.equal(raw[name], a) for name, a in model.state_dict().items())


def test_a_model_first_met_without_compile_keeps_its_storage():
    """A call that compiles nothing may have captured graphs on the weights' addresses: they never move."""
    model = build_model("llama_gqa")
    address = model.model.layers[0].self_attn.k_proj.weight.data_ptr()
    shared = shared_projections(model, share=False)
    assert not shared.groups and shared_projections(model) is shared
    assert model.model.layers[0].self_attn.k_proj.weight.data_ptr() == address
    copy = shared.module_copy(model)  # its projections unfused (each a DecodeLinear over the user's weight)
    assert not any(isinstance(m, FusedSliceLinear) for m in copy.modules())
    assert copy.model.layers[0].self_attn.k_proj.weight is model.model.layers[0].self_attn.k_proj.weight
