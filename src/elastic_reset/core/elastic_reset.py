"""Elastic Reset: an EMA of the policy's weights, and periodic resets of the policy to it.

Noukhovitch et al., "Language Model Alignment with Elastic Reset", NeurIPS 2023, §3:

    θ̄ ← θ0;  after every online step: θ̄ ← (1 − η)·θ + η·θ̄;  every n steps: θ ← θ̄, then θ̄ ← θ0.

η (``decay``) weights the EMA, not the policy. There is no reset at step 0. The value function is not part of
what is reset (the caller excludes it), and the optimizer state is kept by default, as in the authors' code.

:class:`ElasticReset` is the paper's face of :class:`~elastic_reset.core.anchor.Anchor`: each mode is a list of
pulls on a fixed period or a schedule, with one event type (:class:`~elastic_reset.core.anchor.AnchorEvent`) and one
state format (the anchor's; a state saved in the older format of its own still loads). The EMA and θ0 are fp32
copies kept on a device of the caller's choice (CPU by default), updated by fused ``torch._foreach_*`` calls, and
FSDP2 shards are followed rank by rank: :mod:`elastic_reset.core.covered`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from elastic_reset.core.anchor import Anchor, AnchorEvent, Pull
from elastic_reset.core.covered import Exclude, ModelOrParams, check_decay
from elastic_reset.core.triggers import Every

MODES = ("elastic", "ema", "init", "none")
"""``elastic``: θ ← θ̄, θ̄ ← θ0 (the method). ``ema``: θ ← θ̄, EMA never reset (ablation "reset to EMA").
``init``: θ ← θ0 (ablation "reset to init"; the EMA restarts at θ0 too, so it always averages the current
iteration). ``none``: only track θ̄ and never reset (ablation "EMA only": evaluate the EMA)."""

PULLS: dict[str, tuple[Pull, ...]] = {
    "elastic": (Pull("policy", "ema"), Pull("ema", "init")),
    "ema": (Pull("policy", "ema"),),
    "init": (Pull("policy", "init"), Pull("ema", "init")),
    "none": (),
}
"""Each mode as the anchor's pulls."""

ResetEvent = AnchorEvent
"""What a reset did (``step``, ``index``, ``mode``, ``distance`` = ‖θ − θ̄‖ just before it; ``cause``, ``pulls``)."""

_LEGACY_KEYS = ("names", "ema", "init", "num_steps", "num_resets", "decay", "mode", "reset_every")
"""The state format this class wrote before it was an anchor's preset."""


def _check_reset_every(reset_every: Any, key: str) -> None:
    if reset_every is not None and (isinstance(reset_every, bool) or not isinstance(reset_every, numbers.Integral)
                                    or reset_every < 1):
        raise ValueError(f"{key}: expected an integer >= 1, got {reset_every!r}")


class _Schedule:
    """A caller's ``step -> bool`` as a trigger (nothing to save: pass the same one when resuming)."""

    keys: tuple[str, ...] = ()

    def __init__(self, schedule: Callable[[int], bool]):
        self.schedule = schedule

    def __call__(self, step: int, metrics: Mapping[str, float]) -> str | None:
        return "schedule" if self.schedule(step) else None


