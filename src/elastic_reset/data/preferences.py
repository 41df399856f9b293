"""Preference pairs: a JSONL file of ``{"prompt", "chosen", "rejected"}``, HH-RLHF and the small Stack Exchange
sets of ``../shared/data`` by name (:func:`load_preferences` reads either), and a deterministic split by prompt (no
prompt in two parts)."""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import warnings
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from elastic_reset.data.jsonl import json_objects
from elastic_reset.errors import ConfigError, DataFileError

HH_SUBSETS = {"helpful": "helpful-base", "harmless": "harmless-base"}
SE_SITES = ("beer", "coffee")
DATASETS = {"hh-rlhf": tuple(HH_SUBSETS), "stack-exchange": SE_SITES}
"""The categories each named preference set contributes: metrics are reported per set too (Peng et al. report
accuracy and ECE per dataset, Table 1)."""
ASSISTANT = "\n\nAssistant:"


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    """What both responses answer (HH-RLHF: the dialogue up to and including the last ``Assistant:``)."""
    chosen: str
    """The preferred response."""
    rejected: str
    """The other one."""
    category: str = ""
    """Where the pair comes from (``helpful``, ``harmless``, ``beer``, ``coffee``, or a file's own field): score
    statistics are reported per category (Peng et al. Fig. 1 and 4)."""


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


NO_PREFERENCE = "the answers are identical or empty"


def keep_preferences(pairs: list[PreferencePair], source: str, left_out: int = 0, why: str = NO_PREFERENCE
                     ) -> list[PreferencePair]:
    """``pairs`` without those that state no preference (chosen and rejected identical, or one empty): they would
    teach nothing and count as a tie in every metric. The JSONL reader and the HH-RLHF loader alike leave them out
    with one warning naming ``source`` and how many (plus ``left_out`` the caller dropped for ``why``)."""
    kept = [p for p in pairs if p.chosen and p.rejected and p.chosen != p.rejected]
    left_out += len(pairs) - len(kept)
    if left_out:
        warnings.warn(f"{source}: {left_out} pair(s) left out ({why})", stacklevel=3)
    return kept


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Pairs from a JSONL file (``.gz`` too): one object per line with string fields ``prompt``, ``chosen`` and
    ``rejected``, and optionally ``category``. A malformed line is refused with its file and line number."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such preference file")
    pairs = []
    with _open_text(path) as f:
        for where, row in json_objects(f, path):
            for key in ("prompt", "chosen", "rejected"):
                if not isinstance(row.get(key), str):
                    raise DataFileError(f"{where}: field {key!r} missing or not a string")
            if not row["chosen"].strip() or not row["rejected"].strip():
                raise DataFileError(f"{where}: an empty response (chosen or rejected)")
            category = row.get("category", "")
            if not isinstance(category, str):
                raise DataFileError(f"{where}: field 'category' must be a string")
            pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"], category))
    pairs = keep_preferences(pairs, str(path), why="chosen and rejected are identical: no preference")
    if not pairs:
        raise DataFileError(f"{path}: no preference pairs in it")
    return pairs


def split_hh_dialogue(text: str) -> tuple[str, str]:
    """(prompt, response) of an HH-RLHF transcript: the prompt ends with its last ``\\n\\nAssistant:``."""
    cut = text.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError("no '\\n\\nAssistant:' turn in the transcript")
    cut += len(ASSISTANT)
    return text[:cut], text[cut:].strip()


