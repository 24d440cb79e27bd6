"""Tensor-parallel models (``from_pretrained(..., tp_plan="auto")`` under torchrun): ranks in lockstep.

Every rank runs the same ``generate()`` call on the same inputs. A tensor-parallel model's
weights are DTensor shards; its forward all-reduces after the rowwise layers and all-gathers
the output layer, so every rank holds the same full logits, and its attention layers see the
rank's own KV heads (the paged cache's pools take their shape from the K/V a layer writes, so
they hold the local heads). The ranks stay in lockstep (same rounds, same collectives) as long
as they make the same choices:

- greedy: the argmax of identical logits;
- sampling: identical random draws. Without ``SpecConfig(generator=)``, a generator kept on
  the target is reseeded every call with a seed drawn from rank 0's global RNG and broadcast
  (``torch.manual_seed`` on rank 0 makes a call reproducible); a user's generator must be seeded
  identically on every rank;
- the draft: replicated (an ordinary model on each rank's GPU: ``draft_tp=1``) or itself
  tensor-parallel over the same ranks (loaded with ``tp_plan`` too: ``draft_tp=N``).

``check_ranks_agree`` ends every call: it compares the ranks' output rows and raises, naming
the rows, if they differ. Ranks that diverged mid-call may deadlock in a collective first
(different numbers of rounds); the shared generator is what prevents that.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

_GENERATORS = "_hf_specdec_lockstep_generators"  # attribute of the target: device -> torch.Generator
_HASH_SEED = 0x5EED


def tp_mesh(model: Optional[PreTrainedModel]):
    """The tensor-parallel device mesh of ``model`` (None when it is not sharded over several ranks)."""
    if model is None or not dist.is_available() or not dist.is_initialized():
        return None  # no process group, no mesh of several ranks (and no walk over every parameter, each call)
    from torch.distributed.tensor import DTensor

    # the mesh the weights are sharded on (transformers >= 5.2x keeps a larger mesh on the model)
    mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
    if mesh is not None and mesh.ndim > 1:
        mesh = mesh["tp"] if "tp" in (mesh.mesh_dim_names or ()) else None
    return mesh if mesh is not None and mesh.size() > 1 else None


def tp_size(model: Optional[PreTrainedModel]) -> int:
    mesh = tp_mesh(model)
    return 1 if mesh is None else mesh.size()


def _ranks(mesh) -> list[int]:
    return sorted(mesh.mesh.flatten().tolist())


def lockstep_group(target: PreTrainedModel, draft: Optional[PreTrainedModel], draft_tp: Optional[int]):
    """The process group whose ranks must run this call in lockstep (None: a single-process call).
    Checks the draft's placement against ``SpecConfig.draft_tp`` and the target's ranks."""
    t_mesh, d_mesh = tp_mesh(target), tp_mesh(draft)
    if draft is not None and draft_tp is not None and tp_size(draft) != draft_tp:
        how = ("load it with from_pretrained(..., tp_plan=\"auto\") in every process of the launch" if draft_tp > 1
               else "load it without tp_plan and move it to each rank's device (a replicated draft)")
        raise ValueError(f"SpecConfig(draft_tp={draft_tp}) but the draft is split over {tp_size(draft)} rank(s): "
                         f"{how}, or set draft_tp=None to take the draft as loaded.")
    if d_mesh is not None and (t_mesh is None or _ranks(t_mesh) != _ranks(d_mesh)):
        where = "is not tensor-parallel" if t_mesh is None else f"runs on ranks {_ranks(t_mesh)}"
        raise ValueError(f"the draft is tensor-parallel over ranks {_ranks(d_mesh)} but the target {where}: a "
                         "tensor-parallel draft needs a target sharded over the same ranks (same tp_plan launch), "
                         "or load the draft without tp_plan.")
    return None if t_mesh is None else t_mesh.get_group()


def lockstep_generator(target: PreTrainedModel, group, generator: Optional[torch.Generator], do_sample: bool,
                       device: torch.device) -> Optional[torch.Generator]:
    """The generator every rank draws from: the user's, or one kept on the target (the same object on
    every call, so captured graphs stay valid) reseeded with rank 0's seed."""
    if group is None or generator is not None or not do_sample:
        return generator
    seed = torch.randint(0, 2**62, (1,), dtype=torch.long).to(device)
    dist.broadcast(seed, src=dist.get_global_rank(group, 0), group=group)
    kept = target.__dict__.setdefault(_GENERATORS, {})
    gen = kept.get(device)
    if gen is None:
        gen = kept[device] = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def _fingerprints(sequences: torch.Tensor) -> torch.Tensor:
    """Per row ``[width, hash]`` (int64, wrapping arithmetic): equal rows give equal fingerprints."""
    width = sequences.shape[1]
    weights = torch.randint(1, 2**62, (width,), generator=torch.Generator().manual_seed(_HASH_SEED))
    hashed = (sequences.long() * weights.to(sequences.device)).sum(1)
    return torch.stack([torch.full_like(hashed, width), hashed], dim=1)


def check_ranks_agree(group, sequences: torch.Tensor) -> None:
    """Raise if the ranks of ``group`` produced different output rows (one all_gather of 16 bytes a row)."""
    if group is None:
        return
    mine = _fingerprints(sequences)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    rows = sorted({r for other in everyone[1:] for r in (other != everyone[0]).any(1).nonzero().flatten().tolist()})
    if rows:
        raise RuntimeError(
            f"tensor-parallel ranks emitted different tokens in rows {rows} of this generate() call. Every rank "
            "must run the same call on the same inputs and draw the same random numbers: leave "
            "SpecConfig.generator=None (hf_specdec then shares one seed across ranks) or seed the generator you "
            "pass identically on every rank.")
