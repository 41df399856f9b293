"""Elastic Reset: an EMA of the policy's weights, and periodic resets of the policy to it.

Noukhovitch et al., "Language Model Alignment with Elastic Reset", NeurIPS 2023, §3:

    θ̄ ← θ0;  after every online step: θ̄ ← (1 − η)·θ + η·θ̄;  every n steps: θ ← θ̄, then θ̄ ← θ0.

η (``decay``) weights the EMA, not the policy. There is no reset at step 0. The value function is not part of
what is reset (the caller excludes it), and the optimizer state is kept by default, as in the authors' code.

The EMA and θ0 are fp32 copies kept on a device of the caller's choice (CPU by default: the paper's point is that
the method is cheap), and every update is a fused ``torch._foreach_*`` call over all covered tensors.

Sharded parameters (PyTorch FSDP2 ``fully_shard``: each parameter a ``DTensor``): every rank keeps the EMA and θ0
of its own shard and a reset writes its own shard. The update and the reset are element-wise, so no communication
is needed and the gathered result equals the single-process one; only :meth:`ElasticReset.distance` reduces
across the shards. FSDP1's flat parameters and DeepSpeed ZeRO-3's partitioned ones are refused: torch does not see
their shards as tensors of the parameters' shapes, and an EMA of what it sees would be silently wrong.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def _is_sharded(p: torch.Tensor) -> bool:
    """Whether ``p`` is a ``DTensor`` (an FSDP2 parameter). Without importing ``torch.distributed.tensor`` (~0.8 s):
    a DTensor can only exist once that module is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(p, module.DTensor)

MODES = ("elastic", "ema", "init", "none")
"""``elastic``: θ ← θ̄, θ̄ ← θ0 (the method). ``ema``: θ ← θ̄, EMA never reset (ablation "reset to EMA").
``init``: θ ← θ0 (ablation "reset to init"; the EMA restarts at θ0 too, so it always averages the current
iteration). ``none``: only track θ̄ and never reset (ablation "EMA only": evaluate the EMA)."""


@dataclass(frozen=True)
class ResetEvent:
    """What a reset did, for the caller's logs."""

    step: int
    """The value of :attr:`ElasticReset.num_steps` at which the reset happened (1-based: the n-th ``step()``)."""
    index: int
    """1 for the first reset of the run, 2 for the second, ..."""
    mode: str
    """The mode that decided what was reset (see :data:`MODES`)."""
    distance: float
    """L2 distance ‖θ − θ̄‖ over the covered tensors just before the reset."""


def _as_named_params(
    model_or_params: nn.Module | Iterable[nn.Parameter] | Iterable[tuple[str, nn.Parameter]],
) -> list[tuple[str, torch.Tensor]]:
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


