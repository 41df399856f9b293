"""The task's reward, checked: one finite number per completion, or the run stops (or drops the sample)."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import TrainerState

from elastic_reset.errors import RewardError
from elastic_reset.lm.rollout import Rollout
from elastic_reset.rewards.calling import call_reward, takes_keyword


@dataclass
class RewardResult:
    """All one call of a :class:`CheckedReward` computed."""

    scores: torch.Tensor
    """One float per completion (0 where dropped), on the reward's device."""
    keep: torch.Tensor
    """Which completions have a valid reward (a bool tensor)."""
    components: dict[str, list[float | None]] = field(default_factory=dict)
    """Each part's values (None: no reward), where the reward exposes them (TRL's ``rewards/<name>``)."""
    logged: dict[str, list[float]] = field(default_factory=dict)
    """The values the reward gave ``log_metric``, by name."""
    extra: dict[str, list[Any]] = field(default_factory=dict)
    """The columns the reward gave ``log_extra``, one value per completion."""


class CheckedReward:
    """``reward_fn(prompts, completions)`` of task ``task_name``, returning scores as a float tensor on ``device``
    and which samples are kept. Non-numbers stop the run; NaN/inf (and None, TRL's "no reward") stop it under
    ``bad_reward: error`` and are dropped (score 0, kept False) under ``drop``. ``what`` names it in errors (the
    task's ``judge_fn`` is checked the same way).

    A call returns a :class:`RewardResult`: the scores, which are kept and, for the caller to log, what else the
    reward gave. A reward made of several (the ``prompts`` task's ``TRLReward``) may expose ``components``: each
    part's values of its latest call by name, logged as TRL logs ``rewards/<name>``.

    A reward that takes ``**kwargs`` follows TRL's convention and is called as ``GRPOTrainer`` calls one:
    ``reward_fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_metric=...,
    log_extra=...)``: the completions' token ids (from the ``rollout`` the caller passes); a
    ``transformers.TrainerState`` whose ``global_step`` is the call's ``step`` (iterations done) and ``max_steps``
    the run's; ``log_metric(name, value)`` (the result's ``logged``); ``log_extra(column, values)``, one value per
    completion (its ``extra``). Any other reward is called positionally. An exception raised inside the reward
    propagates as it is, with its own traceback (and a note naming the task)."""

    def __init__(self, reward_fn: Callable[[Sequence[str], Sequence[str]], Sequence[float]], task_name: str,
                 bad_reward: Literal["error", "drop"], device: torch.device, what: str = "reward function",
                 max_steps: int = 0):
        self.reward_fn = reward_fn
        self.what = what
        self.task_name = task_name
        self.bad_reward = bad_reward
        self.device = device
        self.keywords = takes_keyword(reward_fn)
        self._state = TrainerState(max_steps=max_steps)  # what a TRL reward gets as trainer_state

    def __call__(self, prompts: list[str], completions: list[str], rollout: Rollout | None = None,
                 step: int = 0) -> RewardResult:
        """Score ``completions`` of ``prompts``; ``step``: the iterations done (a TRL reward's
        ``trainer_state.global_step``)."""
        who = f"{self.what} of task {self.task_name!r}"
        result = RewardResult(torch.empty(0), torch.empty(0))
        if self.keywords:  # the token ids only for a reward called TRL's way: no per-step copy for the others
            self._state.global_step = step
            ids = {"completion_ids": rollout.response_id_lists()} if rollout is not None else {}
            trl = dict(trainer_state=self._state, log_metric=functools.partial(_log_metric, result.logged),
                       log_extra=functools.partial(_log_extra, result.extra, len(completions)))
            call = functools.partial(self.reward_fn, prompts=prompts, completions=completions, **ids, **trl)
        else:
            call = functools.partial(self.reward_fn, prompts, completions)
        values = [math.nan if v is None else v for v in
                  call_reward(call, len(completions), who=who, raised_by=f"the {who}")]
        result.components = dict(getattr(self.reward_fn, "components", None) or {})
        scores = torch.tensor(values, dtype=torch.float32, device=self.device)
        keep = torch.isfinite(scores)
        if not keep.all():
            bad = (~keep).nonzero().flatten().tolist()
            if self.bad_reward == "error":
                raise RewardError(f"{who} returned non-finite values "
                                  f"{[values[i] for i in bad[:3]]} (samples {bad[:3]}); set bad_reward: drop to "
                                  "drop such samples instead")
            scores = torch.where(keep, scores, torch.zeros_like(scores))
        result.scores, result.keep = scores, keep
        return result


def _log_metric(logged: dict[str, list[float]], name: str, value: float) -> None:
    try:
        logged.setdefault(str(name), []).append(float(value))
    except (TypeError, ValueError):
        raise RewardError(f"log_metric({name!r}, ...): expected a number, got {value!r}") from None


def _log_extra(extra: dict[str, list[Any]], expected: int, column: str, values: Sequence[Any]) -> None:
    values = list(values)
    if len(values) != expected:
        raise RewardError(f"log_extra({column!r}, ...): expected one value per completion ({expected}), "
                          f"got {len(values)}")
    if str(column) in ROW_KEYS or str(column).startswith("rewards/"):
        raise RewardError(f"log_extra({column!r}, ...): a column of the completions log already; choose "
                          "another name")
    if str(column) in extra:
        raise RewardError(f"log_extra({column!r}, ...): that column was already logged for these completions")
    extra[str(column)] = values


ROW_KEYS = ("step", "prompt", "completion", "reward")
"""The columns every row of ``completions.jsonl`` has (then ``rewards/<name>`` and the rewards' own columns)."""


def completion_rows(step: int, prompts: list[str], completions: list[str], rewards: list[float | None],
                    components: dict[str, list[float | None]], extra: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """One row per sample for ``completions.jsonl`` (TRL's completions table): ``rewards`` None where dropped;
    :attr:`CheckedReward.components` and :attr:`CheckedReward.extra` of the call that scored them. Values a reward
    logged that JSON cannot hold are written as numbers where they have ``item()`` (NumPy, torch), else as text."""
    def plain(value: Any) -> Any:
        try:
            json.dumps(value)
            return value
        except (TypeError, ValueError):
            pass
        try:
            return value.item()
        except (AttributeError, TypeError, ValueError, RuntimeError):  # no item(), or not a single number
            return str(value)

    return [{"step": step, "prompt": prompt, "completion": completion, "reward": reward,
             **{f"rewards/{name}": values[i] for name, values in components.items()},
             **{column: plain(values[i]) for column, values in extra.items()}}
            for i, (prompt, completion, reward) in enumerate(zip(prompts, completions, rewards))]


def add_logged(record: dict[str, Any], means: dict[str, float], prefix: str = "") -> None:
    """Put what rewards gave ``log_metric`` (their means) into ``record`` as ``PREFIX + name``, as TRL logs them;
    a name the record already has is refused, not overwritten."""
    for name, value in means.items():
        if prefix + name in record:
            raise RewardError(f"log_metric({name!r}, ...): {prefix + name!r} is a metric the trainer logs itself; "
                              "choose another name")
        record[prefix + name] = value


def component_means(parts: list[dict[str, list[float | None]]]) -> dict[str, float]:
    """Each component's mean over every sample of ``parts`` (calls' :attr:`CheckedReward.components`) where it gave
    a finite value: ``{name: mean}``; a component with none is left out."""
    out = {}
    for name in dict.fromkeys(name for part in parts for name in part):
        values = [v for part in parts for v in part.get(name, []) if v is not None and math.isfinite(v)]
        if values:
            out[name] = sum(values) / len(values)
    return out
