"""Pulling a drifting policy, its KL reference or its EMA back toward an anchor: Elastic Reset and its relatives
under one API.

Besides the policy's own tensors θ, an :class:`Anchor` keeps fp32 copies, on a device of the caller's choice, as
:class:`~elastic_reset.core.ElasticReset` does (pinned host memory for a GPU model, fused ``torch._foreach_*``
updates, FSDP2 shards followed rank by rank):

- ``init``: θ0, the weights at construction;
- ``ema``: θ̄ ← (1 − η)·θ + η·θ̄ after every step (kept when ``decay`` is given);
- ``reference``: a copy the caller uses as the KL reference (:meth:`Anchor.weights`), starting at θ0.

A :class:`Pull` ``(target, source, weight)`` sets target ← (1 − w)·target + w·source (w = 1: a copy). When the
trigger fires (:mod:`elastic_reset.core.triggers`: every n steps, a KL budget, a plateau, or your own), the anchor
applies its pulls in order and, if asked, drops the optimizer's state of the policy's tensors. The published
methods are presets (:data:`PRESETS`, :meth:`Anchor.preset`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from elastic_reset.core.covered import CoveredTensors, Exclude, ModelOrParams, check_decay, local
from elastic_reset.core.triggers import Every

COPIES = ("init", "ema", "reference")
ENDS = ("policy", *COPIES)


@dataclass(frozen=True)
class Pull:
    """target ← (1 − weight)·target + weight·source; ``target`` and ``source`` are ``policy`` or a copy."""

    target: str
    source: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        for key in ("target", "source"):
            if getattr(self, key) not in ENDS:
                raise ValueError(f"pull {key}: expected one of {ENDS}, got {getattr(self, key)!r}")
        if self.target == self.source:
            raise ValueError(f"pull: target and source are both {self.target!r}")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0.0 <= w <= 1.0:
            raise ValueError(f"pull weight (α, η): expected a number in [0, 1], got {w!r}")

    def __str__(self) -> str:
        return f"{self.target} <- {self.source}" + ("" if self.weight == 1.0 else f" ({self.weight:g})")


@dataclass(frozen=True)
class AnchorEvent:
    """What a pull did, for the caller's logs (an Elastic Reset's reset is one)."""

    step: int
    """:attr:`Anchor.num_steps` when it happened (1-based)."""
    index: int
    """1 for the run's first pull, 2 for the second, ..."""
    distance: float
    """How far the pull moved: ‖target − source‖₂ of the first pull just before it (Elastic Reset: ‖θ − θ̄‖)."""
    cause: str = ""
    """Why: the trigger's words, or ``manual``."""
    pulls: tuple[str, ...] = ()
    mode: str = ""
    """The anchor's name: a preset's (``elastic_reset``, ``ref_sync``, ...) or Elastic Reset's mode (``elastic``,
    ``ema``, ``init``)."""

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> AnchorEvent:
        """An event as ``dataclasses.asdict`` saved it (older files: an Elastic Reset's without cause and pulls, an
        anchor's without mode)."""
        return cls(**{**saved, "pulls": tuple(saved.get("pulls", ()))})


