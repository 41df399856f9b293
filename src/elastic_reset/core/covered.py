"""The tensors a drift-control method covers and the fp32 copies it keeps of them: the machinery
:class:`~elastic_reset.core.ElasticReset` and :class:`~elastic_reset.core.Anchor` share.

A method covers a module's trainable parameters (with a peft LoRA model: the adapters) or an explicit list, and
keeps copies of them on a device of the caller's choice (CPU by default: the paper's point, §2 and §8, is that
"the EMA model can be stored on CPU"). Host copies of GPU weights live in pinned memory, so the copies between them
are asynchronous DMA transfers instead of staged, blocking ones; every update is one fused ``torch._foreach_*``
call over all covered tensors.

Sharded parameters (PyTorch FSDP2 ``fully_shard``: each parameter a ``DTensor``): every rank keeps the copies of
its own shard, and writes its own shard. Element-wise updates need no communication, and the gathered result equals
the single-process one; only a distance reduces across the shards. FSDP1's flat parameters are refused: torch does
not see their shards as tensors of the parameters' shapes, and a copy of what it sees would be silently wrong.

DeepSpeed ZeRO (after ``deepspeed.initialize``, as under ``accelerate launch`` with a DeepSpeed config): the
optimizer steps fp32 master weights of its own, and copies them into the model's after each step, so θ is read from
and written to those masters (``deepspeed.utils``' ``safe_*_fp32_param``), and every write is copied into the
model's weights at once (the next forward sees it; a write to the model's alone would be undone by the next step).
ZeRO-3: each rank keeps the copies of its own partitions of the masters (flat, padded), as under FSDP2. ZeRO-1/2:
the parameters are whole on every rank; θ is the gathered masters (a collective per read), and every rank keeps
whole copies.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

ModelOrParams = nn.Module | Iterable[nn.Parameter] | Iterable[tuple[str, nn.Parameter]]
Exclude = Callable[[str], bool] | str | Sequence[str] | None


def is_sharded(p: torch.Tensor) -> bool:
    """Whether ``p`` is a ``DTensor`` (an FSDP2 parameter). Without importing ``torch.distributed.tensor`` (~0.8 s):
    a DTensor can only exist once that module is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(p, module.DTensor)


def zero_stage(params: Sequence[torch.Tensor]) -> int:
    """3 for parameters DeepSpeed ZeRO-3 partitions, 1 for parameters whose fp32 masters ZeRO-1/2's optimizer keeps
    (it links each to its master fragment, or to None on a rank that holds none of it), else 0."""
    if "deepspeed" not in sys.modules:
        return 0
    if any(hasattr(p, "ds_id") for p in params):
        return 3
    return 1 if any(hasattr(p, "_hp_mapping") for p in params) else 0


def local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this process holds of ``p``: its shard for a ``DTensor`` (a view: writing it writes the
    parameter), else ``p`` itself."""
    return p.to_local() if is_sharded(p) else p


def _as_named_params(model_or_params: ModelOrParams) -> list[tuple[str, torch.Tensor]]:
    if isinstance(model_or_params, nn.Module):
        return [(n, p) for n, p in model_or_params.named_parameters() if p.requires_grad]
    if isinstance(model_or_params, torch.Tensor):
        raise ValueError("model_or_params: expected a module or an iterable of parameters, got a single tensor")
    named = []
    for i, item in enumerate(model_or_params):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            named.append((item[0], item[1]))
        elif isinstance(item, torch.Tensor):
            named.append((f"param_{i}", item))
        else:
            raise ValueError(
                f"model_or_params: item {i} is a {type(item).__name__}; expected a tensor or a (name, tensor) pair"
            )
    return named


def _refuse_unsupported_sharding(model_or_params: Any, named: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(model_or_params, nn.Module) and any(
            type(m).__name__ == "FullyShardedDataParallel" for m in model_or_params.modules()):
        raise ValueError("model_or_params: FSDP1 (FullyShardedDataParallel) flattens parameters; use FSDP2 "
                         "(torch.distributed.fsdp.fully_shard), whose DTensor shards ElasticReset follows")
    for name, p in named:
        if type(p).__name__ == "FlatParameter":
            raise ValueError(f"model_or_params: {name!r} is flattened by FSDP1, outside torch's view of the tensor, "
                             "so its EMA would be silently wrong; use FSDP2 (fully_shard)")
        if hasattr(p, "ds_id") and _zero3_master(p) is None:
            raise ValueError(f"model_or_params: {name!r} is partitioned by DeepSpeed ZeRO-3 but no ZeRO optimizer "
                             "holds its fp32 master: build the method after deepspeed.initialize (the TRL callback "
                             "does, at train begin)")


def _zero3_master(p: torch.Tensor) -> torch.Tensor | None:
    """This rank's partition of a ZeRO-3 parameter's fp32 master: a view (writing it writes the master)."""
    if getattr(p, "_z3_optimizer", None) is None:  # a partitioned model no ZeRO optimizer steps (inference)
        return None
    from deepspeed.utils import safe_get_local_fp32_param

    return safe_get_local_fp32_param(p)


def _exclude_fn(exclude: Exclude) -> Callable[[str], bool]:
    if exclude is None:
        return lambda name: False
    if callable(exclude):
        return exclude
    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    compiled = [re.compile(p) for p in patterns]
    return lambda name: any(c.search(name) for c in compiled)


def check_decay(decay: Any, key: str) -> None:
    """An EMA's η: a real number strictly between 0 and 1, refused by ``key`` otherwise."""
    if isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0.0 < decay < 1.0:
        raise ValueError(f"{key}: expected a number strictly between 0 and 1, got {decay!r}")


