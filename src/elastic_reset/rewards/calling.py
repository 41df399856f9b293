"""Calling a reward function someone else wrote: one number (or None) per completion, or a one-line error."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from elastic_reset.errors import ElasticResetError, RewardError


def call_reward(call: Callable[[], Any], expected: int, *, who: str, raised_by: str) -> list[float | None]:
    """``call()`` (a reward applied to its arguments) as floats, ``expected`` of them, one per completion (None
    kept: TRL's "no reward for this one").

    An exception raised inside the reward propagates with its own type and traceback, with the note
    ``(raised by RAISED_BY)``; a result that is not one number per completion is a :class:`RewardError` that
    starts with ``who``."""
    try:
        out = call()
    except Exception as err:  # the reward's own bug: keep its type and traceback, say whose reward it was
        if not isinstance(err, ElasticResetError):
            err.add_note(f"(raised by {raised_by})")
        raise
    try:
        values = [None if v is None else float(v) for v in out]
    except (TypeError, ValueError) as err:
        raise RewardError(f"{who} did not return numbers: {err}") from None
    if len(values) != expected:
        raise RewardError(f"{who} returned {len(values)} values for {expected} completions")
    return values


def takes_keyword(fn: Callable, name: str | None = None) -> bool:
    """Whether ``fn`` takes ``**kwargs`` (TRL's reward convention) or, with ``name``, a parameter so named; False
    where it has no signature to read."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return (name is not None and name in params) or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                                        for p in params.values())
