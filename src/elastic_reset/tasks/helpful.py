"""``helpful``: HH-RLHF dialogues (helpful-base) as prompts, a trained preference reward model as the reward, and
drift measured as perplexity on held-out human-chosen responses.

The pairs are split by prompt exactly as the reward model's training split them (``split_seed``), so the RL
prompts are the reward model's *training* prompts, evaluation uses its validation prompts, and the reference text
is the chosen responses of its test prompts: nothing the policy is evaluated on was seen by the reward model."""

from __future__ import annotations

from pathlib import Path

from elastic_reset.data.preferences import load_hh_rlhf, split_by_prompt
from elastic_reset.errors import ConfigError
from elastic_reset.reward_models.reward import PreferenceModelReward
from elastic_reset.tasks.base import Task, register_task


@register_task("helpful")
def helpful_task(data_dir: str | None = None, reward_model: str | None = None, split_seed: int = 0,
                 categories: tuple[str, ...] | list[str] = ("helpful",), reward_batch_size: int = 16) -> Task:
    """Options: ``reward_model`` (required: a folder from ``elastic-reset reward-model train``), ``split_seed``
    (the reward model's), ``categories`` (HH-RLHF subsets for the prompts, default helpful only)."""
    if data_dir is None:
        raise ConfigError("task.data_dir: the helpful task reads HH-RLHF from <data_dir>/hh-rlhf "
                          "(e.g. ../shared/data)")
    if reward_model is None:
        raise ConfigError("task.options.reward_model: a reward model folder is required; train one with "
                          "`elastic-reset reward-model train --data hh-rlhf --data-dir ../shared/data`")
    if not (Path(reward_model) / "reward_model.json").is_file():
        raise FileNotFoundError(f"task.options.reward_model: no reward model at {reward_model}")
    parts = split_by_prompt(load_hh_rlhf(data_dir, tuple(categories)), seed=split_seed)
    return Task(
        name="helpful",
        train_prompts=[p.prompt for p in parts["train"]],
        eval_prompts=[p.prompt for p in parts["val"]],
        reward_fn=PreferenceModelReward(reward_model, batch_size=reward_batch_size),
        reference_texts=[p.chosen for p in parts["test"]],
    )
