"""Multi30k (task 1, raw text, fr/en/de aligned line by line) and the Translation Game's split of its train lines.

Text is lowercased as it is read (Lee et al. and the paper lowercase Multi30k). The 29,000 train lines are cut by
a seeded shuffle into a **pretraining part** (all three languages: the agents' vocabulary and pretraining) and a
**game part** (French–German pairs only: the game's prompts and the listener's targets; its English is never read).
Validation is Multi30k ``val`` (1,014 lines), the final test ``test_2016_flickr`` (1,000).
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from elastic_reset.errors import DataFileError

LANGS = ("fr", "en", "de")
SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}


def load_multi30k(data_dir: str | Path, split: str) -> dict[str, list[str]]:
    """``{lang: lines}`` of one Multi30k split (``train``, ``val``, ``test``), lowercased, aligned line by line.
    Reads ``<data_dir>/multi30k/<file>.<lang>.gz``."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    out = {}
    for lang in LANGS:
        path = Path(data_dir) / "multi30k" / f"{SPLITS[split]}.{lang}.gz"
        if not path.is_file():
            raise DataFileError(f"{path}: missing (expected Multi30k task 1, raw text, one sentence per line; "
                                "see ../shared/data/README.md)")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out[lang] = [line.strip().lower() for line in f.read().splitlines()]
    lengths = {lang: len(lines) for lang, lines in out.items()}
    if len(set(lengths.values())) != 1:
        raise DataFileError(f"{Path(data_dir) / 'multi30k'}: the {split} files are not aligned (lines per language: "
                            f"{lengths})")
    for lang, lines in out.items():
        empty = [i for i, t in enumerate(lines) if not t]
        if empty:
            raise DataFileError(f"{Path(data_dir) / 'multi30k' / f'{SPLITS[split]}.{lang}.gz'}:{empty[0] + 1}: "
                                f"empty line ({len(empty)} such)")
    return out


def split_train(n_lines: int, seed: int = 0, pretrain_lines: int | None = None) -> tuple[list[int], list[int]]:
    """Line indices of the pretraining part and the game part of Multi30k train: a seeded shuffle cut after
    ``pretrain_lines`` (default: half)."""
    cut = n_lines // 2 if pretrain_lines is None else pretrain_lines
    if not 0 < cut < n_lines:
        raise ValueError(f"pretrain_lines: expected 1 to {n_lines - 1}, got {pretrain_lines}")
    order = list(range(n_lines))
    random.Random(f"multi30k-split-{seed}").shuffle(order)
    return sorted(order[:cut]), sorted(order[cut:])


def pretrain_part(train: dict[str, list[str]], seed: int = 0, pretrain_lines: int | None = None
                  ) -> dict[str, list[str]]:
    """The pretraining part, all three languages."""
    idx, _ = split_train(len(train["fr"]), seed, pretrain_lines)
    return {lang: [lines[i] for i in idx] for lang, lines in train.items()}


def game_pairs(train: dict[str, list[str]], seed: int = 0, pretrain_lines: int | None = None
               ) -> list[tuple[str, str]]:
    """The game part as (French, German) pairs; the English of these lines is dropped here."""
    _, idx = split_train(len(train["fr"]), seed, pretrain_lines)
    return [(train["fr"][i], train["de"][i]) for i in idx]