def covered_params(model_or_params: ModelOrParams, exclude: Exclude = None) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs a method covers: a module's trainable parameters or the given ones, less
    ``exclude`` (a callable ``name -> bool``, or regex(es) searched in the name); refused when empty, when names
    repeat, or when the sharding hides the tensors' shapes."""
    skip = _exclude_fn(exclude)
    named = [(n, p) for n, p in _as_named_params(model_or_params) if not skip(n)]
    _refuse_unsupported_sharding(model_or_params, named)
    if not named:
        raise ValueError("model_or_params: no parameters to cover (none with requires_grad=True, or all excluded)")
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("model_or_params: parameter names must be unique")
    return named


def sum_over_shards(params: list[torch.Tensor], squares: list[float]) -> list[float]:
    """Per-parameter sums of squares of the local shards, summed over the mesh dimensions that shard each one
    (not those that replicate it: HSDP's replicas hold the same numbers), so every rank gets the global sums."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        if is_sharded(p):
            groups.setdefault((id(p.device_mesh), tuple(p.placements)), []).append(i)
    out = list(squares)
    for indices in groups.values():
        mesh, placements = params[indices[0]].device_mesh, params[indices[0]].placements
        values = torch.tensor([squares[i] for i in indices], dtype=torch.float64, device=mesh.device_type)
        for dim, placement in enumerate(placements):
            if placement.is_shard():
                torch.distributed.all_reduce(values, group=mesh.get_group(dim))
        for i, value in zip(indices, values.tolist()):
            out[i] = value
    return out


def _sum_over_partitions(params: list[torch.Tensor], squares: list[float]) -> list[float]:
    """``sum_over_shards`` for ZeRO-3: the sums over each parameter's partition group (the padding is the same
    zeros in every copy, so it adds nothing)."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, p in enumerate(params):
        group = getattr(p, "ds_process_group", None)
        groups.setdefault(id(group), (group, []))[1].append(i)
    out = list(squares)
    for group, indices in groups.values():
        values = torch.tensor([squares[i] for i in indices], dtype=torch.float64)
        torch.distributed.all_reduce(values, group=group)
        for i, value in zip(indices, values.tolist()):
            out[i] = value
    return out


