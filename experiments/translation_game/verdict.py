"""Does Elastic Reset give the best task / drift trade-off in the Translation Game? The verdict of
``experiments/translation_game/grid.sh``, by rules fixed before the grid ran.

    .venv/bin/python experiments/translation_game/verdict.py experiments/translation_game/results/grid  # verdict.md there

Reads ``summary.json`` (compare with ``--score task_bleu --drift drift_bleu``: per method the final validation
FR→EN→DE BLEU, the task, and FR→EN BLEU, the drift, higher is better, as mean ± SE over seeds; the mean frontiers;
every pair's comparison; the test split's scores, taken once on the final weights) and ``build_metrics.json``
(the PRETRAINED row).

Rules:
(0) Learning first: REINFORCE's final validation task BLEU must exceed FROZEN ENGLISH's by at least 1.0 BLEU and by
    more than twice the standard error of the difference (√(SE₁² + SE₂²)). FROZEN ENGLISH is the listener adapting
    alone, so this is the speaker's own gain. Otherwise: "no task gain", nothing is compared (the issue's stop rule).
    With fewer than two seeds of either there is no standard error, and no verdict yet (made explicit 2026-11-27,
    before any verdict was drawn: a partial grid's report had read one seed's SE as 0).
(1) Pareto-dominance (:func:`elastic_reset.evaluation.summary.pareto_outcome`, the IMDB verdict's rule): A dominates
    B when A's mean frontier has the higher drift BLEU on at least 90 % of the task-BLEU range both cover, and that
    range reaches at least 90 % of the way up B's own.
(2) Elastic Reset gives the best trade-off (the paper's Table 1 and Figure 3c) when it dominates every learning
    baseline (reinforce, kl_lm, multitask, reset_to_init, reset_to_ema; FROZEN ENGLISH leaves the speaker as it was
    and is reported beside): the claim *holds*; *in part* when it dominates at least one and none dominates it;
    *does not hold* otherwise; *untestable at this budget* when no baseline is separated from it (no shared range,
    or frontiers that differ nowhere on it, e.g. all still at the start's point: a wording added after the grid
    ran; the rule's outcomes are unchanged).
The table: PRETRAINED, then each method's final validation and test scores, mean ± SE over seeds (Table 1's form).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from elastic_reset.evaluation.summary import pareto_claim, pareto_outcome

ER = "elastic_reset"
BASELINES = ("reinforce", "kl_lm", "multitask", "reset_to_init", "reset_to_ema")
MIN_GAIN = 1.0


def verdict(results: Path) -> str:
    summary = json.loads((results / "summary.json").read_text())
    methods = summary["methods"]
    lines = ["# The Translation Game: Elastic Reset against the baselines",
             "", "Written by experiments/translation_game/verdict.py; rules in its docstring, fixed before the grid "
             "ran.", "",
             "| method | val FR→EN→DE (task) | val FR→EN (drift) | test task | test drift | seeds |",
             "|---|---|---|---|---|---|"]
    build = results / "build_metrics.json"
    if build.is_file():
        pre = json.loads(build.read_text())["pretrained"]
        lines.append(f"| PRETRAINED | {pre['val']['task_bleu']:.1f} | {pre['val']['drift_bleu']:.1f} | "
                     f"{pre['test']['task_bleu']:.1f} | {pre['test']['drift_bleu']:.1f} | – |")
    def pm(entry: dict | None, n: int) -> str:
        return "–" if entry is None else f"{entry['mean']:.1f}" + (f" ± {entry['se']:.1f}" if n > 1 else "")

    for name, entry in methods.items():
        n = entry["n_seeds"]
        lines.append(f"| {name} | {pm(entry['final_reward'], n)} | {pm(entry['final_drift'], n)} | "
                     f"{pm(entry.get('test_score'), n)} | {pm(entry.get('test_drift'), n)} | {n} |")
    lines.append("")
    seeds = min(methods["reinforce"]["n_seeds"], methods["frozen"]["n_seeds"])
    if seeds < 2:
        lines.append(f"(0) REINFORCE over FROZEN ENGLISH: {seeds} seed: no standard error, no verdict yet")
        return "\n".join(lines) + "\n"
    reinforce, frozen = methods["reinforce"]["final_reward"], methods["frozen"]["final_reward"]
    gain = reinforce["mean"] - frozen["mean"]
    noise = 2 * math.hypot(reinforce["se"], frozen["se"])
    learned = gain >= MIN_GAIN and gain > noise
    lines.append(f"(0) REINFORCE over FROZEN ENGLISH: {gain:+.2f} task BLEU (needed ≥ {MIN_GAIN} and > 2 SE = "
                 f"{noise:.2f}): " + ("the speaker learns" if learned else "no task gain: nothing is compared"))
    if learned:
        outcomes = {}
        for b in BASELINES:
            if b in methods and ER in methods:
                outcomes[b], text = pareto_outcome(summary, ER, b)
                lines.append(f"(1) **{ER} vs {b}: {outcomes[b]}** — {text}")
        beats = [b for b, o in outcomes.items() if o == "dominates"]
        beaten = [b for b, o in outcomes.items() if o == "dominated"]
        claim = pareto_claim(outcomes, BASELINES)
        lines.append(f"(2) **Elastic Reset's best trade-off {claim}**: it dominates {', '.join(beats) or 'none'}"
                     + (f"; dominated by {', '.join(beaten)}" if beaten else "") + ".")
    return "\n".join(lines) + "\n"


def main(results: Path) -> None:
    text = verdict(results)
    (results / "verdict.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