class Anchor(CoveredTensors):
    """Copies of a set of trainable tensors and the pulls between them (see the module's docstring).

    Args:
        model_or_params: a module (its parameters with ``requires_grad=True``; a peft LoRA model: the adapters),
            or tensors, or ``(name, tensor)`` pairs.
        pulls: what a trigger does, in order; may be empty for an anchor that only keeps an EMA (``ema_anchor``).
        trigger: when (``every=n`` is shorthand for :class:`~elastic_reset.core.triggers.Every`); needed with
            pulls.
        decay: η of the EMA, in (0, 1); needed when a pull reads or writes ``ema``.
        reset_optimizer: drop ``optimizer``'s state of the covered tensors after each pull (ProRL).
        kl_reference: which copy is the KL reference (``init``, ``ema`` or ``reference``); default
            ``reference`` when a pull writes it, else ``init``.
        reference: live tensors that *are* the KL reference, one per covered tensor, same shapes (a TRL reference
            adapter, a reference model's parameters): pulls then write them in place, on their own device and
            dtype, instead of a private copy.
    """

    def __init__(self, model_or_params: ModelOrParams, pulls: Sequence[Pull] = (), trigger=None, *,
                 every: int | None = None, decay: float | None = None, reset_optimizer: bool = False,
                 optimizer: torch.optim.Optimizer | None = None, kl_reference: str | None = None,
                 device: str | torch.device = "cpu", exclude: Exclude = None,
                 dtype: torch.dtype = torch.float32, name: str = "custom",
                 reference: Sequence[torch.Tensor] | None = None):
        self.pulls = tuple(pulls)
        if every is not None:
            if trigger is not None:
                raise ValueError("every: give either every or trigger, not both")
            trigger = Every(every)
        if self.pulls and trigger is None:
            raise ValueError("trigger: pulls need a trigger (or every=n)")
        if trigger is not None and not callable(trigger):
            raise ValueError(f"trigger: expected a callable (step, metrics) -> cause or None, got {trigger!r}")
        used = {end for p in self.pulls for end in (p.target, p.source)} - {"policy"}
        if decay is not None:
            check_decay(decay, "decay")
            used.add("ema")
        elif "ema" in used:
            raise ValueError("decay: a pull reads or writes the EMA, which needs decay")
        if kl_reference is None:
            kl_reference = "reference" if any(p.target == "reference" for p in self.pulls) else "init"
        if kl_reference not in COPIES:
            raise ValueError(f"kl_reference: expected one of {COPIES}, got {kl_reference!r}")
        if kl_reference == "ema" and decay is None:
            raise ValueError("kl_reference: the EMA as the KL reference needs decay")
        if reset_optimizer and optimizer is None:
            raise ValueError("optimizer: reset_optimizer=True needs the optimizer")
        used |= {"init", kl_reference}

        super().__init__(model_or_params, exclude, device, dtype)
        if reset_optimizer and self.zero:
            raise ValueError("reset_optimizer: DeepSpeed ZeRO keeps the optimizer's state in flat partitions, not by "
                             "parameter, so the reset weights' state cannot be dropped alone")
        self.name = name
        self.trigger, self.decay, self.kl_reference = trigger, decay, kl_reference
        self.optimizer, self.reset_optimizer = optimizer, reset_optimizer
        self.num_steps = self.num_pulls = 0
        if reference is not None:
            used.discard("reference")  # the caller's tensors, set below
        self.copies: dict[str, list[torch.Tensor]] = {c: self._snapshot() for c in COPIES if c in used}
        self.external = reference is not None
        """Whether ``reference`` is the caller's live tensors rather than a copy of this anchor's."""
        if reference is not None:
            if any(hasattr(t, "ds_id") for t in reference):
                raise ValueError("reference: the reference model is partitioned by DeepSpeed ZeRO-3 (as TRL prepares "
                                 "it for inference), which this anchor cannot write in place; sync a reference under "
                                 "ZeRO-1/2")
            reference = [local(t).detach() for t in reference]
            shapes = [tuple(t.shape) for t in self._locals()]
            if [tuple(t.shape) for t in reference] != shapes:
                raise ValueError(f"reference: expected {len(shapes)} tensors shaped as the covered ones, got "
                                 f"{len(reference)} (shapes differ: {[tuple(t.shape) for t in reference][:3]} ...)")
            self.copies["reference"] = reference

    # ------------------------------------------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, model_or_params, **settings) -> Anchor:
        """A published method by name (:data:`PRESETS`); ``settings`` are its own (``alpha``, ``eta``) and
        :class:`Anchor`'s (``every``, ``trigger``, ``decay``, ``optimizer``, ``device``, ...)."""
        if name not in PRESETS:
            raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
        return PRESETS[name](model_or_params, **settings)

    # ------------------------------------------------------------------------------------------------ tensors
    def _tensors(self, end: str) -> list[torch.Tensor]:
        """``end``'s tensors on the copies' device and dtype (an external reference converted)."""
        if end == "policy":
            return self._params_in_copy_space()
        if end == "reference" and self.external:
            return [t.to(self.device, self.dtype) for t in self.copies[end]]
        return self.copies[end]

    def copy(self, name: str) -> dict[str, torch.Tensor]:
        """A copy's tensors by parameter name (fp32, on :attr:`device`; this rank's shards under FSDP2)."""
        if name not in self.copies:
            raise ValueError(f"copy: this anchor keeps {sorted(self.copies)}, not {name!r}")
        return dict(zip(self.names, self.copies[name]))

    @contextmanager
    def weights(self, name: str) -> Iterator[None]:
        """The model holds copy ``name`` inside the block (e.g. the KL reference for its forward); the policy's own
        weights are restored exactly after."""
        with self._swapped_in(list(self.copy(name).values())):
            yield

    @torch.no_grad()
    def distance(self, a: str = "policy", b: str = "init") -> float:
        """‖a − b‖₂ over the covered tensors (whole parameters under FSDP2: a collective every rank calls)."""
        return self._distance(self._tensors(a), self._tensors(b))

    # ------------------------------------------------------------------------------------------------ updates
    @torch.no_grad()
    def update(self) -> None:
        """θ̄ ← (1 − η)·θ + η·θ̄, if the anchor keeps an EMA. Does not count a step."""
        if "ema" in self.copies:
            torch._foreach_lerp_(self.copies["ema"], self._params_in_copy_space(), 1.0 - self.decay)

    def step(self, metrics: Mapping[str, float] | None = None, update: bool = True) -> AnchorEvent | None:
        """Count one step (after an optimizer step, or whatever unit the trigger counts): update the EMA (unless
        ``update=False``), ask the trigger with this step's ``metrics``, pull if it fires. Returns the event."""
        if update:
            self.update()
        self.num_steps += 1
        cause = self.trigger(self.num_steps, metrics or {}) if self.trigger is not None and self.pulls else None
        if cause is None:
            return None
        event = self.pull(cause)
        notify = getattr(self.trigger, "notify", None)
        if notify is not None:
            notify(self.num_steps)
        return event

    @torch.no_grad()
    def pull(self, cause: str = "manual") -> AnchorEvent:
        """Apply the pulls now, whatever the trigger says."""
        if not self.pulls:
            raise RuntimeError(f"anchor {self.name!r} has no pulls")
        distance = self._pull_distance()
        for p in self.pulls:
            source = self._tensors(p.source)
            if p.source == "policy":
                source = [t.clone() for t in source]  # a buffer or the live weights: frozen for this pull
            target = self._locals() if p.target == "policy" else self.copies[p.target]
            if p.target == "policy" or (p.target == "reference" and self.external):  # on the target's own device
                source = [s.to(t.device, t.dtype, non_blocking=self._pinned) for s, t in zip(source, target)]
                self._wait_for_copies()
            if p.weight == 1.0:
                torch._foreach_copy_(target, source)
            else:
                torch._foreach_lerp_(target, source, p.weight)
            if p.target == "policy":
                self._written(target)
        if self.reset_optimizer:
            for t in self.params:
                self.optimizer.state.pop(t, None)
        self.num_pulls += 1
        return AnchorEvent(self.num_steps, self.num_pulls, distance, cause, tuple(str(p) for p in self.pulls),
                           self.name)

    def _pull_distance(self) -> float:
        """The distance an event reports, measured just before the pull."""
        return self.distance(self.pulls[0].target, self.pulls[0].source)

    # ---------------------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The copies, the counters, the decay and the trigger's memory: enough to continue bit for bit. Tensors by
        reference (as ``nn.Module.state_dict``); ``torch.save`` copies them. Sharded: this rank's shards."""
        trigger_state = getattr(self.trigger, "state_dict", None)
        return {"names": list(self.names), "copies": {k: list(v) for k, v in self.copies.items()},
                "num_steps": self.num_steps, "num_pulls": self.num_pulls,
                "trigger": trigger_state() if trigger_state is not None else None,
                "decay": self.decay, "name": self.name}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or an older one without ``decay`` and ``name``); a refused state
        changes nothing."""
        self._check_state(state)
        if state.get("name", self.name) != self.name:
            raise ValueError(f"state['name']: saved by anchor {state['name']!r}, this is {self.name!r}")
        self._apply_state(state)

    def _check_state(self, state: Mapping[str, Any]) -> None:
        missing = {"names", "copies", "num_steps", "num_pulls"} - set(state)
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        if list(state["names"]) != self.names:
            extra = sorted(set(state["names"]) - set(self.names))[:5]
            absent = sorted(set(self.names) - set(state["names"]))[:5]
            raise ValueError(f"state['names']: the saved parameters do not match the covered ones (saved only: "
                             f"{extra}, covered only: {absent}, or a different order)")
        if set(state["copies"]) != set(self.copies):
            raise ValueError(f"state['copies']: saved {sorted(state['copies'])}, this anchor keeps "
                             f"{sorted(self.copies)}")
        for key, tensors in state["copies"].items():
            if len(tensors) != len(self.names):
                raise ValueError(f"state['copies'][{key!r}]: {len(tensors)} tensors, expected {len(self.names)}")
            for name, saved, mine in zip(self.names, tensors, self.copies[key]):
                if tuple(saved.shape) != tuple(mine.shape):
                    raise ValueError(f"state['copies'][{key!r}]: shape of {name!r} is {tuple(saved.shape)}, "
                                     f"expected {tuple(mine.shape)}")
        if state.get("decay") is not None:
            check_decay(state["decay"], "state['decay']")

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            for key, tensors in state["copies"].items():
                torch._foreach_copy_(self.copies[key], [t.to(m.device, m.dtype) for t, m in zip(tensors,
                                                                                            self.copies[key])])
        self.num_steps, self.num_pulls = int(state["num_steps"]), int(state["num_pulls"])
        if state.get("decay") is not None:
            self.decay = float(state["decay"])
        if state.get("trigger") is not None and hasattr(self.trigger, "load_state_dict"):
            self.trigger.load_state_dict(state["trigger"])

    def __repr__(self) -> str:
        return (f"Anchor({self.name!r}, pulls=[{', '.join(map(str, self.pulls))}], copies={sorted(self.copies)}, "
                f"kl_reference={self.kl_reference!r}, step={self.num_steps}, pulls_done={self.num_pulls})")


# -------------------------------------------------------------------------------------------------- presets
def elastic_reset(model_or_params, decay: float = 0.995, **kw) -> Anchor:
    """Elastic Reset (Noukhovitch et al. 2023, §3): every n steps θ ← θ̄, then θ̄ ← θ0."""
    return Anchor(model_or_params, [Pull("policy", "ema"), Pull("ema", "init")], decay=decay,
                  name="elastic_reset", **kw)


def reset_to_ema(model_or_params, decay: float = 0.995, **kw) -> Anchor:
    """Elastic Reset's ablation (Noukhovitch et al. 2023, §6.1): θ ← θ̄, the EMA never returns to θ0."""
    return Anchor(model_or_params, [Pull("policy", "ema")], decay=decay, name="reset_to_ema", **kw)


