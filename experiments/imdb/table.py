"""The IMDB table of BENCHMARKS.md, from the runs and report that ``experiments/imdb/grid.sh`` copies to
experiments/imdb/results/toy.

    .venv/bin/python experiments/imdb/table.py [experiments/imdb/results/toy]

Per method: the final evaluation (reward, perplexity on held-out human reviews, KL to the initial model) as mean ±
standard error over seeds, and the best reward reached; the test split's table where the runs have one (``test/*``,
scored once on the final weights: the paper's Table 2); then every pair's frontier comparison from summary.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from elastic_reset.evaluation.pareto import mean_and_se
from elastic_reset.io import read_metrics


def pm(values: list[float], digits: int) -> str:
    mean, se = mean_and_se(np.asarray(values, dtype=float))
    return f"{mean:.{digits}f}" if len(values) < 2 else f"{mean:.{digits}f} ± {se:.{digits}f}"


def main(results: Path) -> None:
    summary = json.loads((results / "summary.json").read_text())
    rows = {}
    for name in summary["methods"]:
        finals, best, tests = [], [], []
        # Every seed copied into results/ (a grid stopped part-way may hold more seeds than summary.json covers).
        for run_dir in sorted((results / "runs" / name).glob("seed*")):
            records = read_metrics(run_dir / "metrics.jsonl")
            evals = [r for r in records if "eval/reward" in r]
            finals.append(evals[-1])
            best.append(max(r["eval/reward"] for r in evals))
            tests += [r for r in records if "test/reward" in r]
        rows[name] = finals, best, tests
    print("| method | seeds | final reward | final perplexity | final KL to init | best eval reward |")
    print("|---|---|---|---|---|---|")
    for name, (finals, best, _) in rows.items():
        print(f"| {name} | {len(finals)} | {pm([r['eval/reward'] for r in finals], 3)} | "
              f"{pm([r['eval/perplexity'] for r in finals], 2)} | {pm([r['eval/kl_init'] for r in finals], 2)} | "
              f"{pm(best, 3)} |")
    if any(tests for _, _, tests in rows.values()):  # the runs' test split, scored once on the final weights
        print()
        print("| method | seeds | test reward | test perplexity | test KL to init |")
        print("|---|---|---|---|---|")
        for name, (_, _, tests) in rows.items():
            if tests:
                print(f"| {name} | {len(tests)} | {pm([r['test/reward'] for r in tests], 3)} | "
                      f"{pm([r['test/perplexity'] for r in tests], 2)} | {pm([r['test/kl_init'] for r in tests], 2)} |")
    print()
    seeds = sorted({s for entry in summary["methods"].values() for s in entry["seeds"]})
    print(f"Frontier dominance (summary.json, seeds {seeds}):")
    for row in summary["dominance"]:
        print(f"- {row['text']}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "toy"))
