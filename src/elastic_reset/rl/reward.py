"""The task's reward, checked: one finite number per completion, or the run stops (or drops the sample)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch

from elastic_reset.errors import RewardError
from elastic_reset.lm.rollout import Rollout
from elastic_reset.rewards.calling import call_reward, takes_keyword


class CheckedReward:
    """``reward_fn(prompts, completions)`` of task ``task_name``, returning scores as a float tensor on ``device``
    and which samples are kept. Non-numbers stop the run; NaN/inf (and None, TRL's "no reward") stop it under
    ``bad_reward: error`` and are dropped (score 0, kept False) under ``drop``. ``what`` names it in errors (the
    task's ``judge_fn`` is checked the same way).

    A reward made of several (the ``prompts`` task's ``TRLReward``) may expose ``components``: each part's values
    of its latest call by name; :attr:`components` then holds them for the caller to log, as TRL logs
    ``rewards/<name>``.

    A reward that takes ``**kwargs`` follows TRL's convention and is called ``reward_fn(prompts=...,
    completions=..., completion_ids=...)`` (the completions' token ids, from the ``rollout`` the caller passes, as
    TRL passes them); any other is called positionally. An exception raised inside the reward propagates as it is,
    with its own traceback (and a note naming the task)."""

    def __init__(self, reward_fn: Callable[[Sequence[str], Sequence[str]], Sequence[float]], task_name: str,
                 bad_reward: Literal["error", "drop"], device: torch.device, what: str = "reward function"):
        self.reward_fn = reward_fn
        self.what = what
        self.task_name = task_name
        self.bad_reward = bad_reward
        self.device = device
        self.keywords = takes_keyword(reward_fn)
        self.components: dict[str, list[float | None]] = {}
        """Each part's values of the latest call (None: no reward), where the reward exposes them."""

    def __call__(self, prompts: list[str], completions: list[str],
                 rollout: Rollout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        who = f"{self.what} of task {self.task_name!r}"
        # The token ids only for a reward called TRL's way: no per-step copy of them for the others.
        ids = {"completion_ids": rollout.response_id_lists()} if rollout is not None and self.keywords else {}
        call = ((lambda: self.reward_fn(prompts=prompts, completions=completions, **ids)) if self.keywords
                else (lambda: self.reward_fn(prompts, completions)))
        values = [math.nan if v is None else v for v in
                  call_reward(call, len(completions), who=who, raised_by=f"the {who}")]
        self.components = dict(getattr(self.reward_fn, "components", None) or {})
        scores = torch.tensor(values, dtype=torch.float32, device=self.device)
        keep = torch.isfinite(scores)
        if not keep.all():
            bad = (~keep).nonzero().flatten().tolist()
            if self.bad_reward == "error":
                raise RewardError(f"{who} returned non-finite values "
                                  f"{[values[i] for i in bad[:3]]} (samples {bad[:3]}); set bad_reward: drop to "
                                  "drop such samples instead")
            scores = torch.where(keep, scores, torch.zeros_like(scores))
        return scores, keep


def component_means(parts: list[dict[str, list[float | None]]]) -> dict[str, float]:
    """Each component's mean over every sample of ``parts`` (calls' :attr:`CheckedReward.components`) where it gave
    a finite value: ``{name: mean}``; a component with none is left out."""
    out = {}
    for name in dict.fromkeys(name for part in parts for name in part):
        values = [v for part in parts for v in part.get(name, []) if v is not None and math.isfinite(v)]
        if values:
            out[name] = sum(values) / len(values)
    return out
