"""A toy task a tiny byte-level model learns in a few steps: the reward is how often a letter appears.

For tests and smoke runs only. Its prompts, held-out sentences (perplexity) and pretraining sentences (multitask
loss) are its own, written for this project: three disjoint sets of plain everyday English.
"""

from __future__ import annotations

from itertools import product

from elastic_reset.errors import ConfigError
from elastic_reset.tasks.base import Task, register_task

_SUBJECTS = ["The cat", "My neighbour", "A small boat", "The old clock", "Our teacher", "The red kite",
             "A tired farmer", "The new bakery"]
_OPENINGS = ["sat by the window and", "was busy on Monday, so", "always", "looked up when", "could not"]
# Subject-minor order: the first ten prompts (the validation set) cover every subject and two openings.
PROMPTS = [f"{s} {o}" for o, s in product(_OPENINGS, _SUBJECTS)]

REFERENCE_TEXTS = [
    "The train left the station a few minutes after noon.",
    "She planted tomatoes along the fence behind the house.",
    "We walked to the market and bought bread, cheese and apples.",
    "The library opens at nine and closes early on Saturdays.",
    "A strong wind blew the leaves across the empty road.",
    "He fixed the bicycle with a spanner and some patience.",
    "The children built a snowman in the park after school.",
    "Rain fell all night, and by morning the river had risen.",
    "My sister writes letters to her friend in another town.",
    "The soup was hot, so we waited before eating it.",
    "They painted the kitchen a pale shade of green.",
    "The dog barked twice and then went back to sleep.",
    "A lamp on the desk lit the pages of the open book.",
    "The bus was late, so we shared a taxi into the city.",
    "Fresh fish is sold at the harbour early each morning.",
    "The garden was quiet except for a few busy bees.",
]

PRETRAIN_TEXTS = [
    "The baker wakes up before dawn to light the oven.",
    "Two boys played football on the wet grass until dark.",
    "The museum shows old maps and tools from the harbour.",
    "Grandfather told us a story about his first job.",
    "The kettle whistled while she read the morning paper.",
    "A cold breeze came through the open kitchen door.",
    "We counted the stars from the roof of the barn.",
    "The farmer sold eggs and honey at the Sunday market.",
    "The teacher drew a large map of the river on the board.",
    "Snow covered the hills, and the roads were closed.",
    "The shop on the corner sells pens, paper and stamps.",
    "He swam across the lake while his friends watched.",
]


@register_task("letter_frequency")
def letter_frequency_task(data_dir: str | None = None, letter: str = "e") -> Task:
    """Reward: the fraction of the completion's characters equal to ``letter`` (0 for an empty completion)."""
    if not isinstance(letter, str) or len(letter) != 1:
        raise ConfigError(f"task.options.letter: expected a single character, got {letter!r}")

    def reward(prompts: list[str], completions: list[str]) -> list[float]:
        return [c.count(letter) / len(c) if c else 0.0 for c in completions]

    return Task(name="letter_frequency", train_prompts=PROMPTS[10:], eval_prompts=PROMPTS[:10], reward_fn=reward,
                reference_texts=list(REFERENCE_TEXTS), pretrain_texts=list(PRETRAIN_TEXTS))
