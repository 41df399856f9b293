"""Issue 12's table: RM against AM per backbone (mean ± standard error over seeds) of test accuracy, ECE and the
per-category score statistics, plus one reliability diagram per backbone, into results/reward-models/.

    .venv/bin/python benchmarks/reward_models_table.py runs/reward-models [--out results/reward-models]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

from elastic_reset.evaluation.figures import plot_reliability


def mean_se(values: list[float]) -> str:
    m = sum(values) / len(values)
    if len(values) < 2:
        return f"{m:.3f}"
    se = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))
    return f"{m:.3f} ± {se:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid")
    parser.add_argument("--out", default="results/reward-models")
    args = parser.parse_args()
    out = Path(args.out)
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for settings_file in sorted(Path(args.grid).glob("*/reward_model.json")):
        settings = json.loads(settings_file.read_text())
        config = settings["config"]
        runs[(config["backbone"], "AM" if config["advantage"] else "RM")].append(settings["metrics"])
        (out / "runs").mkdir(parents=True, exist_ok=True)
        shutil.copy(settings_file, out / "runs" / f"{settings_file.parent.name}.json")
    if not runs:
        raise SystemExit(f"{args.grid}: no finished reward models")
    lines = ["| backbone | model | seeds | test accuracy | test ECE | train time (s) | score mean ± std per category |",
             "|---|---|---|---|---|---|---|"]
    summary = {}
    for (backbone, kind), metrics in sorted(runs.items()):
        cats = sorted(metrics[0]["test"]["categories"])
        per_cat = ", ".join(
            f"{c} {sum(m['test']['categories'][c]['mean'] for m in metrics) / len(metrics):+.2f} ± "
            f"{sum(m['test']['categories'][c]['std'] for m in metrics) / len(metrics):.2f}" for c in cats)
        acc = [m["test"]["accuracy"] for m in metrics]
        ece = [m["test"]["ece"] for m in metrics]
        secs = sum(m["train_seconds"] for m in metrics) / len(metrics)
        lines.append(f"| {backbone} | {kind} | {len(metrics)} | {mean_se(acc)} | {mean_se(ece)} | {secs:.0f} | "
                     f"{per_cat} |")
        summary[f"{backbone}/{kind}"] = {"seeds": len(metrics), "test_accuracy": acc, "test_ece": ece,
                                         "categories": [m["test"]["categories"] for m in metrics]}
    for backbone in sorted({b for b, _ in runs}):
        plot_reliability({kind: runs[(b, kind)] for b, kind in sorted(runs) if b == backbone},
                         out / f"reliability_{backbone}.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
