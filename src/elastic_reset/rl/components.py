"""What a run adds to whatever its method is: Selective Rehearsal and a reward that learns, as components.

A run holds one drift-control method and a list of components. Each component is attached through the hooks methods
use (:class:`~elastic_reset.rl.methods.LoopHooks`), called after the method's; the trainer names none of them. A
component's state is saved under its ``key`` in every checkpoint, and it may reserve training prompts for itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from elastic_reset.errors import ConfigError
from elastic_reset.rewards.learned import LearnedReward
from elastic_reset.rl.methods import LoopHooks
from elastic_reset.rl.rehearsal import FILE as REHEARSAL_FILE
from elastic_reset.rl.rehearsal import Rehearsal, choose_examples

if TYPE_CHECKING:
    from elastic_reset.rl.config import TrainConfig
    from elastic_reset.rl.distributed import DataParallel
    from elastic_reset.rl.policy import Policy
    from elastic_reset.rl.reward import CheckedReward
    from elastic_reset.tasks import Task


class Component(LoopHooks):
    """A piece that combines with any method."""

    key: ClassVar[str]
    """Its entry in a checkpoint."""
    reserved_prompts: frozenset[str] = frozenset()
    """Training prompts it keeps for itself: they leave RL training."""

    def save(self, out_dir: Path) -> None:
        """Write what the run directory keeps of it once set up (read back on resume)."""


class SelectiveRehearsal(Component):
    """Paper 2's rehearsal term (eq. 9) in every optimizer step: one batch of the set a step, the same batch in each
    forward of that step (gradient regularisation's second forward included)."""

    key = "rehearsal"

    def __init__(self, rehearsal: Rehearsal, policy: Policy, pad_token_id: int, exclude: bool):
        self.rehearsal, self.policy, self.pad_token_id = rehearsal, policy, pad_token_id
        self.reserved_prompts = frozenset(rehearsal.prompts) if exclude else frozenset()
        self._batch = None  # this optimizer step's, drawn at its first forward

    def extra_loss(self) -> tuple[torch.Tensor, dict[str, float]]:
        if self._batch is None:
            self._batch = self.rehearsal.next_batch(self.pad_token_id).to(self.policy.device)
        return self.rehearsal.loss(lambda b: self.policy.score(b, masked=False).logprobs, self._batch)

    def on_optimizer_step(self) -> None:
        self._batch = None

    def save(self, out_dir: Path) -> None:
        self.rehearsal.save(out_dir / REHEARSAL_FILE)

    def state_dict(self) -> dict[str, Any]:
        return self.rehearsal.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rehearsal.load_state_dict(state)


class RewardLearning(Component):
    """A task's reward that learns (the Translation Game's listener, paper §4) takes one update on each iteration's
    kept samples, after the policy's."""

    key = "reward_model"

    def __init__(self, reward: LearnedReward):
        self.reward = reward

    def on_batch(self, prompts: list[str], completions: list[str]) -> dict[str, float]:
        return {f"reward_model/{k}": float(v) for k, v in self.reward.learn(prompts, completions).items()}

    def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            raise ValueError("checkpoint: it holds no state of the task's learning reward")
        self.reward.load_state_dict(state)


def build_components(config: TrainConfig, task: Task, policy: Policy, reward: CheckedReward, dp: DataParallel,
                     out_dir: Path, pad_token_id: int) -> list[Component]:
    """The run's components, from its config and task. Selective Rehearsal's set is read back from ``out_dir``
    when it is there (a resumed run), else selected from the policy's answers: call this while the policy still
    holds its initial weights."""
    components: list[Component] = []
    if isinstance(task.reward_fn, LearnedReward):
        if dp.enabled:
            raise ConfigError(f"task.name: task {task.name!r} has a reward that learns (its listener), which "
                              "data-parallel training does not keep in sync across processes yet; run it in one "
                              "process")
        components.append(RewardLearning(task.reward_fn.to(policy.device)))  # before its first score
    settings = config.rehearsal_settings()
    if settings is not None:
        if dp.enabled or policy.model.config.is_encoder_decoder:
            raise ConfigError("rehearsal: Selective Rehearsal runs in one process, on a decoder-only policy")
        path = out_dir / REHEARSAL_FILE
        examples = (Rehearsal.read(path) if path.is_file()
                    else choose_examples(policy, reward, task.train_prompts, settings, config.seed))
        rehearsal = SelectiveRehearsal(Rehearsal(examples, settings.coef, settings.batch, seed=config.seed), policy,
                                       pad_token_id, settings.exclude)
        left = sum(p not in rehearsal.reserved_prompts for p in task.train_prompts)
        if left < config.algo.prompts_per_step:
            raise ConfigError(f"rehearsal.exclude: the {len(rehearsal.reserved_prompts)} prompts reserved for "
                              f"rehearsal leave {left} training prompts, fewer than algo.prompts_per_step")
        components.append(rehearsal)
    return components
