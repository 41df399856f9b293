"""What a task gives the RL engine. A task is data plus callables; the engine never imports a concrete task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

RewardFn = Callable[[list[str], list[str]], Sequence[float]]
"""``reward_fn(prompts, completions) -> one float per completion`` (TRL's reward-function convention)."""


@dataclass
class Task:
    name: str
    """Registry name."""
    train_prompts: list[str]
    """Prompts the policy is trained on (cycled through in a seeded order)."""
    eval_prompts: list[str]
    """Validation prompts (the first ``eval.num_prompts`` are used at every evaluation, so points are comparable)."""
    reward_fn: RewardFn
    """The reward the policy maximises."""
    reference_texts: list[str]
    """Held-out human-written text: drift is the policy's perplexity on it."""
    pretrain_texts: list[str] = field(default_factory=list)
    """Text for the multitask / S2P supervised loss (must not be the held-out reference text)."""
    metrics_fn: Callable[[list[str], list[str]], dict[str, float]] | None = None
    """Extra task metrics on validation samples, ``(prompts, completions) -> {name: value}``."""

    def __post_init__(self) -> None:
        for key in ("train_prompts", "eval_prompts", "reference_texts"):
            items = getattr(self, key)
            if not items:
                raise ValueError(f"task {self.name!r}: {key} is empty")
            bad = [i for i, t in enumerate(items) if not isinstance(t, str) or not t.strip()]
            if bad:
                raise ValueError(f"task {self.name!r}: {key}[{bad[0]}] is empty or not a string "
                                 f"({len(bad)} such item(s))")


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    """Decorator: ``@register_task("imdb")`` on a factory ``(data_dir=None, **options) -> Task``."""
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory
    return wrap


def get_task(name: str, data_dir: str | None = None, **options: Any) -> Task:
    import elastic_reset.tasks.imdb  # noqa: F401  (each module registers its tasks)
    import elastic_reset.tasks.toy  # noqa: F401
    import elastic_reset.tasks.vader  # noqa: F401

    if name not in _REGISTRY:
        raise ValueError(f"task.name: unknown task {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    try:
        return _REGISTRY[name](data_dir=data_dir, **options)
    except TypeError as err:
        raise ValueError(f"task.options: {err}") from None
