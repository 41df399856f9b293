"""IMDB reviews (Maas et al. 2011) and every split the project cuts from them.

- Files: ``<data_dir>/imdb/{train,test}.jsonl.gz`` with ``{"text", "label"}`` (1 = positive), or, with no
  ``data_dir``, the Hugging Face ``imdb`` dataset (``datasets.load_dataset("imdb")``) for users who are online.
- ``<br />`` tags are replaced by spaces and whitespace is collapsed; the text is otherwise as IMDB has it.
- The task (:func:`task_splits`): train prompts and multitask text from the train split; validation prompts and the
  reference reviews from the test split, in two disjoint parts. A prompt is the first half of a review's words
  (RL4LMs' ``IMDB`` data pool: ``text.split(" ")``, the first ``int(0.5 * n)`` words).
- The sentiment classifier (:func:`classifier_split`): the first ``n_train`` of the shuffled train split, accuracy
  on the first ``n_test`` of the shuffled test split.
- The small policy (:func:`policy_texts`): every train review; perplexity on the end of the task's test shuffle,
  which the task never uses.

Shuffles are seeded (``random.Random`` on a salted seed), so every run of a comparison sees the same data.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from elastic_reset.errors import ConfigError, DataFileError

POSITIVE = 1
"""The label of a positive review (RL4LMs' IMDB config: ``label_ix: 1``)."""
LABELS = {0: "negative", 1: "positive"}
"""Label ids and names, as a classifier's ``id2label``."""
POLICY_HELD_OUT = 500
"""Test reviews, from the end of the task's test shuffle, the small policy's perplexity is measured on."""

_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


def clean_review(text: str) -> str:
    """Replace ``<br />`` line breaks by spaces and collapse runs of whitespace."""
    # str.split() cuts at the characters re's \s matches (str.isspace), ~3.5x faster than a regex over 50k reviews.
    return " ".join(_BR.sub(" ", text).split())


def prompt_of(review: str, max_words: int | None = None) -> str:
    """The first half of the review's words (RL4LMs); with ``max_words``, only the last ``max_words`` of them
    (the end is what the policy continues, and what the engine's left truncation keeps anyway)."""
    words = review.split(" ")
    half = words[:int(len(words) * 0.5)]
    if max_words is not None:
        half = half[-max_words:]
    return " ".join(half)


def _split_file(data_dir: str | os.PathLike, split: str) -> Path:
    return Path(data_dir) / "imdb" / f"{split}.jsonl.gz"


@lru_cache(maxsize=4)
def _read_jsonl(path: Path) -> tuple[tuple[str, int], ...]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text, label = row["text"], int(row["label"])
            except (ValueError, KeyError, TypeError) as err:
                raise DataFileError(f"{path}:{line_no}: expected a JSON object with \"text\" and \"label\" "
                                 f"({err})") from None
            rows.append((clean_review(text), label))
    return tuple(rows)


def load_imdb(data_dir: str | os.PathLike | None, split: str) -> list[tuple[str, int]]:
    """``[(cleaned review, label)]`` of the ``train`` or ``test`` split, in file order (all negative, then all
    positive: shuffle before taking a prefix). ``data_dir=None``: the Hugging Face ``imdb`` dataset."""
    if split not in ("train", "test"):
        raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")
    if data_dir is None:
        return _load_hf(split)
    path = _split_file(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: IMDB {split} split not found (expected <data_dir>/imdb/{split}.jsonl.gz "
                                "with {\"text\", \"label\"} lines; see ../shared/data/README.md)")
    return list(_read_jsonl(path.resolve()))


def _load_hf(split: str) -> list[tuple[str, int]]:
    try:
        from datasets import load_dataset  # a data library, imported only for users who are online

        dataset = load_dataset("imdb", split=split)
    except Exception as err:  # no `datasets`, offline, no cached copy: all mean the same to the user
        raise FileNotFoundError(
            f"IMDB: no data_dir given and datasets.load_dataset('imdb') failed ({type(err).__name__}: {err}). "
            "Offline, point task.data_dir (or --data-dir) at a folder holding imdb/{train,test}.jsonl.gz, "
            "e.g. ../shared/data") from None
    return [(clean_review(t), int(y)) for t, y in zip(dataset["text"], dataset["label"])]


def shuffled(rows: list, seed: int, salt: str) -> list:
    """A copy of ``rows`` in a deterministic order given ``seed`` (``salt`` decorrelates the splits)."""
    out = list(rows)
    random.Random(f"{salt}:{seed}").shuffle(out)
    return out


def check_labelled(texts: Sequence[str], labels: Sequence[int], what: str) -> None:
    """Refuse texts and labels of different lengths, no texts, or a label other than 0 and 1."""
    if len(texts) != len(labels):
        raise ValueError(f"{what}: {len(texts)} texts but {len(labels)} labels")
    if not texts:
        raise ValueError(f"{what}: no examples")
    bad = [y for y in labels if y not in (0, 1)]
    if bad:
        raise ValueError(f"{what}: labels must be 0 (negative) or 1 (positive), got {bad[0]!r}")


def _count(name: str, value: int | None, available: int) -> int:
    if value is None:
        return available
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"task.options.{name}: expected a positive integer, got {value!r}")
    return min(value, available)


@dataclass
class TaskSplits:
    """The IMDB task's text, every part from reviews no other part uses."""

    train_prompts: list[str]
    """First halves of train reviews."""
    eval_prompts: list[str]
    """First halves of test reviews (the first ``n_eval`` of the test shuffle)."""
    reference_texts: list[str]
    """Whole test reviews (the next ``n_reference`` of the test shuffle), for the perplexity drift."""
    pretrain_texts: list[str]
    """Whole train reviews, for the multitask / S2P loss."""
    test_prompts: list[str] = field(default_factory=list)
    """First halves of test reviews (the next ``n_test`` of the test shuffle), scored once on the final weights."""
    report_prompts: list[str] = field(default_factory=list)
    """First halves of test reviews (the next ``n_report``), a second validation set: checkpoints chosen on the
    validation prompts are reported on these."""
    report_texts: list[str] = field(default_factory=list)
    """Whole test reviews (the next ``n_report`` after those), the second set's own perplexity drift."""


def task_splits(data_dir: str | os.PathLike | None, *, seed: int = 0, n_train: int | None = None, n_eval: int = 5000,
                n_reference: int = 5000, n_pretrain: int | None = None, max_prompt_words: int | None = None,
                n_test: int = 0, n_report: int = 0) -> TaskSplits:
    """The IMDB task's prompts and texts: ``n_train`` train prompts (default: all), ``n_eval`` validation prompts,
    ``n_reference`` reference reviews, ``n_test`` test prompts and ``n_report`` report prompts and as many report
    reviews (disjoint parts of the test split in that order, clear of the policy's held-out reviews; a part added
    later comes after the others, so theirs do not move), ``n_pretrain`` multitask texts (default: all train
    reviews). Shuffles are seeded by ``seed`` (the task's, not the run's)."""
    if max_prompt_words is not None and (not isinstance(max_prompt_words, int) or max_prompt_words < 1):
        raise ConfigError(f"task.options.max_prompt_words: expected a positive integer, got {max_prompt_words!r}")
    train = shuffled(load_imdb(data_dir, "train"), seed, "imdb-train")
    test = shuffled(load_imdb(data_dir, "test"), seed, "imdb-test")
    train_prompts = _prompts(train, max_prompt_words)
    train_prompts = train_prompts[:_count("n_train", n_train, len(train_prompts))]
    n_eval = _count("n_eval", n_eval, len(test) - 1)
    n_reference = _count("n_reference", n_reference, len(test) - n_eval)
    eval_prompts = [p for p in (prompt_of(t, max_prompt_words) for t, _ in test[:n_eval]) if p]
    reference_texts = [t for t, _ in test[n_eval:n_eval + n_reference]]
    pretrain_texts = [t for t, _ in train[:_count("n_pretrain", n_pretrain, len(train))]]
    start = n_eval + n_reference
    n_test = _count("n_test", n_test, max(0, len(test) - POLICY_HELD_OUT - start)) if n_test else 0
    test_prompts = [p for p in (prompt_of(t, max_prompt_words) for t, _ in test[start:start + n_test]) if p]
    start += n_test
    n_report = _count("n_report", n_report, max(0, len(test) - POLICY_HELD_OUT - start) // 2) if n_report else 0
    report = test[start:start + n_report]
    report_prompts = [p for p in (prompt_of(t, max_prompt_words) for t, _ in report) if p]
    report_texts = [t for t, _ in test[start + n_report:start + 2 * n_report]]
    return TaskSplits(train_prompts, eval_prompts, reference_texts, pretrain_texts, test_prompts,
                      report_prompts, report_texts)


def _prompts(reviews: list[tuple[str, int]], max_prompt_words: int | None) -> list[str]:
    # Reviews too short to halve give an empty prompt: they are left out of the prompt sets.
    return [p for p in (prompt_of(t, max_prompt_words) for t, _ in reviews) if p]


def train_prompts(data_dir: str | os.PathLike | None, n: int, *, seed: int = 0) -> list[str]:
    """The task's first ``n`` train prompts (:func:`task_splits`'s, in its order), without reading the test split."""
    prompts = _prompts(shuffled(load_imdb(data_dir, "train"), seed, "imdb-train"), None)
    return prompts[:_count("n", n, len(prompts))]


def classifier_split(data_dir: str | os.PathLike | None, *, seed: int = 0, n_train: int = 6000, n_test: int = 2000
                     ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, test) ``[(review, label)]`` of the sentiment classifier: seeded shuffles (the files are
    all-negative then all-positive), the first ``n_train`` train and ``n_test`` test reviews."""
    train = shuffled(load_imdb(data_dir, "train"), seed, "imdb-classifier-train")[:n_train]
    test = shuffled(load_imdb(data_dir, "test"), seed, "imdb-classifier-test")[:n_test]
    return train, test


def policy_texts(data_dir: str | os.PathLike | None) -> tuple[list[str], list[str]]:
    """(train, held-out) reviews of the small policy: every train review, in file order, and the last
    :data:`POLICY_HELD_OUT` of the task's test shuffle (seed 0), which it never uses as prompts or references."""
    train = [t for t, _ in load_imdb(data_dir, "train")]
    held_out = [t for t, _ in shuffled(load_imdb(data_dir, "test"), 0, "imdb-test")[-POLICY_HELD_OUT:]]
    return train, held_out
