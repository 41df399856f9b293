"""WikiText-2 (test split, raw) as prompts unlike the IMDB ones: the first half of an encyclopaedia paragraph. The
gold-vs-proxy testbed's "forget" set (paper 2 §4.3 measures the alignment tax on tasks the RL prompts do not cover).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from elastic_reset.data.imdb import prompt_of, shuffled
from elastic_reset.errors import DataFileError

RAW_TEST = Path("wikitext2") / "wikitext-2-raw.test.raw"
# WikiText's tokenization, undone: "guest @-@ starring" -> "guest-starring", "1 @,@ 000" -> "1,000", " , " -> ", ".
_JOINED = re.compile(r" @(.)@ ")
_BEFORE_PUNCT = re.compile(r" ([,.;:!?)]|'s|n't)")


def detokenize(line: str) -> str:
    return _BEFORE_PUNCT.sub(r"\1", _JOINED.sub(r"\1", " ".join(line.split())))


def paragraphs(data_dir: str | os.PathLike, min_words: int = 40) -> list[str]:
    """The test split's paragraphs of at least ``min_words`` words (headings left out), in file order."""
    path = Path(data_dir) / RAW_TEST
    if not path.is_file():
        raise DataFileError(f"{path}: no WikiText-2 raw test file (the data folder is ../shared/data)")
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [detokenize(line) for line in lines if line.strip() and not line.strip().startswith("=")]
    return [p for p in kept if len(p.split(" ")) >= min_words]


def paragraph_prompts(data_dir: str | os.PathLike, n: int, seed: int = 0, max_words: int | None = 40) -> list[str]:
    """``n`` prompts, the first half of as many paragraphs (the last ``max_words`` words of it), in a seeded order."""
    found = paragraphs(data_dir)
    if n > len(found):
        raise DataFileError(f"{Path(data_dir) / RAW_TEST}: {n} prompts asked for, {len(found)} paragraphs in it")
    return [prompt_of(p, max_words) for p in shuffled(found, seed, "wikitext-prompts")[:n]]
