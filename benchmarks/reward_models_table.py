"""Issue 12's table: RM against AM per backbone (mean ± standard error over seeds) of test accuracy, ECE and the
per-category score statistics, plus one reliability diagram per backbone, into results/reward-models/.

Test metrics come from ``<model>/evaluation.json`` where ``elastic-reset reward-model evaluate`` wrote one (it
adds accuracy and ECE per preference set: paper 2's Table 1 reports HH-RLHF alone), else from the training run.
"Category spread" is the largest minus the smallest of the per-category mean scores on test (helpful, harmless,
beer, coffee): paper 2 argues that the AM keeps score distributions comparable across tasks (its Fig. 1 and 3),
so its spread should be the smaller one.

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


def category_spread(categories: dict) -> float:
    means = [c["mean"] for c in categories.values()]
    return max(means) - min(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid")
    parser.add_argument("--out", default="results/reward-models")
    args = parser.parse_args()
    out = Path(args.out)
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for settings_file in sorted(Path(args.grid).glob("*/reward_model.json")):
        settings = json.loads(settings_file.read_text())
        config, metrics = settings["config"], settings["metrics"]
        evaluation = settings_file.parent / "evaluation.json"
        if evaluation.is_file():
            metrics = {**metrics, "test": json.loads(evaluation.read_text())["test"]}
        runs[(config["backbone"], "AM" if config["advantage"] else "RM")].append(metrics)
        (out / "runs").mkdir(parents=True, exist_ok=True)
        shutil.copy(settings_file, out / "runs" / f"{settings_file.parent.name}.json")
        if evaluation.is_file():
            shutil.copy(evaluation, out / "runs" / f"{settings_file.parent.name}.evaluation.json")
    if not runs:
        raise SystemExit(f"{args.grid}: no finished reward models")
    lines = ["| backbone | model | seeds | test accuracy | test ECE | HH-RLHF accuracy | HH-RLHF ECE | category spread "
             "| train time (s) | score mean ± std per category |", "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for (backbone, kind), metrics in sorted(runs.items()):
        cats = sorted(metrics[0]["test"]["categories"])
        per_cat = ", ".join(
            f"{c} {sum(m['test']['categories'][c]['mean'] for m in metrics) / len(metrics):+.2f} ± "
            f"{sum(m['test']['categories'][c]['std'] for m in metrics) / len(metrics):.2f}" for c in cats)
        acc = [m["test"]["accuracy"] for m in metrics]
        ece = [m["test"]["ece"] for m in metrics]
        hh = [m["test"]["datasets"]["hh-rlhf"] for m in metrics if "hh-rlhf" in m["test"].get("datasets", {})]
        hh_acc = mean_se([h["accuracy"] for h in hh]) if len(hh) == len(metrics) else "–"
        hh_ece = mean_se([h["ece"] for h in hh]) if len(hh) == len(metrics) else "–"
        spread = [category_spread(m["test"]["categories"]) for m in metrics]
        secs = sum(m["train_seconds"] for m in metrics) / len(metrics)
        lines.append(f"| {backbone} | {kind} | {len(metrics)} | {mean_se(acc)} | {mean_se(ece)} | {hh_acc} | {hh_ece} "
                     f"| {mean_se(spread)} | {secs:.0f} | {per_cat} |")
        summary[f"{backbone}/{kind}"] = {"seeds": len(metrics), "test_accuracy": acc, "test_ece": ece,
                                         "test_datasets": [m["test"].get("datasets") for m in metrics],
                                         "category_spread": spread,
                                         "categories": [m["test"]["categories"] for m in metrics]}
    for backbone in sorted({b for b, _ in runs}):
        plot_reliability({kind: runs[(b, kind)] for b, kind in sorted(runs) if b == backbone},
                         out / f"reliability_{backbone}.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
