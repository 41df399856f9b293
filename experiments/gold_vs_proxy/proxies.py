"""How well each proxy learned the gold: its held-out accuracy against the noisy labels it was trained on,
against the gold's own order, and its ECE.

    .venv/bin/python experiments/gold_vs_proxy/proxies.py OUT.json PROXY_DIR...

Each proxy folder was written by ``reward-model train --data <gold pairs>/pairs.jsonl``; its ``reward_model.json``
names the pairs file and the split, so the test pairs are the ones the proxy never saw. The gold's scores of both
continuations are read from the pairs file (``gold_chosen``, ``gold_rejected``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from elastic_reset.data.preferences import read_pairs, split_by_prompt
from elastic_reset.reward_models.reward import PreferenceModelReward


def proxy_numbers(path: Path) -> dict:
    settings = json.loads((path / "reward_model.json").read_text())
    config, metrics = settings["config"], settings["metrics"]
    (pairs_file,) = config["data"]
    gold = {json.loads(line)["prompt"]: json.loads(line) for line in Path(pairs_file).read_text().splitlines()}
    test = split_by_prompt(read_pairs(pairs_file), tuple(config["split"]), seed=config["split_seed"])["test"]
    proxy = PreferenceModelReward(path)
    prompts = [p.prompt for p in test]
    margin = (np.array(proxy(prompts, [p.chosen for p in test])) - np.array(proxy(prompts, [p.rejected for p in test])))
    order = np.array([gold[p.prompt]["gold_chosen"] - gold[p.prompt]["gold_rejected"] for p in test])
    agrees = np.where(order == 0, 0.5, (np.sign(margin) == np.sign(order)).astype(float))
    return {"proxy": str(path), "pairs_file": pairs_file, "advantage": config["advantage"],
            "train_pairs": metrics.get("train_pairs"), "test_pairs": len(test),
            "test_accuracy_vs_labels": metrics["test"]["accuracy"],
            "test_accuracy_se": metrics["test"].get("accuracy_se"),
            "test_ece": metrics["test"]["ece"], "test_accuracy_vs_gold_order": float(agrees.mean()),
            "train_seconds": metrics.get("train_seconds")}


def main(out: Path, paths: list[Path]) -> None:
    rows = [proxy_numbers(p) for p in paths]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print("| proxy | train pairs | test pairs | accuracy vs labels | vs the gold's order | ECE | train s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(r['proxy']).name} | {r['train_pairs']} | {r['test_pairs']} | {r['test_accuracy_vs_labels']:.3f}"
              f" ± {r['test_accuracy_se'] or 0:.3f} | {r['test_accuracy_vs_gold_order']:.3f} | {r['test_ece']:.3f} | "
              f"{r['train_seconds'] or 0:.0f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
