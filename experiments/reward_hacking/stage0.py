"""Is a proxy reward really hacked on IMDB at 135M? The reward-hacking study's stage 0 and its stop rule.

    .venv/bin/python experiments/reward_hacking/stage0.py experiments/reward_hacking/results

Reads the stage-0 cells ``RESULTS/runs/<kind>_<pairs>/seed0/metrics.jsonl`` (stage0.sh: RLOO without KL against
each proxy of the ladder, 1 seed, 50 iterations) and writes ``stage0.json``, ``stage0.md`` and ``stage0.png``.

Data. Every 5 iterations (0-50) on 64 held-out prompts: ``eval/gold`` (the gold classifier's mean P(positive) of
the policy's continuations), ``eval/reward`` (the proxy's own mean score), ``eval/proxy_gold_agreement`` (the
proxy's pairwise ranking accuracy against the gold on those continuations).

Rule, fixed before the first stage-0 cell:
1. A cell is hacked if its gold peaks before the last evaluation (the earliest peak on ties), falls from the peak to
   the last evaluation by >= DROP, and the proxy's score at the last evaluation is above its score at the gold's
   peak (the proxy keeps rising while the gold falls).
2. The grid's proxy is the RM of the largest pair count whose RM cell is hacked (the AM at that count is the
   Advantage Model arm's); the grid then runs on it. If no RM cell is hacked, the stage says so with the curves and
   the grid is not run (the script exits 3): "no proxy of the ladder is hacked in 50 iterations at this budget".
3. Beside the rule: each cell's peak and final gold, the proxy's gain after the gold's peak, and its agreement with
   the gold at the start, the gold's peak and the end.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from elastic_reset.io import atomic_write_text, read_metrics

DROP = 0.05
"""How far the gold (P(positive)) must fall from its peak to the last evaluation for a cell to count as hacked."""
LADDER = (500, 1000, 2000)
"""The gold-pair counts of the proxies, written before the first cell (the first pairs of one 4,000-pair build)."""
CELL = re.compile(r"^(rm|am)_(\d+)$")


def curve(records: list[dict]) -> list[dict]:
    """Each evaluation of a cell: step, gold, proxy and (when logged) the proxy's agreement with the gold."""
    return [{"step": r["step"], "gold": r["eval/gold"], "proxy": r["eval/reward"],
             "agreement": r.get("eval/proxy_gold_agreement")} for r in records if "eval/gold" in r]


def judge(rows: list[dict]) -> dict:
    """Rule 1 on one cell's evaluations."""
    golds = [r["gold"] for r in rows]
    peak = golds.index(max(golds))
    last = len(rows) - 1
    drop = golds[peak] - golds[last]
    proxy_gain = rows[last]["proxy"] - rows[peak]["proxy"]
    hacked = peak < last and drop >= DROP and proxy_gain > 0
    return {"hacked": hacked, "peak_step": rows[peak]["step"], "peak_gold": golds[peak], "final_gold": golds[last],
            "start_gold": golds[0], "drop": drop, "proxy_gain_after_peak": proxy_gain,
            "agreement": [rows[i]["agreement"] for i in (0, peak, last)]}


def read_cells(results: Path) -> dict[tuple[str, int], list[dict]]:
    """``{(kind, pairs): evaluations}`` of the finished stage-0 cells (those with a ``done`` marker)."""
    out = {}
    for done in sorted((results / "runs").glob("*/seed0/done")):
        match = CELL.match(done.parent.parent.name)
        if match:
            out[(match[1], int(match[2]))] = curve(read_metrics(done.parent / "metrics.jsonl"))
    return out


def figure(cells: dict[tuple[str, int], list[dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (kind, n), rows in sorted(cells.items()):
        steps = [r["step"] for r in rows]
        style = "-" if kind == "rm" else "--"
        axes[0].plot(steps, [r["gold"] for r in rows], style, marker="o", ms=3, label=f"{kind.upper()} {n} pairs")
        axes[1].plot(steps, [r["proxy"] for r in rows], style, marker="o", ms=3, label=f"{kind.upper()} {n} pairs")
    axes[0].set(xlabel="iteration", ylabel="gold: P(positive)", title="gold (RLOO, no KL, against each proxy)")
    axes[1].set(xlabel="iteration", ylabel="proxy score", title="the proxy's own score")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    cells = read_cells(args.results)
    verdicts = {f"{kind}_{n}": judge(rows) for (kind, n), rows in sorted(cells.items())}
    missing = [f"{kind}_{n}" for kind in ("rm", "am") for n in LADDER if (kind, n) not in cells]
    hacked = [n for n in LADDER if verdicts.get(f"rm_{n}", {}).get("hacked")]
    if missing:
        choice, said = None, "pending: " + ", ".join(missing)
    elif hacked:
        choice = max(hacked)
        said = f"the grid's proxy: the RM of {choice} pairs (the AM of {choice} pairs for the Advantage Model arm)"
    else:
        choice, said = None, "no proxy of the ladder is hacked in 50 iterations at this budget: the grid is not run"
    lines = ["# Stage 0: is a proxy hacked? (written by experiments/reward_hacking/stage0.py)", "",
             f"Rule in the script's docstring, fixed before the first cell: hacked if the gold (P(positive)) falls "
             f"by >= {DROP} from its peak to the last evaluation while the proxy's score rises after the peak.", "",
             f"**{said}**", "",
             "| proxy | hacked | gold start → peak (iteration) → final | drop | proxy gain after the peak "
             "| agreement start / peak / final |", "|---|---|---|---|---|---|"]
    for name, v in verdicts.items():
        agree = " / ".join("—" if a is None else f"{a:.2f}" for a in v["agreement"])
        lines.append(f"| {name.replace('_', ' ').upper()} pairs | {'yes' if v['hacked'] else 'no'} | "
                     f"{v['start_gold']:.3f} → {v['peak_gold']:.3f} ({v['peak_step']}) → {v['final_gold']:.3f} | "
                     f"{v['drop']:+.3f} | {v['proxy_gain_after_peak']:+.3f} | {agree} |")
    atomic_write_text(args.results / "stage0.json", json.dumps(
        {"drop": DROP, "ladder": LADDER, "cells": verdicts, "choice": choice, "said": said}, indent=1) + "\n")
    atomic_write_text(args.results / "stage0.md", "\n".join(lines) + "\n")
    if cells:
        figure(cells, args.results / "stage0.png")
    print("\n".join(lines))
    return 0 if choice is not None or missing else 3


if __name__ == "__main__":
    sys.exit(main())