def reset_to_init(model_or_params, **kw) -> Anchor:
    """Elastic Reset's ablation (Noukhovitch et al. 2023, §6.1): θ ← θ0."""
    return Anchor(model_or_params, [Pull("policy", "init")], name="reset_to_init", **kw)


def ref_sync(model_or_params, alpha: float = 0.6, **kw) -> Anchor:
    """TR-DPO's reference update (Gorbatovski et al. 2024, arXiv 2404.09656, §3): every τ steps ref ← α·θ +
    (1 − α)·ref (soft; α = 1 is their hard update). TRL's ``SyncRefModelCallback``: α 0.6, τ 512."""
    return Anchor(model_or_params, [Pull("reference", "policy", alpha)], name="ref_sync", **kw)


def ref_reset(model_or_params, **kw) -> Anchor:
    """ProRL's reference reset (Liu et al. 2025, arXiv 2505.24864, §2): ref ← θ and the optimizer's state
    re-initialised, every n steps."""
    return Anchor(model_or_params, [Pull("reference", "policy")], reset_optimizer=True, name="ref_reset", **kw)


def ema_anchor(model_or_params, decay: float = 0.99, **kw) -> Anchor:
    """The KL to an EMA of the policy (WARP, Ramé et al. 2024, arXiv 2406.16768, §3.1; EMA-PG, arXiv 2602.04417):
    no pulls; the EMA is the KL reference."""
    return Anchor(model_or_params, [], decay=decay, kl_reference="ema", name="ema_anchor", **kw)


def liti(model_or_params, eta: float, **kw) -> Anchor:
    """WARP's interpolation towards the initialisation (Ramé et al. 2024, §3.3, LITI): θ0 ← (1 − η)·θ0 + η·θ, then
    θ ← θ0: the next round of RL starts from the moved anchor."""
    return Anchor(model_or_params, [Pull("init", "policy", eta), Pull("policy", "init")], name="liti", **kw)


PRESETS: dict[str, Callable[..., Anchor]] = {f.__name__: f for f in (
    elastic_reset, reset_to_ema, reset_to_init, ref_sync, ref_reset, ema_anchor, liti)}
"""The published methods, by name."""
