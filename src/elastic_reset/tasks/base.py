"""What a task gives the RL engine. A task is data plus callables; the engine never imports a concrete task."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastic_reset.errors import ConfigError, DataFileError

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
                raise DataFileError(f"task {self.name!r}: {key} is empty")
            bad = [i for i, t in enumerate(items) if not isinstance(t, str) or not t.strip()]
            if bad:
                raise DataFileError(f"task {self.name!r}: {key}[{bad[0]}] is empty or not a string "
                                 f"({len(bad)} such item(s))")


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    """Decorator: ``@register_task("imdb")`` on a factory ``(data_dir=None, **options) -> Task``."""
    def wrap(factory):
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"task {name!r} is registered twice ({_REGISTRY[name].__module__}, {factory.__module__})")
        _REGISTRY[name] = factory
        return factory
    return wrap


def get_task(name: str, data_dir: str | None = None, **options: Any) -> Task:
    """Build the registered task ``name``. The tasks that ship with the package register themselves when
    :mod:`elastic_reset.tasks` is imported; a task of your own registers when its module is imported."""
    if name not in _REGISTRY:
        raise ConfigError(f"task.name: unknown task {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    factory = _REGISTRY[name]
    try:
        inspect.signature(factory).bind(data_dir=data_dir, **options)
    except TypeError as err:
        raise ConfigError(f"task.options: {err} (task {name!r})") from None
    return factory(data_dir=data_dir, **options)
