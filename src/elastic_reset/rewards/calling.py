"""Calling a reward function someone else wrote: one number (or None) per completion, or a one-line error."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from elastic_reset.errors import ElasticResetError, RewardError


def call_reward(call: Callable[[], Any], expected: int, *, who: str, raised_by: str) -> list[float | None]:
    """``call()`` (a reward applied to its arguments) as floats, ``expected`` of them, one per completion (None
    kept: TRL's "no reward for this one"). See :func:`call_rewards`."""
    return call_rewards([(call, who, raised_by)], expected)[0]


def call_rewards(calls: list[tuple[Callable[[], Any], str, str]], expected: int) -> list[list[float | None]]:
    """Each ``(call, who, raised_by)``'s values, as :func:`call_reward`: the synchronous rewards one after another,
    then the ``async`` ones' coroutines together (TRL runs them concurrently).

    An exception raised inside a reward propagates with its own type and traceback, with the note
    ``(raised by RAISED_BY)``; a result that is not one number per completion is a :class:`RewardError` that
    starts with ``who``."""
    results: list[Any] = [None] * len(calls)
    pending: dict[int, Awaitable[Any]] = {}
    for i, (call, _, raised_by) in enumerate(calls):
        with _noted(raised_by):
            out = call()
        if inspect.isawaitable(out):
            pending[i] = _awaited_noted(out, raised_by)
        else:
            results[i] = out
    for i, out in zip(pending, run_together(list(pending.values()))):
        results[i] = out
    return [_as_rewards(out, expected, who) for out, (_, who, _) in zip(results, calls)]


@contextlib.contextmanager
def _noted(raised_by: str) -> Iterator[None]:
    """A reward's own bug keeps its type and traceback, with a note saying whose reward it was."""
    try:
        yield
    except Exception as err:
        if not isinstance(err, ElasticResetError):
            err.add_note(f"(raised by {raised_by})")
        raise


async def _awaited_noted(awaitable: Awaitable[Any], raised_by: str) -> Any:
    with _noted(raised_by):
        return await awaitable


def _as_rewards(out: Any, expected: int, who: str) -> list[float | None]:
    try:
        values = [None if v is None else float(v) for v in out]
    except (TypeError, ValueError) as err:
        raise RewardError(f"{who} did not return numbers: {err}") from None
    if len(values) != expected:
        raise RewardError(f"{who} returned {len(values)} values for {expected} completions")
    return values


def run_together(awaitables: list[Awaitable[Any]]) -> list[Any]:
    """The results of ``awaitables``, run concurrently; in a thread of its own when this one already runs an event
    loop (a notebook's), where ``asyncio.run`` is refused."""
    if not awaitables:
        return []

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*awaitables))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def takes_keyword(fn: Callable, name: str | None = None) -> bool:
    """Whether ``fn`` takes ``**kwargs`` (TRL's reward convention) or, with ``name``, a parameter so named; False
    where it has no signature to read."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return (name is not None and name in params) or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                                        for p in params.values())
