"""An IMDB grid's finished cells as BENCHMARKS.md's progress table: a row per method, a column per seed.

    .venv/bin/python benchmarks/imdb_cells.py results/imdb_135m [--methods kl,elastic_reset]
    .venv/bin/python benchmarks/imdb_cells.py runs/imdb_135m       # the grid itself, before collecting

Reads each finished cell (``RESULTS/runs/METHOD/seedN``, as ``grid_cells.sh`` collects them) and prints its
final evaluation (reward, perplexity on held-out text, KL to the initial model) and its test reward where it has
one: what a grid under way reports before its verdict. A cell is finished when it has its ``done`` marker or its
last evaluation is at its config's last step; any other cell is left blank, so a half-trained cell is never
reported as a result.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from elastic_reset.io import read_metrics

# imdb_grid.sh's methods, in BENCHMARKS.md's row order; other folders follow, sorted.
ORDER = ("kl", "kl_small", "elastic_reset", "er_paper", "reset_to_init", "reset_to_ema", "nlpo")


def final(cell: Path) -> dict[str, float]:
    """The last value of each metric the cell logged (evaluation and test rows are logged once per step)."""
    last: dict[str, float] = {}
    for row in read_metrics(cell / "metrics.jsonl"):
        last.update({k: v for k, v in row.items() if isinstance(v, float)})
    return last


def finished(cell: Path) -> bool:
    """A cell with its ``done`` marker, or (collected before the grids kept the marker) whose last evaluation is at
    its config's last step."""
    if (cell / "done").exists():
        return True
    steps = re.search(r"^steps: (\d+)$", (cell / "config.yaml").read_text(), re.M)
    evals = [row["step"] for row in read_metrics(cell / "metrics.jsonl") if "eval/reward" in row]
    return bool(steps and evals) and max(evals) == int(steps[1])


def cell_text(cell: Path) -> str:
    m = final(cell)
    text = f"{m['eval/reward']:.3f}, {m['eval/perplexity']:.1f}, {m['eval/kl_init']:.1f}"
    return text + (f"; test {m['test/reward']:.3f}" if "test/reward" in m else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--methods", help="comma-separated rows (default: every method folder, the grid's order)")
    args = parser.parse_args()
    # A results folder keeps its cells under runs/; a grid folder (runs/imdb_135m) holds them itself.
    runs = args.results / "runs" if (args.results / "runs").is_dir() else args.results
    if not runs.is_dir():
        raise SystemExit(f"{runs}: no such folder")
    folders = [m for m in ORDER if (runs / m).is_dir()]
    folders += sorted(p.name for p in runs.iterdir() if p.is_dir() and p.name not in ORDER)
    methods = args.methods.split(",") if args.methods else folders
    done = {m: {int(s.name[4:]): s for s in (runs / m).glob("seed*") if s.name[4:].isdigit() and finished(s)}
            for m in methods}
    seeds = sorted({s for cells in done.values() for s in cells})
    print(f"{sum(map(len, done.values()))} finished cells")
    print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for m in methods:
        row = [cell_text(done[m][s]) if s in done[m] else "" for s in seeds]
        print(f"| `{m}` | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