class CoveredTensors:
    """The covered tensors θ (:attr:`params`, by :attr:`names`) and the means to keep copies of them on
    :attr:`device` in :attr:`dtype`: take one, read θ in the copies' space, write one into θ, swap one in for a
    block, and measure the distance between two."""

    def __init__(self, model_or_params: ModelOrParams, exclude: Exclude = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        named = covered_params(model_or_params, exclude)
        self.names: list[str] = [n for n, _ in named]
        self.params: list[torch.Tensor] = [p for _, p in named]
        self.zero = zero_stage(self.params)
        """DeepSpeed ZeRO: 3 (partitioned), 1 (stages 1-2: the optimizer's fp32 masters partitioned), or 0."""
        self.is_sharded = self.zero == 3 or any(is_sharded(p) for p in self.params)
        """FSDP2 or ZeRO-3 parameters: the copies and the state dict hold this rank's shards only."""
        self.device = torch.device(device)
        self.dtype = dtype
        self._pinned = self.device.type == "cpu" and any(p.device.type == "cuda" for p in self.params)
        # A parameter whose device and dtype already match its copy is read in place; the others are converted on
        # each read (one fused copy into a reused buffer, not one allocation per tensor per step).
        self._direct = all(t.device == self.device and t.dtype == dtype for t in self._locals())
        self._buffer: list[torch.Tensor] | None = None

    @property
    def collective(self) -> bool:
        """Whether reading θ (a distance, a swap, a copy) is a collective every rank must call: sharded parameters,
        or ZeRO's masters."""
        return self.is_sharded or self.zero != 0

    def _locals(self) -> list[torch.Tensor]:
        """What this process holds of each covered parameter (its shard under FSDP2, its master partition under
        ZeRO-3, the gathered masters under ZeRO-1/2): the tensors a copy reads and a write changes, always under
        ``torch.no_grad()`` and followed by :meth:`_written`. Unsharded, the parameters themselves: a ``detach()``
        per tensor per step cost about a tenth of a LoRA update's time."""
        if self.zero == 3:
            return [_zero3_master(p) for p in self.params]
        if self.zero == 1:
            from deepspeed.utils import safe_get_full_fp32_param

            return [safe_get_full_fp32_param(p) for p in self.params]
        if not self.is_sharded:
            return self.params
        return [local(p).detach() for p in self.params]

    def _written(self, tensors: list[torch.Tensor]) -> None:
        """After a write into ``tensors`` (what :meth:`_locals` returned): under DeepSpeed, into the masters and the
        model's weights (the other layouts wrote the parameters themselves)."""
        if self.zero == 3:
            for p, master in zip(self.params, tensors):
                p.ds_tensor.data.copy_(master)
            # Small parameters stay gathered between steps (ZeRO-3's persistence threshold): gathered again from
            # the partitions just written, as DeepSpeed does after a checkpoint's load.
            persistent = [p for p in self.params if getattr(p, "ds_persist", False)]
            if persistent:
                persistent[0].partition(persistent)
                persistent[0].all_gather(persistent)
        elif self.zero == 1:
            from deepspeed.utils import safe_set_full_fp32_param

            for p, t in zip(self.params, tensors):
                safe_set_full_fp32_param(p, t)
                p.data.copy_(t)

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self._pinned else t

    @torch.no_grad()
    def _snapshot(self) -> list[torch.Tensor]:
        """A new copy of θ on :attr:`device` in :attr:`dtype`."""
        return [self._host(t.to(self.device, self.dtype, copy=True)) for t in self._locals()]

    def _wait_for_copies(self) -> None:
        """Block until the asynchronous copies between the GPU and pinned host memory have landed (a no-op without
        them): before the CPU reads a buffer the GPU writes, or writes one the GPU still reads."""
        if self._pinned:
            for device in {p.device for p in self.params if p.device.type == "cuda"}:
                torch.cuda.current_stream(device).synchronize()

    def _params_in_copy_space(self) -> list[torch.Tensor]:
        """θ on the copies' device and dtype: the live tensors when they match, else a reused buffer."""
        if self._direct:
            return self._locals()
        if self._buffer is None:
            self._buffer = [self._host(torch.empty(t.shape, dtype=self.dtype, device=self.device))
                            for t in self._locals()]
        torch._foreach_copy_(self._buffer, self._locals(), non_blocking=self._pinned)
        self._wait_for_copies()
        return self._buffer

    def _copy_into_params(self, source: list[torch.Tensor]) -> None:
        """θ ← ``source``, which may be overwritten as soon as this returns."""
        target = self._locals()
        torch._foreach_copy_(target, source, non_blocking=self._pinned)
        self._wait_for_copies()
        self._written(target)

    @contextmanager
    def _swapped_in(self, source: list[torch.Tensor]) -> Iterator[None]:
        """θ holds ``source`` inside the block; its own values are restored exactly after."""
        with torch.no_grad():
            saved = [t.clone() for t in self._locals()]
            self._copy_into_params(source)
        try:
            yield
        finally:
            with torch.no_grad():
                self._copy_into_params(saved)

    @torch.no_grad()
    def _distance(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        """‖a − b‖₂ over all covered tensors; sharded: over the whole parameters, the same on every rank (a
        collective: every rank must call it)."""
        squares = [float(n) ** 2 for n in torch._foreach_norm(torch._foreach_sub(a, b))]
        if self.zero == 3:
            squares = _sum_over_partitions(self.params, squares)
        elif self.is_sharded:
            squares = sum_over_shards(self.params, squares)
        return math.sqrt(sum(squares))
