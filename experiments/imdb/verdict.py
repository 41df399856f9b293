"""Does Elastic Reset Pareto-dominate RLOO + KL? The verdict of an IMDB grid, by rules fixed before it ran.

    .venv/bin/python experiments/imdb/verdict.py experiments/imdb/results/135m     # writes verdict.md there

Reads the grid's ``summary.json`` (``experiments/imdb/grid.sh``): per method the final evaluation as mean ± SE over
seeds and the mean frontier (least perplexity on held-out true reviews at each reward level); per pair the shared
reward range and the fraction of it on which each method's frontier is better.

Rules (the reward-model verdict's habits: means ± SE over seeds, frontiers over the shared reward range):
- Method A *Pareto-dominates* B when (1) A's mean frontier has the lower perplexity on at least 90 % of the
  reward range both frontiers cover, and (2) A reaches as far as B: the shared range's top is at least 90 % of the
  way up B's own frontier range (a mean frontier spans the reward levels every seed reached, so one stalled
  seed shortens it). *Is dominated*: the same with A and B swapped. Anything else is a *trade-off*, described by
  the numbers; with no shared range, *no comparison*.
- The paper's claim (§6: Elastic Reset reaches a better reward-drift frontier than PPO + KL; here the KL baseline
  runs RLOO) *holds* when Elastic Reset (the authors' code, ``elastic_reset``) Pareto-dominates RLOO + KL at both β
  (``kl``, ``kl_small``), *holds in part* when it dominates one and is dominated by neither, and *does not hold*
  otherwise; *untestable at this budget* when neither β is separated from it (no shared range, or equal frontiers:
  a wording added after the grids ran, which changes no outcome).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from elastic_reset.evaluation.summary import pareto_claim, pareto_outcome

ER = "elastic_reset"
BASELINES = ("kl", "kl_small")
OTHERS = ("er_paper", "reset_to_init", "reset_to_ema", "nlpo")


def verdict(summary: dict) -> str:
    methods = summary["methods"]
    seeds = sorted({s for entry in methods.values() for s in entry["seeds"]})
    lines = ["# Elastic Reset against RLOO + KL on IMDB (written by experiments/imdb/verdict.py)", "",
             f"Seeds {seeds}; rules in the script's docstring, fixed before the grid ran.", ""]
    outcomes = {}
    for b in (*BASELINES, *OTHERS):
        if ER in methods and b in methods:
            outcome, text = pareto_outcome(summary, ER, b)
            outcomes[b] = outcome
            lines.append(f"- **{ER} vs {b}: {outcome}** — {text}")
    dominated = [b for b in BASELINES if outcomes.get(b) == "dominates"]
    lost = [b for b in BASELINES if outcomes.get(b) == "dominated"]
    claim = pareto_claim(outcomes, BASELINES)
    lines += ["", f"**The paper's claim (Elastic Reset Pareto-dominates RLOO + KL) {claim} at this scale**: it "
              f"dominates {', '.join(dominated) or 'neither β'}"
              + (f" and is dominated by {', '.join(lost)}" if lost else "") + "."]
    return "\n".join(lines) + "\n"


def main(results: Path) -> None:
    text = verdict(json.loads((results / "summary.json").read_text()))
    (results / "verdict.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
