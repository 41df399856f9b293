"""The 135M IMDB learning search (``experiments/imdb/learning.sh``): its table and the rule's choice.

    .venv/bin/python experiments/imdb/learning_table.py [experiments/imdb/results/135m/learning]

The rule (the script's, fixed before the runs): an estimator learns if its held-out reward at iteration 20 is at
least 0.15 above the initial one; the grid takes the candidate with the highest reward at 20 among those whose
perplexity at 20 is at most twice the initial one; within 0.02 of that best, the lower learning rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

from elastic_reset.io import read_metrics

GAIN, PPL_RATIO, TIE = 0.15, 2.0, 0.02


def main(folder: Path) -> None:
    rows = []
    for run in sorted(folder.glob("*/metrics.jsonl")):
        records = read_metrics(run)
        evals = [r for r in records if "eval/reward" in r]
        steps = [r for r in records if "time/update" in r]
        seconds = sum(sum(v for k, v in r.items() if k.startswith("time/")) for r in steps) / max(1, len(steps))
        estimator, lr = run.parent.name.split("_lr")
        rows.append((estimator, float(lr), evals, seconds))
    rows.sort(key=lambda row: (row[0] != "ppo", row[1]))
    print("| estimator | lr | held-out reward at 0, 5, 10, 15, 20 | perplexity at 20 | KL to init at 20 | "
          "s / iteration |")
    print("|---|---|---|---|---|---|")
    for estimator, lr, evals, seconds in rows:
        rewards = " ".join(f"{r['eval/reward']:.3f}" for r in evals)
        last = evals[-1]
        print(f"| {estimator.upper()} | {lr:g} | {rewards} | {last['eval/perplexity']:.1f} | "
              f"{last['eval/kl_init']:.2f} | {seconds:.1f} |")
    print()
    for estimator in dict.fromkeys(row[0] for row in rows):
        gains = [evals[-1]["eval/reward"] - evals[0]["eval/reward"] for e, _, evals, _ in rows if e == estimator]
        print(f"- {estimator.upper()} {'learns' if max(gains) >= GAIN else 'does not learn'}: best gain "
              f"{max(gains):+.3f} in 20 iterations (rule: >= {GAIN})")
    fine = [row for row in rows if row[2][-1]["eval/perplexity"] <= PPL_RATIO * row[2][0]["eval/perplexity"]]
    best = max(row[2][-1]["eval/reward"] for row in fine)
    chosen = min((row for row in fine if row[2][-1]["eval/reward"] >= best - TIE), key=lambda row: row[1])
    print(f"- The rule's choice: {chosen[0].upper()} at lr {chosen[1]:g} (held-out reward "
          f"{chosen[2][-1]['eval/reward']:.3f} at 20; the best under perplexity <= {PPL_RATIO:g}x the initial: "
          f"{best:.3f})")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/imdb/results/135m/learning"))