def _local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this process holds of ``p``: its shard for a ``DTensor`` (a view: writing it writes the
    parameter), else ``p`` itself."""
    return p.to_local() if _is_sharded(p) else p


def _refuse_unsupported_sharding(model_or_params: Any, named: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(model_or_params, nn.Module) and any(
            type(m).__name__ == "FullyShardedDataParallel" for m in model_or_params.modules()):
        raise ValueError("model_or_params: FSDP1 (FullyShardedDataParallel) flattens parameters; use FSDP2 "
                         "(torch.distributed.fsdp.fully_shard), whose DTensor shards ElasticReset follows")
    for name, p in named:
        if hasattr(p, "ds_id") or type(p).__name__ == "FlatParameter":
            raise ValueError(f"model_or_params: {name!r} is partitioned by DeepSpeed ZeRO-3 or flattened by FSDP1, "
                             "outside torch's view of the tensor, so its EMA would be silently wrong; use FSDP2 "
                             "(fully_shard), or DeepSpeed ZeRO stage 1-2 (parameters replicated)")


def _exclude_fn(exclude: Callable[[str], bool] | str | Sequence[str] | None) -> Callable[[str], bool]:
    if exclude is None:
        return lambda name: False
    if callable(exclude):
        return exclude
    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    compiled = [re.compile(p) for p in patterns]
    return lambda name: any(c.search(name) for c in compiled)


def _check_decay(decay: Any, key: str) -> None:
    if isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0.0 < decay < 1.0:
        raise ValueError(f"{key}: expected a number strictly between 0 and 1, got {decay!r}")


def _check_reset_every(reset_every: Any, key: str) -> None:
    if reset_every is not None and (isinstance(reset_every, bool) or not isinstance(reset_every, numbers.Integral)
                                    or reset_every < 1):
        raise ValueError(f"{key}: expected an integer >= 1, got {reset_every!r}")


class ElasticReset:
    """EMA tracking and resets for a set of trainable tensors (a model's, or an explicit list).

    Call :meth:`step` once after every optimizer step, as the paper's §3 says (or whatever unit the schedule
    counts: the authors' IMDB code stepped once per rollout iteration, their StackLLaMA code once per epoch). It
    updates the EMA and, when the schedule says so, resets; it returns the :class:`ResetEvent` of that reset, or
    ``None``.

    Args:
        model_or_params: a module (its parameters with ``requires_grad=True`` are covered; with a peft LoRA model
            that is the adapter weights only), or an iterable of tensors or ``(name, tensor)`` pairs.
        decay: η in (0, 1), the weight of the old EMA in each update.
        reset_every: reset every this many steps (steps n, 2n, ...; never at step 0). Required for every mode but
            ``"none"`` unless ``schedule`` is given.
        mode: one of :data:`MODES`.
        device: where the EMA and θ0 live (default CPU, whatever the model's device).
        schedule: a callable ``step -> bool`` deciding when to reset, instead of ``reset_every``. It is called with
            the 1-based step count after each EMA update.
        exclude: names to leave out when given a module: a callable ``name -> bool``, or regex(es) searched in the
            name (e.g. ``"v_head"`` for a value head).
        optimizer: the optimizer that trains these tensors; only needed for ``reset_optimizer_state``.
        reset_optimizer_state: also drop the optimizer's state (e.g. Adam moments) of the reset tensors, so they
            restart as under a fresh optimizer. Off by default, as in the authors' code.
        dtype: dtype of the EMA and θ0 copies (fp32 by default, even for a bf16 model: a bf16 EMA with η=0.995
            would round most updates away).
    """

    def __init__(
        self,
        model_or_params: nn.Module | Iterable[nn.Parameter] | Iterable[tuple[str, nn.Parameter]],
        decay: float = 0.995,
        reset_every: int | None = None,
        mode: str = "elastic",
        device: str | torch.device = "cpu",
        schedule: Callable[[int], bool] | None = None,
        exclude: Callable[[str], bool] | str | Sequence[str] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        reset_optimizer_state: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        _check_decay(decay, "decay")
        _check_reset_every(reset_every, "reset_every")
        if reset_every is not None and schedule is not None:
            raise ValueError("reset_every: give either reset_every or schedule, not both")
        if schedule is not None and not callable(schedule):
            raise ValueError(f"schedule: expected a callable step -> bool, got {type(schedule).__name__}")
        if mode != "none" and reset_every is None and schedule is None:
            raise ValueError(f"reset_every: mode {mode!r} resets, so it needs reset_every (or a schedule)")
        if reset_optimizer_state and optimizer is None:
            raise ValueError("optimizer: reset_optimizer_state=True needs the optimizer")

        skip = _exclude_fn(exclude)
        named = [(n, p) for n, p in _as_named_params(model_or_params) if not skip(n)]
        _refuse_unsupported_sharding(model_or_params, named)
        if not named:
            raise ValueError(
                "model_or_params: no parameters to cover (none with requires_grad=True, or all excluded)"
            )
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("model_or_params: parameter names must be unique")

        self.names: list[str] = names
        self.params: list[torch.Tensor] = [p for _, p in named]
        self.is_sharded = any(_is_sharded(p) for p in self.params)
        """FSDP2 parameters: the EMA, θ0 and :meth:`state_dict` hold this rank's shards only."""
        self.decay = float(decay)
        self.reset_every = None if reset_every is None else int(reset_every)
        self.mode = mode
        self.schedule = schedule
        self.device = torch.device(device)
        self.dtype = dtype
        self.optimizer = optimizer
        self.reset_optimizer_state = reset_optimizer_state
        self.num_steps = 0
        self.num_resets = 0
        # Host copies of GPU weights live in pinned memory, so the copies between them are asynchronous DMA transfers
        # (the paper keeps the EMA on the CPU, §2 and §8: "the EMA model can be stored on CPU") instead of staged,
        # blocking ones.
        self._pinned = self.device.type == "cpu" and any(p.device.type == "cuda" for p in self.params)
        with torch.no_grad():
            self.init = [self._host(t.detach().to(self.device, dtype, copy=True)) for t in self._locals()]
            self.ema = [self._host(t.clone()) for t in self.init]
        # A parameter whose device and dtype already match its EMA copy is read in place; the others are
        # converted on each update (one fused copy into a reused buffer, not one allocation per tensor per step).
        self._direct = all(t.device == self.device and t.dtype == dtype for t in self._locals())
        self._buffer: list[torch.Tensor] | None = None

    def _locals(self) -> list[torch.Tensor]:
        """What this process holds of each covered parameter (its shard under FSDP2), detached: the tensors the
        EMA reads and a reset writes."""
        return [_local(p).detach() for p in self.params]

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self._pinned else t

    def _wait_for_copies(self) -> None:
        """Block until the asynchronous copies between the GPU and the pinned EMA have landed (a no-op without
        them): before the CPU reads a buffer the GPU writes, or writes one the GPU still reads."""
        if self._pinned:
            for device in {p.device for p in self.params if p.device.type == "cuda"}:
                torch.cuda.current_stream(device).synchronize()

    def _copy_into_params(self, source: list[torch.Tensor]) -> None:
        torch._foreach_copy_(self._locals(), source, non_blocking=self._pinned)
        self._wait_for_copies()  # ``source`` may be overwritten right after (θ̄ ← θ0)

    # ----------------------------------------------------------------------------------------------- updates
    def _params_in_ema_space(self) -> list[torch.Tensor]:
        if self._direct:
            return self._locals()
        if self._buffer is None:
            self._buffer = [self._host(torch.empty_like(e)) for e in self.ema]
        torch._foreach_copy_(self._buffer, self._locals(), non_blocking=self._pinned)
        self._wait_for_copies()
        return self._buffer

    @torch.no_grad()
    def update(self) -> None:
        """θ̄ ← (1 − η)·θ + η·θ̄ (= lerp of θ̄ towards θ with weight 1 − η). Does not count a step."""
        torch._foreach_lerp_(self.ema, self._params_in_ema_space(), 1.0 - self.decay)

    def should_reset(self, step: int) -> bool:
        """Whether the schedule resets at 1-based step ``step`` (never at step 0, never in mode ``"none"``)."""
        if self.mode == "none" or step <= 0:
            return False
        if self.schedule is not None:
            return bool(self.schedule(step))
        return step % self.reset_every == 0

    def step(self, update_ema: bool = True) -> ResetEvent | None:
        """Count one step: update the EMA (unless ``update_ema=False``, for callers that update it on another
        clock), then reset if the schedule says so. Returns the reset's event, or ``None``."""
        if update_ema:
            self.update()
        self.num_steps += 1
        if self.should_reset(self.num_steps):
            return self.reset()
        return None

    @torch.no_grad()
    def reset(self) -> ResetEvent:
        """Reset now, as the mode says, whatever the schedule. Returns the event."""
        if self.mode == "none":
            raise RuntimeError("mode 'none' never resets")
        distance = self.distance()
        if self.mode in ("elastic", "ema"):
            self._copy_into_params(self.ema)  # θ ← θ̄
        if self.mode == "init":
            self._copy_into_params(self.init)  # θ ← θ0
        if self.mode in ("elastic", "init"):
            torch._foreach_copy_(self.ema, self.init)  # θ̄ ← θ0
        if self.reset_optimizer_state:
            for p in self.params:
                self.optimizer.state.pop(p, None)
        self.num_resets += 1
        return ResetEvent(step=self.num_steps, index=self.num_resets, mode=self.mode, distance=distance)

    # --------------------------------------------------------------------------------------------- inspection
    @torch.no_grad()
    def distance(self) -> float:
        """‖θ − θ̄‖₂ over all covered tensors (how far the policy has moved from its average). Sharded: over the
        whole parameters, the same on every rank (a collective: every rank must call it)."""
        diffs = torch._foreach_sub(self._params_in_ema_space(), self.ema)
        squares = [float(n) ** 2 for n in torch._foreach_norm(diffs)]
        if self.is_sharded:
            squares = _sum_over_shards(self.params, squares)
        return math.sqrt(sum(squares))

    def ema_state(self) -> dict[str, torch.Tensor]:
        """The EMA weights by parameter name (fp32, on :attr:`device`): for saving or loading an EMA model."""
        return dict(zip(self.names, self.ema))

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """Evaluate with the EMA swapped into the model; the policy's own weights are restored exactly after.

        >>> with er.ema_weights():
        ...     eval_reward = evaluate(model)
        """
        with torch.no_grad():
            saved = [t.clone() for t in self._locals()]
            self._copy_into_params(self.ema)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._locals(), saved)

    # ------------------------------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit: EMA, θ0, counters, and the every-N schedule. Sharded: this
        rank's shards (save one file per rank, and load each rank's own into the same sharding).

        Tensors are returned by reference (as ``nn.Module.state_dict`` does); ``torch.save`` copies them. A
        callable ``schedule`` cannot be saved: pass the same one again when resuming.
        """
        return {
            "names": list(self.names),
            "ema": list(self.ema),
            "init": list(self.init),
            "num_steps": self.num_steps,
            "num_resets": self.num_resets,
            "decay": self.decay,
            "mode": self.mode,
            "reset_every": self.reset_every,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output. Names and shapes must match the covered tensors."""
        missing = {"names", "ema", "init", "num_steps", "num_resets", "decay", "mode", "reset_every"} - set(state)
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        if list(state["names"]) != self.names:
            extra = sorted(set(state["names"]) - set(self.names))[:5]
            absent = sorted(set(self.names) - set(state["names"]))[:5]
            raise ValueError(
                f"state['names']: the saved parameters do not match the covered ones "
                f"(saved only: {extra}, covered only: {absent}, or a different order)"
            )
        for key in ("ema", "init"):
            if len(state[key]) != len(self.names):
                raise ValueError(f"state[{key!r}]: {len(state[key])} tensors, expected {len(self.names)}")
            for name, saved, mine in zip(self.names, state[key], self.ema):
                if tuple(saved.shape) != tuple(mine.shape):
                    raise ValueError(
                        f"state[{key!r}]: shape of {name!r} is {tuple(saved.shape)}, expected {tuple(mine.shape)}"
                    )
        if state["mode"] not in MODES:
            raise ValueError(f"state['mode']: expected one of {MODES}, got {state['mode']!r}")
        _check_decay(state["decay"], "state['decay']")
        _check_reset_every(state["reset_every"], "state['reset_every']")
        if self.schedule is None and state["reset_every"] is None and state["mode"] != "none":
            raise ValueError("state['reset_every']: the state was saved with a callable schedule; pass the same "
                             "schedule when resuming")
        with torch.no_grad():
            torch._foreach_copy_(self.ema, [t.to(self.device, self.dtype) for t in state["ema"]])
            torch._foreach_copy_(self.init, [t.to(self.device, self.dtype) for t in state["init"]])
        self.num_steps = int(state["num_steps"])
        self.num_resets = int(state["num_resets"])
        self.decay = float(state["decay"])
        self.mode = state["mode"]
        if self.schedule is None:
            self.reset_every = None if state["reset_every"] is None else int(state["reset_every"])

    def __repr__(self) -> str:
        numel = sum(t.numel() for t in self.ema)
        when = f"reset_every={self.reset_every}" if self.schedule is None else "schedule=<callable>"
        return (f"ElasticReset(mode={self.mode!r}, decay={self.decay}, {when}, tensors={len(self.ema)}, "
                f"numel={numel}, device={self.device}, step={self.num_steps}, resets={self.num_resets})")


def _sum_over_shards(params: list[torch.Tensor], squares: list[float]) -> list[float]:
    """Per-parameter sums of squares of the local shards, summed over the mesh dimensions that shard each one
    (not those that replicate it: HSDP's replicas hold the same numbers), so every rank gets the global sums."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        if _is_sharded(p):
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
