"""An IMDB grid's finished cells as BENCHMARKS.md's progress table: a row per method, a column per seed.

    .venv/bin/python experiments/imdb/cells.py experiments/imdb/results/135m [--methods kl,elastic_reset]
    .venv/bin/python experiments/imdb/cells.py runs/imdb_135m       # the grid itself, before collecting

Reads each cell (``RESULTS/runs/METHOD/seedN``, as ``grid_cells.sh`` collects them) with the reports' reader,
:func:`~elastic_reset.evaluation.runs.load_run`, and prints its final evaluation (reward, perplexity on held-out
text, KL to the initial model) and its test reward where it has one: what a grid under way reports before its
verdict. A cell counts when its last evaluation is at its config's last step (``Run.total_steps``); any other is
left blank, so a half-trained cell is never reported as a result.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from elastic_reset.evaluation.runs import Run, find_run_dirs, load_run

# imdb_grid.sh's methods, in BENCHMARKS.md's row order; other methods follow, sorted.
ORDER = ("kl", "kl_small", "elastic_reset", "er_paper", "reset_to_init", "reset_to_ema", "nlpo")


def finished(run: Run) -> bool:
    return run.total_steps is not None and int(run.steps[-1]) == run.total_steps


def cell_text(run: Run) -> str:
    kl = load_run(run.path, method=run.method, drift="kl_init").drifts[-1]
    text = f"{run.rewards[-1]:.3f}, {run.drifts[-1]:.1f}, {kl:.1f}"
    return text + (f"; test {run.test[0]:.3f}" if run.test else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--methods", help="comma-separated rows (default: every method, the grid's order)")
    args = parser.parse_args()
    # A results folder keeps its cells under runs/ (beside other runs: the learning check's); a grid folder
    # (runs/imdb_135m) holds them itself.
    grid = args.results / "runs" if (args.results / "runs").is_dir() else args.results
    done: dict[str, dict[int, Run]] = {}
    for path in find_run_dirs(grid):
        run = load_run(path, drift="perplexity", score="reward")
        if finished(run):
            done.setdefault(run.method, {})[run.seed] = run
    methods = args.methods.split(",") if args.methods else (
        [m for m in ORDER if m in done] + sorted(m for m in done if m not in ORDER))
    done = {m: done.get(m, {}) for m in methods}
    seeds = sorted({s for cells in done.values() for s in cells})
    print(f"{sum(map(len, done.values()))} finished cells")
    print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for m in methods:
        row = [cell_text(done[m][s]) if s in done[m] else "" for s in seeds]
        print(f"| `{m}` | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
