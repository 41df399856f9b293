"""Multi30k (task 1, raw text, fr/en/de aligned line by line), the Translation Game's split of its train lines, and
the out-of-domain pretraining text (Tatoeba fr-en and en-de, ``translation-pretrain/``).

Text is lowercased as it is read (Lee et al. and the paper lowercase Multi30k). The 29,000 train lines are cut by
a seeded shuffle into a **pretraining part** (all three languages: the agents' vocabulary and pretraining) and a
**game part** (French–German pairs only: the game's prompts and the listener's targets; its English is never read).
With agents pretrained out of domain, as the paper's (IWSLT there, Tatoeba here), the pretraining part is empty or
a stated small share, and the game part is the rest. Validation is Multi30k ``val`` (1,014 lines), the final test
``test_2016_flickr`` (1,000).
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from elastic_reset.errors import DataFileError

LANGS = ("fr", "en", "de")
SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
PRETRAIN_PAIRS = ("fr-en", "en-de")
"""The directions of ``translation-pretrain/``: the speaker's and the listener's."""
CORPORA = ("tatoeba", "multi30k")
"""What the agents are pretrained on: Tatoeba, out of domain (the paper's set-up), or a part of Multi30k train."""


def _read_aligned(paths: dict[str, Path], what: str) -> dict[str, list[str]]:
    """``{lang: lines}`` of line-aligned gzip files, lowercased; refused by file and line when one is missing, the
    line counts differ, or a line is empty."""
    out = {}
    for lang, path in paths.items():
        if not path.is_file():
            raise DataFileError(f"{path}: missing (expected {what}, one sentence per line; see "
                                "../shared/data/README.md)")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out[lang] = [line.strip().lower() for line in f.read().splitlines()]
    lengths = {lang: len(lines) for lang, lines in out.items()}
    if len(set(lengths.values())) != 1:
        raise DataFileError(f"{next(iter(paths.values())).parent}: the {what} files are not aligned (lines per "
                            f"language: {lengths})")
    for lang, lines in out.items():
        empty = [i for i, t in enumerate(lines) if not t]
        if empty:
            raise DataFileError(f"{paths[lang]}:{empty[0] + 1}: empty line ({len(empty)} such)")
    return out


def load_multi30k(data_dir: str | Path, split: str) -> dict[str, list[str]]:
    """``{lang: lines}`` of one Multi30k split (``train``, ``val``, ``test``), lowercased, aligned line by line.
    Reads ``<data_dir>/multi30k/<file>.<lang>.gz``."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    folder = Path(data_dir) / "multi30k"
    return _read_aligned({lang: folder / f"{SPLITS[split]}.{lang}.gz" for lang in LANGS},
                         f"Multi30k task 1 {split}, raw text")


def load_pretrain_pairs(data_dir: str | Path, pair: str, split: str = "train") -> dict[str, list[str]]:
    """``{lang: lines}`` of one direction of the out-of-domain pretraining text (``pair``: ``fr-en`` or ``en-de``;
    ``split``: ``train`` or ``dev``), lowercased as Multi30k is. Reads ``<data_dir>/translation-pretrain/
    <split>.<pair>.<lang>.gz`` (Tatoeba; no sentence of a dev pair is in either train file)."""
    if pair not in PRETRAIN_PAIRS:
        raise ValueError(f"pair: expected one of {', '.join(PRETRAIN_PAIRS)}, got {pair!r}")
    if split not in ("train", "dev"):
        raise ValueError(f"split: expected train or dev, got {split!r}")
    folder = Path(data_dir) / "translation-pretrain"
    return _read_aligned({lang: folder / f"{split}.{pair}.{lang}.gz" for lang in pair.split("-")},
                         f"translation-pretrain {split} {pair} text")


def split_train(n_lines: int, seed: int = 0, pretrain_lines: int | None = None) -> tuple[list[int], list[int]]:
    """Line indices of the pretraining part and the game part of Multi30k train: a seeded shuffle cut after
    ``pretrain_lines`` (default: half; 0: every line is the game's, for agents pretrained out of domain)."""
    cut = n_lines // 2 if pretrain_lines is None else pretrain_lines
    if not 0 <= cut < n_lines:
        raise ValueError(f"pretrain_lines: expected 0 to {n_lines - 1}, got {pretrain_lines}")
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


def _check_corpus(corpus: str) -> None:
    if corpus not in CORPORA:
        raise ValueError(f"corpus: expected one of {', '.join(CORPORA)}, got {corpus!r}")


def pretraining_text(data_dir: str | Path, corpus: str, train: dict[str, list[str]],
                     pretrain_lines: int | None = None) -> dict:
    """What the agents are pretrained on: ``{"fr-en": (French, English), "en-de": (English, German), "en": the
    English LM's texts}``. ``tatoeba``: the Tatoeba pairs, then ``pretrain_lines`` of Multi30k train (a stated
    share, 0 by default at the build); ``multi30k``: that part of Multi30k alone (``None``: half). The speaker's
    pairs are also what the multitask / S2P loss rehearses, so the build and the task read them here."""
    _check_corpus(corpus)
    part = pretrain_part(train, pretrain_lines=pretrain_lines)
    if corpus == "multi30k":
        return {"fr-en": (part["fr"], part["en"]), "en-de": (part["en"], part["de"]), "en": part["en"]}
    fr_en, en_de = load_pretrain_pairs(data_dir, "fr-en"), load_pretrain_pairs(data_dir, "en-de")
    # English occurs in both directions (47,566 sentences in both train files): the LM reads each sentence once.
    return {"fr-en": (fr_en["fr"] + part["fr"], fr_en["en"] + part["en"]),
            "en-de": (en_de["en"] + part["en"], en_de["de"] + part["de"]),
            "en": list(dict.fromkeys(fr_en["en"] + en_de["en"] + part["en"]))}


def pretraining_dev(data_dir: str | Path, corpus: str) -> dict:
    """What the pretraining early-stops on, keyed as :func:`pretraining_text`: Tatoeba's dev pairs (never Multi30k,
    whose val scores the game), or Multi30k val for agents pretrained on Multi30k."""
    _check_corpus(corpus)
    if corpus == "multi30k":
        val = load_multi30k(data_dir, "val")
        return {"fr-en": (val["fr"], val["en"]), "en-de": (val["en"], val["de"]), "en": val["en"]}
    fr_en, en_de = load_pretrain_pairs(data_dir, "fr-en", "dev"), load_pretrain_pairs(data_dir, "en-de", "dev")
    return {"fr-en": (fr_en["fr"], fr_en["en"]), "en-de": (en_de["en"], en_de["de"]),
            "en": list(dict.fromkeys(fr_en["en"] + en_de["en"]))}