def load_hh_rlhf(data_dir: str | Path, categories: tuple[str, ...] = ("helpful", "harmless")
                 ) -> list[PreferencePair]:
    """HH-RLHF's helpful-base and harmless-base test files (the only ones here) as pairs. A pair whose two
    transcripts differ before their last answer (14 of 4,666), or whose answers are identical or empty (10), has no
    single prompt or no preference: it is left out, with a warning that counts them."""
    pairs, split_apart = [], 0
    for category in categories:
        if category not in HH_SUBSETS:
            raise DataFileError(f"hh-rlhf: unknown category {category!r} (expected one of {sorted(HH_SUBSETS)})")
        path = Path(data_dir) / "hh-rlhf" / HH_SUBSETS[category] / "test.jsonl.gz"
        if not path.is_file():
            raise DataFileError(f"{path}: not found (expected ../shared/data/hh-rlhf/{HH_SUBSETS[category]}/)")
        with _open_text(path) as f:
            for number, line in enumerate(f, 1):
                row = json.loads(line)
                try:
                    prompt, chosen = split_hh_dialogue(row["chosen"])
                    other, rejected = split_hh_dialogue(row["rejected"])
                except (KeyError, ValueError) as e:
                    raise DataFileError(f"{path}:{number}: not an HH-RLHF pair ({e})") from None
                if other != prompt:
                    split_apart += 1
                    continue
                pairs.append(PreferencePair(prompt, chosen, rejected, category))
    return keep_preferences(pairs, "hh-rlhf", split_apart,
                            f"the two transcripts differ before the last answer, or {NO_PREFERENCE}")


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def html_to_text(body: str) -> str:
    """A Stack Exchange body (HTML) as plain text: tags dropped, entities decoded, blank runs collapsed."""
    parser = _Text()
    parser.feed(body)
    parser.close()
    lines = [line.rstrip() for line in html.unescape("".join(parser.parts)).splitlines()]
    text, blank = [], False
    for line in lines:
        if line.strip() or not blank:
            text.append(line)
        blank = not line.strip()
    return "\n".join(text).strip()


def load_stack_exchange(data_dir: str | Path, sites: tuple[str, ...] = SE_SITES) -> list[PreferencePair]:
    """The beer and coffee Stack Exchange pairs (answers to one question with different scores; the higher
    scored is chosen) in StackLLaMA's format: prompt ``Question: <title>\\n\\n<body>\\n\\nAnswer: ``."""
    pairs = []
    for site in sites:
        if site not in SE_SITES:
            raise DataFileError(f"stack-exchange-paired: unknown site {site!r} (expected one of {list(SE_SITES)})")
        path = Path(data_dir) / "stack-exchange-paired" / f"{site}.paired.jsonl.gz"
        if not path.is_file():
            raise DataFileError(f"{path}: not found")
        with _open_text(path) as f:
            for line in f:
                row = json.loads(line)
                prompt = f"Question: {row['title']}\n\n{html_to_text(row['question'])}\n\nAnswer: "
                pairs.append(PreferencePair(prompt, html_to_text(row["response_j"]),
                                            html_to_text(row["response_k"]), site))
    return pairs


def load_preferences(data: list[str], data_dir: str | Path | None) -> list[PreferencePair]:
    """The pairs of every name in ``data``: a named set (``hh-rlhf``, ``stack-exchange``) read from ``data_dir``, or
    the path of a JSONL pair file (:func:`read_pairs`)."""
    pairs = []
    for name in data:
        if name in DATASETS:
            if data_dir is None:
                raise ConfigError(f"data_dir: {name!r} is read from a data folder (e.g. ../shared/data)")
            pairs += load_hh_rlhf(data_dir) if name == "hh-rlhf" else load_stack_exchange(data_dir)
        else:
            pairs += read_pairs(name)
    return pairs


def split_by_prompt(pairs: list[PreferencePair], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                    seed: int = 0) -> dict[str, list[PreferencePair]]:
    """``{"train", "val", "test"}``: each prompt goes wholly to one part, chosen by a hash of (seed, prompt), so
    the split does not depend on the order or number of pairs, and no prompt is in two parts."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions: expected three non-negative numbers summing to 1, got {fractions!r}")
    bounds = (fractions[0], fractions[0] + fractions[1])
    parts: dict[str, list[PreferencePair]] = {"train": [], "val": [], "test": []}
    for pair in pairs:
        digest = hashlib.sha256(f"{seed}\0{pair.prompt}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2 ** 64
        parts["train" if u < bounds[0] else "val" if u < bounds[1] else "test"].append(pair)
    return parts
