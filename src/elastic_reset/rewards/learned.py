"""A reward that learns while the policy trains (the Translation Game's listener), as the engine sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class LearnedReward(ABC):
    """A task's ``reward_fn`` that also trains on what the policy wrote.

    The engine scores a batch with ``reward(prompts, completions)``, updates the policy, then calls
    ``learn(prompts, completions)`` on the same batch, once per iteration, and logs what it returns. Its
    ``state_dict`` goes into every checkpoint, so a resumed run continues with the reward exactly where it was.
    Drift-control methods (resets, EMA) act on the policy only, never on this.
    """

    @abstractmethod
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One score per completion (no gradient)."""

    @abstractmethod
    def learn(self, prompts: list[str], completions: list[str]) -> dict[str, float]:
        """One update on this batch; returns statistics to log (keys without a prefix)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (weights, optimizer state)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""

    def to(self, device) -> LearnedReward:
        """Move whatever it computes with to ``device`` (the engine calls this with the policy's device before the
        first step). A reward that does not compute with tensors keeps this no-op."""
        return self
