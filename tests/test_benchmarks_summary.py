"""BENCHMARKS.md's summary table against the committed files it links: every decimal number a headline gives is
found in its row's raw files (a number in their text, a value in their JSON, as written or as a percentage), or is
computed from them by the row's entry in DERIVED (means and ranges over seeds, medians over updates)."""

from __future__ import annotations

import glob
import json
import re
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])")


def _rows() -> list[list[str]]:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    table = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("|") and not line.startswith(("|---", "| question"))]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def _leaves(x) -> Iterator[float]:
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield float(x)
    elif isinstance(x, str):
        yield from (float(n) for n in NUMBER.findall(x))


def _values(path: Path) -> list[float]:
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    found: list[float] = []
    for f in files:
        if f.suffix == ".json":
            found += _leaves(json.loads(f.read_text(encoding="utf-8")))
        elif f.suffix in (".md", ".txt", ".log"):
            found += [float(n) for n in NUMBER.findall(f.read_text(encoding="utf-8", errors="replace"))]
    return found


def _final_rewards(pattern: str, row: str) -> list[float]:
    files = sorted(glob.glob(str(ROOT / pattern)))
    assert len(files) == 8, pattern
    return [float(r["final_reward"]) for f in files for r in json.loads(Path(f).read_text())["rows"] if r["row"] == row]


def _grpo_config_means() -> list[float]:  # the mean end over 8 seeds, ours and TRL's
    ours = _final_rewards("benchmarks/results/learning_vs_trl_grpo_baseline_lr4e-3_seed[0-7].json",
                          "ours GRPO as GRPOTrainer")
    trl = _final_rewards("benchmarks/results/learning_vs_trl_grpo_config_lr4e-3_seed[0-7].json", "TRL GRPO")
    return [statistics.mean(ours), statistics.mean(trl)]


def _h200_update_seconds() -> list[float]:  # an update's time: the median over updates of its phases' sum
    out = []
    for path in sorted(glob.glob(str(ROOT / "experiments/translation_game/results/h200/runs/*/seed0/metrics.jsonl"))):
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        sums = [sum(v for k, v in r.items() if k.startswith("time/")) for r in records if "time/sample" in r]
        out.append(statistics.median(sums))
    return out


def _smollm2_start_rewards() -> list[float]:  # each run's held-out reward at step 0
    paths = sorted(glob.glob(str(ROOT / "experiments/imdb/results/smollm2/runs/*/seed*/metrics.jsonl")))
    return [next(json.loads(line)["eval/reward"] for line in Path(p).read_text().splitlines()
                 if "eval/reward" in json.loads(line)) for p in paths]


DERIVED: dict[str, Callable[[], list[float]]] = {
    "A run from TRL's own": _grpo_config_means,
    "GPU speed": _h200_update_seconds,
    "IMDB on SmolLM2": _smollm2_start_rewards,
}
"""Row (the start of its question, links stripped) → the computed values its headline quotes."""


def _question(cells: list[str]) -> str:
    return re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", cells[0])


def test_the_summary_has_its_rows_and_each_links_a_committed_file():
    rows = _rows()
    assert 10 <= len(rows) <= 15
    for cells in rows:
        links = re.findall(r"\]\(([^)#]+)\)", cells[4])
        assert links and all((ROOT / link).exists() for link in links), (_question(cells), links)
    assert {key for key in DERIVED if any(_question(c).startswith(key) for c in rows)} == set(DERIVED)


@pytest.mark.parametrize("cells", _rows(), ids=lambda cells: _question(cells)[:40])
def test_every_number_of_a_headline_is_in_its_raw_files(cells):
    question = _question(cells)
    pool = [v for link in re.findall(r"\]\(([^)#]+)\)", cells[4]) for v in _values(ROOT / link)]
    pool += next((f() for key, f in DERIVED.items() if question.startswith(key)), [])
    missing = []
    for written in NUMBER.findall(cells[1].replace("−", "-")):
        digits, x = len(written.split(".")[1]), float(written)
        if not any(round(v, digits) == x or round(100 * v, digits) == x for v in pool):
            missing.append(written)
    assert not missing, f"{question[:60]}: {missing} not in its raw files"