class ElasticReset(Anchor):
    """EMA tracking and resets for a set of trainable tensors (a model's, or an explicit list).

    Call :meth:`step` once after every optimizer step, as the paper's §3 says (or whatever unit the schedule
    counts: the authors' IMDB code stepped once per rollout iteration, their StackLLaMA code once per epoch). It
    updates the EMA and, when the schedule says so, resets; it returns the reset's :class:`ResetEvent`, or ``None``.

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
        self.schedule = schedule
        trigger = _Schedule(schedule) if schedule is not None else Every(reset_every) if reset_every else None
        super().__init__(model_or_params, PULLS[mode], trigger, decay=float(decay),
                         reset_optimizer=reset_optimizer_state, optimizer=optimizer, device=device, exclude=exclude,
                         dtype=dtype, name=mode)

    # ------------------------------------------------------------------------------------- the paper's names
    @property
    def mode(self) -> str:
        return self.name

    @property
    def reset_every(self) -> int | None:
        return self.trigger.n if isinstance(self.trigger, Every) else None

    @property
    def reset_optimizer_state(self) -> bool:
        return self.reset_optimizer

    @property
    def num_resets(self) -> int:
        return self.num_pulls

    @property
    def ema(self) -> list[torch.Tensor]:
        """θ̄, one fp32 tensor per covered one, on :attr:`device`."""
        return self.copies["ema"]

    @property
    def init(self) -> list[torch.Tensor]:
        """θ0."""
        return self.copies["init"]

    # ----------------------------------------------------------------------------------------------- updates
    def should_reset(self, step: int) -> bool:
        """Whether the schedule resets at 1-based step ``step`` (never at step 0, never in mode ``"none"``)."""
        if self.mode == "none" or step <= 0:
            return False
        return self.trigger(step, {}) is not None

    def step(self, update_ema: bool = True) -> ResetEvent | None:  # type: ignore[override]
        """Count one step: update the EMA (unless ``update_ema=False``, for callers that update it on another
        clock), then reset if the schedule says so. Returns the reset's event, or ``None``."""
        return super().step(update=update_ema)

    def reset(self) -> ResetEvent:
        """Reset now, as the mode says, whatever the schedule. Returns the event."""
        if self.mode == "none":
            raise RuntimeError("mode 'none' never resets")
        return self.pull("manual")

    def _pull_distance(self) -> float:
        return self.distance()

    # --------------------------------------------------------------------------------------------- inspection
    def distance(self, a: str = "policy", b: str = "ema") -> float:
        """‖θ − θ̄‖₂ over all covered tensors by default (how far the policy has moved from its average); any two
        of ``policy``, ``ema``, ``init``. Sharded: over the whole parameters, the same on every rank (a collective:
        every rank must call it)."""
        return super().distance(a, b)

    @torch.no_grad()
    def ema_is_initial(self) -> bool:
        """Whether the EMA holds θ0 exactly: at step 0, and right after a reset in mode ``"elastic"`` or ``"init"``
        until the next update (a run that ends on a reset step: the pre-reset EMA is then in the policy). This
        rank's tensors only when sharded."""
        return all(torch.equal(e, i) for e, i in zip(self.ema, self.init))

    def ema_state(self) -> dict[str, torch.Tensor]:
        """The EMA weights by parameter name (fp32, on :attr:`device`): for saving or loading an EMA model."""
        return self.copy("ema")

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """Evaluate with the EMA swapped into the model; the policy's own weights are restored exactly after.

        >>> with er.ema_weights():
        ...     eval_reward = evaluate(model)
        """
        with self.weights("ema"):
            yield

    # ------------------------------------------------------------------------------------------ checkpointing
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output, or a state of the older format (``ema``, ``init``, ``num_resets``,
        ``mode``, ``reset_every``). The saved mode, decay and period are adopted; a callable ``schedule`` cannot
        be saved: pass the same one again. Names and shapes must match the covered tensors; a refused state changes
        nothing."""
        if "copies" not in state and set(state) & {"ema", "init", "num_resets", "mode", "reset_every"}:
            state = _from_legacy(state)
        self._check_state(state)
        mode = state.get("name", self.mode)
        if mode not in MODES:
            raise ValueError(f"state['name']: expected one of {MODES}, got {mode!r}")
        period = state.get("trigger")
        reset_every = period.get("n") if isinstance(period, Mapping) else None
        _check_reset_every(reset_every, "state['reset_every']")
        if self.schedule is None and reset_every is None and mode != "none":
            raise ValueError("state['reset_every']: the state was saved with a callable schedule; pass the same "
                             "schedule when resuming")
        self._apply_state({**state, "trigger": None})
        self.name, self.pulls = mode, PULLS[mode]
        if self.schedule is None:
            self.trigger = Every(reset_every) if reset_every is not None else None

    def __repr__(self) -> str:
        numel = sum(t.numel() for t in self.ema)
        when = f"reset_every={self.reset_every}" if self.schedule is None else "schedule=<callable>"
        return (f"ElasticReset(mode={self.mode!r}, decay={self.decay}, {when}, tensors={len(self.ema)}, "
                f"numel={numel}, device={self.device}, step={self.num_steps}, resets={self.num_resets})")


def _from_legacy(state: Mapping[str, Any]) -> dict[str, Any]:
    """The older format, checked as before, in the anchor's."""
    missing = set(_LEGACY_KEYS) - set(state)
    if missing:
        raise ValueError(f"state: missing keys {sorted(missing)}")
    if state["mode"] not in MODES:
        raise ValueError(f"state['mode']: expected one of {MODES}, got {state['mode']!r}")
    check_decay(state["decay"], "state['decay']")
    _check_reset_every(state["reset_every"], "state['reset_every']")
    return {"names": state["names"], "copies": {"ema": state["ema"], "init": state["init"]},
            "num_steps": state["num_steps"], "num_pulls": state["num_resets"], "decay": state["decay"],
            "name": state["mode"], "trigger": None if state["reset_every"] is None else {"n": state["reset_every"]}}
