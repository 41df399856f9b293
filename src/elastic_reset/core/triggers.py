"""When an anchor pulls: every n steps, when the KL passes a budget, or when a metric stops improving.

A trigger is any object with ``__call__(step, metrics) -> str | None``: the cause of a pull at 1-based ``step``
given the metrics the caller logged at that step (an empty mapping if none), or None. ``keys`` names the metrics
it reads, so a caller can refuse a trigger on a metric its run never logs; ``notify(step)`` is called after each
pull it caused; ``state_dict`` / ``load_state_dict`` carry what it remembers across a resume. Write your own with
the same four members.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{key}: expected an integer >= 1, got {value!r}")
    return int(value)


def _finite(value: Any, key: str, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or (
            minimum is not None and value < minimum):
        raise ValueError(f"{key}: expected a finite number{'' if minimum is None else f' >= {minimum}'}, "
                         f"got {value!r}")
    return float(value)


class Every:
    """Every ``n`` steps (n, 2n, ...; never at step 0): the fixed period of the paper's Elastic Reset, TR-DPO's τ
    and ProRL's reference-reset interval."""

    keys: tuple[str, ...] = ()

    def __init__(self, n: int):
        self.n = _positive_int(n, "every")

    def __call__(self, step: int, metrics: Mapping[str, float]) -> str | None:
        return f"every {self.n} steps" if step > 0 and step % self.n == 0 else None

    def notify(self, step: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.n = _positive_int(state["n"], "state['n']")


class KLBudget:
    """When the logged KL (``key``, e.g. the KL to the initial model) exceeds ``budget``, at most once every
    ``cooldown`` steps (a pull may not bring the KL back under the budget at once)."""

    def __init__(self, budget: float, key: str = "kl", cooldown: int = 1):
        self.budget = _finite(budget, "budget", minimum=0.0)
        self.key = key
        self.keys = (key,)
        self.cooldown = _positive_int(cooldown, "cooldown")
        self.last = -math.inf

    def __call__(self, step: int, metrics: Mapping[str, float]) -> str | None:
        value = metrics.get(self.key)
        if value is None or step - self.last < self.cooldown or not value > self.budget:
            return None
        return f"{self.key} {value:.4g} > budget {self.budget:g}"

    def notify(self, step: int) -> None:
        self.last = step

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last = float(state["last"])


class Plateau:
    """When ``key`` (e.g. ``eval/reward``) has not improved on its best by more than ``min_delta`` for ``patience``
    consecutive readings (steps that log it; others are ignored). The count starts again after each pull."""

    def __init__(self, key: str, patience: int, min_delta: float = 0.0, higher_is_better: bool = True):
        self.key = key
        self.keys = (key,)
        self.patience = _positive_int(patience, "patience")
        self.min_delta = _finite(min_delta, "min_delta", minimum=0.0)
        self.sign = 1.0 if higher_is_better else -1.0
        self.best, self.stale = -math.inf, 0

    def __call__(self, step: int, metrics: Mapping[str, float]) -> str | None:
        value = metrics.get(self.key)
        if value is None:
            return None
        if self.sign * value > self.best + self.min_delta:
            self.best, self.stale = self.sign * value, 0
            return None
        self.stale += 1
        if self.stale < self.patience:
            return None
        return f"{self.key} not improved for {self.stale} readings (best {self.sign * self.best:.4g})"

    def notify(self, step: int) -> None:
        self.best, self.stale = -math.inf, 0

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "stale": self.stale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best, self.stale = float(state["best"]), int(state["stale"])
