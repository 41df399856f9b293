"""Elastic Reset: an EMA of the policy's weights, and periodic resets of the policy to it.

Noukhovitch et al., "Language Model Alignment with Elastic Reset", NeurIPS 2023, §3:

    θ̄ ← θ0;  after every online step: θ̄ ← (1 − η)·θ + η·θ̄;  every n steps: θ ← θ̄, then θ̄ ← θ0.

η (``decay``) weights the EMA, not the policy. There is no reset at step 0. The value function is not part of
what is reset (the caller excludes it), and the optimizer state is kept by default, as in the authors' code.

The EMA and θ0 are fp32 copies kept on a device of the caller's choice (CPU by default), updated by fused
``torch._foreach_*`` calls, and FSDP2 shards are followed rank by rank: :mod:`elastic_reset.core.covered`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from elastic_reset.core.covered import CoveredTensors, Exclude, ModelOrParams, check_decay

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


def _check_reset_every(reset_every: Any, key: str) -> None:
    if reset_every is not None and (isinstance(reset_every, bool) or not isinstance(reset_every, numbers.Integral)
                                    or reset_every < 1):
        raise ValueError(f"{key}: expected an integer >= 1, got {reset_every!r}")


class ElasticReset(CoveredTensors):
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
        model_or_params: ModelOrParams,
        decay: float = 0.995,
        reset_every: int | None = None,
        mode: str = "elastic",
        device: str | torch.device = "cpu",
        schedule: Callable[[int], bool] | None = None,
        exclude: Exclude = None,
        optimizer: torch.optim.Optimizer | None = None,
        reset_optimizer_state: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        check_decay(decay, "decay")
        _check_reset_every(reset_every, "reset_every")
        if reset_every is not None and schedule is not None:
            raise ValueError("reset_every: give either reset_every or schedule, not both")
        if schedule is not None and not callable(schedule):
            raise ValueError(f"schedule: expected a callable step -> bool, got {type(schedule).__name__}")
        if mode != "none" and reset_every is None and schedule is None:
            raise ValueError(f"reset_every: mode {mode!r} resets, so it needs reset_every (or a schedule)")
        if reset_optimizer_state and optimizer is None:
            raise ValueError("optimizer: reset_optimizer_state=True needs the optimizer")

        super().__init__(model_or_params, exclude, device, dtype)
        self.decay = float(decay)
        self.reset_every = None if reset_every is None else int(reset_every)
        self.mode = mode
        self.schedule = schedule
        self.optimizer = optimizer
        self.reset_optimizer_state = reset_optimizer_state
        self.num_steps = 0
        self.num_resets = 0
        self.init = self._snapshot()
        self.ema = self._snapshot()

    # ----------------------------------------------------------------------------------------------- updates
    @torch.no_grad()
    def update(self) -> None:
        """θ̄ ← (1 − η)·θ + η·θ̄ (= lerp of θ̄ towards θ with weight 1 − η). Does not count a step."""
        torch._foreach_lerp_(self.ema, self._params_in_copy_space(), 1.0 - self.decay)

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
        return self._distance(self._params_in_copy_space(), self.ema)

    @torch.no_grad()
    def ema_is_initial(self) -> bool:
        """Whether the EMA holds θ0 exactly: at step 0, and right after a reset in mode ``"elastic"`` or ``"init"``
        until the next update (a run that ends on a reset step: the pre-reset EMA is then in the policy). This
        rank's tensors only when sharded."""
        return all(torch.equal(e, i) for e, i in zip(self.ema, self.init))

    def ema_state(self) -> dict[str, torch.Tensor]:
        """The EMA weights by parameter name (fp32, on :attr:`device`): for saving or loading an EMA model."""
        return dict(zip(self.names, self.ema))

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """Evaluate with the EMA swapped into the model; the policy's own weights are restored exactly after.

        >>> with er.ema_weights():
        ...     eval_reward = evaluate(model)
        """
        with self._swapped_in(self.ema):
            yield

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
        check_decay(state["decay"], "state['decay']")
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

