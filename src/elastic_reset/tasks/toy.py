"""A toy task a tiny byte-level model learns in a few steps: the reward is how often a letter appears.

For tests and smoke runs only. It shares the prompts and held-out sentences of the ``vader`` task.
"""

from __future__ import annotations

from elastic_reset.tasks.base import Task, register_task
from elastic_reset.tasks.vader import PRETRAIN_TEXTS, PROMPTS, REFERENCE_TEXTS


@register_task("letter_frequency")
def letter_frequency_task(data_dir: str | None = None, letter: str = "e") -> Task:
    """Reward: the fraction of the completion's characters equal to ``letter`` (0 for an empty completion)."""
    if not isinstance(letter, str) or len(letter) != 1:
        raise ValueError(f"task.options.letter: expected a single character, got {letter!r}")

    def reward(prompts: list[str], completions: list[str]) -> list[float]:
        return [c.count(letter) / len(c) if c else 0.0 for c in completions]

    return Task(name="letter_frequency", train_prompts=PROMPTS[10:], eval_prompts=PROMPTS[:10], reward_fn=reward,
                reference_texts=list(REFERENCE_TEXTS), pretrain_texts=list(PRETRAIN_TEXTS))
