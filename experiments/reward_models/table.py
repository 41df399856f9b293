"""The reward-model table: RM against AM per backbone (mean ± standard error over seeds) of test accuracy, ECE and the
per-category score statistics, plus one reliability diagram per backbone, into experiments/reward_models/results/.

Test metrics come from ``<model>/evaluation.json`` where ``elastic-reset reward-model evaluate`` wrote one (it
adds accuracy and ECE per preference set: paper 2's Table 1 reports HH-RLHF alone), else from the training run.
"Category spread" is the largest minus the smallest of the per-category mean scores on test (helpful, harmless,
beer, coffee): paper 2 argues that the AM keeps score distributions comparable across tasks (its Fig. 1 and 4),
so its spread should be the smaller one. A model whose scores are all small has a small spread whatever it does,
so the spread is also given in units of the standard deviation of all its test scores ("spread / std").
"Confidence" is the mean max(p, 1 − p): a model that says p ≈ 0.5 for every pair has a small ECE however little
it knows; the log loss (mean −log σ(Δ), ln 2 = 0.693 for a coin) weighs calibration and discrimination together.
"± prompts" is the accuracy's standard error over the test split's prompts (cluster-robust: Stack Exchange pairs
share questions), averaged over seeds: the noise of one test split, which the ± over seeds does not show.

    .venv/bin/python experiments/reward_models/table.py runs/reward-models [--out experiments/reward_models/results]

``verdict.md`` tests paper 2's three claims per backbone by fixed rules (:func:`verdicts`), so that the verdict
follows the numbers as seeds come in rather than being written to fit them.

Every finished model's settings and metrics are kept (copied) in ``<out>/runs/``, and the table is made from those
with the grid's: a grid run one model per machine or session (whose ``runs/`` is gone by the next) adds up.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from elastic_reset.evaluation.figures import plot_reliability


def estimate(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error over seeds (None for one seed: the spread between seeds is then unknown)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))


def mean_se(values: list[float]) -> str:
    m, se = estimate(values)
    return f"{m:.3f}" if se is None else f"{m:.3f} ± {se:.3f}"


def column(values: list) -> str:
    """Mean ± SE, or "–" where a model's evaluation predates the metric (re-run ``reward-model evaluate --force``)."""
    return "–" if any(v is None for v in values) else mean_se(values)


def category_spread(categories: dict) -> float:
    means = [c["mean"] for c in categories.values()]
    return max(means) - min(means)


def pooled_std(categories: dict) -> float:
    """The standard deviation of all the responses' scores, from each category's mean, std and count."""
    n = sum(c["responses"] for c in categories.values())
    mean = sum(c["mean"] * c["responses"] for c in categories.values()) / n
    return math.sqrt(sum(c["responses"] * (c["std"] ** 2 + (c["mean"] - mean) ** 2) for c in categories.values()) / n)


PAPER = ("Peng et al. 2023 (paper 2), Table 1 on HH-RLHF at 7B: accuracy AM 69.43 % vs RM 69.25 %, ECE 3.48 % vs "
         "4.70 %; Fig. 1 and 4: the AM's score distributions are comparable across tasks")


@dataclass
class Difference:
    """AM − RM of one metric over seeds, and what it says."""

    text: str
    """The difference as "x ± se" (or "x" with one seed on either side)."""
    am_better: bool
    """Whether it points the AM's way (lower or higher, as the metric goes)."""
    significant: bool | None
    """Beyond 2 standard errors over seeds; None with one seed on either side (no error to judge by)."""

    def word(self) -> str:
        better = "AM better" if self.am_better else "RM better"
        if self.significant is None:
            return better + " at one seed (no error over seeds yet)"
        return better + (" beyond 2 standard errors" if self.significant else ", within 2 standard errors")

    def claim(self) -> str:
        """The verdict on a claim that the AM is better."""
        if self.significant is None:
            return "not yet decided (one seed)"
        if self.significant:
            return "holds" if self.am_better else "does not hold (reversed)"
        return "in the paper's direction, not significant" if self.am_better else \
            "not supported (reversed, not significant)"


def compare(am: list[float], rm: list[float], lower_is_better: bool) -> Difference:
    """AM − RM of a metric by which the AM is better when its value is lower (``lower_is_better``) or higher."""
    (a, sa), (r, sr) = estimate(am), estimate(rm)
    diff = a - r
    better = diff < 0 if lower_is_better else diff > 0
    if sa is None or sr is None:
        return Difference(f"{diff:+.3f}", better, None)
    se = math.hypot(sa, sr)
    return Difference(f"{diff:+.3f} ± {se:.3f}", better, abs(diff) > 2 * se)


def above_chance(accuracies: list[float], split_se: float) -> tuple[bool, float]:
    """Whether a model's mean accuracy is above 0.5 by more than 2 standard errors, the error counting both the
    seeds and the test split (every seed is scored on the same split, so its sampling error does not average out
    over seeds). Returns (above, the mean, the error)."""
    m, se_seeds = estimate(accuracies)
    se = math.hypot(se_seeds or 0.0, split_se)
    return m - 2 * se > 0.5, m, se


def verdicts(summary: dict) -> list[str]:
    """Markdown lines: per backbone with both models, paper 2's three claims tested on the test split."""
    lines = ["# Paper 2's claims at this scale (written by experiments/reward_models/table.py)", "", PAPER + ".", "",
             "Rules: a difference AM − RM counts when it is beyond 2 standard errors over seeds (all seeds share one "
             "test split); a model learns HH-RLHF when its mean accuracy there is above 0.5 by more than 2 standard "
             "errors (seeds and the split's sampling error, binomial over its pairs).", ""]
    for backbone in sorted({key.split("/")[0] for key in summary}):
        am, rm = summary.get(f"{backbone}/AM"), summary.get(f"{backbone}/RM")
        if am is None or rm is None:
            continue
        seeds = min(am["seeds"], rm["seeds"])
        lines += [f"## {backbone}: AM {am['seeds']} seed(s), RM {rm['seeds']} seed(s)"
                  + (" — provisional until both have 3" if seeds < 3 else ""), ""]
        if any("hh-rlhf" not in (d or {}) for s in (am, rm) for d in s["test_datasets"]):
            lines += ["- No HH-RLHF numbers for every model: run `elastic-reset reward-model evaluate <model> "
                      "--force`.",
                      ""]
            continue
        hh = {kind: [d["hh-rlhf"] for d in s["test_datasets"]] for kind, s in (("AM", am), ("RM", rm))}
        learns = {}
        for kind, sets in hh.items():
            acc = [h["accuracy"] for h in sets]
            split_se = math.sqrt(0.25 / sets[0]["pairs"])
            above, mean, se = above_chance(acc, split_se)
            learns[kind] = above
            lines.append(f"- {kind} on HH-RLHF test ({sets[0]['pairs']} pairs): accuracy {mean:.3f} ± {se:.3f}: "
                         + ("above chance" if above else "not above chance"))
        acc = compare([h["accuracy"] for h in hh["AM"]], [h["accuracy"] for h in hh["RM"]], False)
        if not any(learns.values()):
            lines.append(f"- **Accuracy (AM ≥ RM): cannot be tested** — neither model learns HH-RLHF (AM − RM = "
                         f"{acc.text}, {acc.word()}).")
        else:
            holds = acc.am_better or not acc.significant
            lines.append(f"- **Accuracy (AM ≥ RM): {'holds' if holds else 'does not hold'}** — AM − RM = {acc.text}, "
                         f"{acc.word()}.")
        ece, loss, sure = (compare([h[key] for h in hh["AM"]], [h[key] for h in hh["RM"]], True)
                           for key in ("ece", "log_loss", "confidence"))
        lines.append(f"- **Calibration (AM's ECE lower): {ece.claim()}** — HH-RLHF ECE AM − RM = {ece.text}, "
                     f"{ece.word()}; log loss (a proper scoring rule: calibration and discrimination together) AM − RM"
                     f" = {loss.text}, {loss.word()}; mean confidence AM − RM = {sure.text} (a model that says p ≈ 0.5 "
                     "everywhere has a small ECE whatever it knows).")
        spread = compare(am["category_spread_over_std"], rm["category_spread_over_std"], True)
        lines.append(f"- **Comparable scores across tasks (AM's per-category spread smaller): {spread.claim()}** — "
                     f"spread of the per-category mean scores in units of the model's score std, AM − RM = "
                     f"{spread.text}, {spread.word()}.")
        lines.append("")
    return lines


def finished_models(grid: Path, kept: Path) -> dict[str, tuple[dict, dict | None]]:
    """``{name: (settings, evaluation or None)}`` of every finished model: those in ``grid`` (each copied into
    ``kept``, weights left out), and those of earlier runs kept there whose folders are gone (a grid run across
    machines or sessions, one model at a time). A model in ``grid`` replaces its kept copy."""
    for settings_file in sorted(grid.glob("*/reward_model.json")):
        name, evaluation = settings_file.parent.name, settings_file.parent / "evaluation.json"
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(settings_file, kept / f"{name}.json")
        if evaluation.is_file():
            shutil.copy(evaluation, kept / f"{name}.evaluation.json")
        else:  # an older copy's evaluation would be read with this model's settings
            (kept / f"{name}.evaluation.json").unlink(missing_ok=True)
    models = {}
    for settings_file in kept.glob("*.json"):
        if not settings_file.name.endswith(".evaluation.json"):
            evaluation = kept / f"{settings_file.stem}.evaluation.json"
            models[settings_file.stem] = (json.loads(settings_file.read_text()),
                                          json.loads(evaluation.read_text()) if evaluation.is_file() else None)
    return dict(sorted(models.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid")
    parser.add_argument("--out", default="experiments/reward_models/results")
    args = parser.parse_args()
    out = Path(args.out)
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for settings, evaluation in finished_models(Path(args.grid), out / "runs").values():
        config, metrics = settings["config"], settings["metrics"]
        if evaluation is not None:
            metrics = {**metrics, "test": evaluation["test"]}
        runs[(config["backbone"], "AM" if config["advantage"] else "RM")].append(metrics)
    if not runs:
        raise SystemExit(f"{args.grid}: no finished reward models (and none kept in {out / 'runs'})")
    lines = ["| backbone | model | seeds | test accuracy | ± prompts | ECE | log loss | confidence | HH-RLHF accuracy "
             "| HH-RLHF ECE | HH-RLHF log loss | Stack Exchange accuracy | category spread | spread / std "
             "| train time (s) | score mean ± std per category |",
             "|---" * 16 + "|"]
    summary = {}
    for (backbone, kind), metrics in sorted(runs.items()):
        tests = [m["test"] for m in metrics]
        cats = sorted(tests[0]["categories"])
        per_cat = ", ".join(
            f"{c} {sum(t['categories'][c]['mean'] for t in tests) / len(tests):+.2f} ± "
            f"{sum(t['categories'][c]['std'] for t in tests) / len(tests):.2f}" for c in cats)
        hh, se = ([t.get("datasets", {}).get(name) or {} for t in tests] for name in ("hh-rlhf", "stack-exchange"))
        cells = [column([t.get(key) for t in tests]) for key in ("accuracy", "ece", "log_loss", "confidence")]
        se_prompts = [t.get("accuracy_se") for t in tests]
        cells.insert(1, "–" if None in se_prompts else f"{sum(se_prompts) / len(se_prompts):.3f}")
        cells += [column([h.get(key) for h in hh]) for key in ("accuracy", "ece", "log_loss")]
        cells.append(column([s.get("accuracy") for s in se]))
        spread = [category_spread(t["categories"]) for t in tests]
        relative = [d / pooled_std(t["categories"]) for d, t in zip(spread, tests)]
        secs = sum(m["train_seconds"] for m in metrics) / len(metrics)
        lines.append(f"| {backbone} | {kind} | {len(metrics)} | " + " | ".join(cells)
                     + f" | {mean_se(spread)} | {mean_se(relative)} | {secs:.0f} | {per_cat} |")
        summary[f"{backbone}/{kind}"] = {
            "seeds": len(metrics), **{f"test_{key}": [t.get(key) for t in tests]
                                      for key in ("accuracy", "accuracy_se", "ece", "log_loss", "confidence")},
            "test_datasets": [t.get("datasets") for t in tests], "category_spread": spread,
            "category_spread_over_std": relative,
            "categories": [t["categories"] for t in tests]}
    for backbone in sorted({b for b, _ in runs}):
        plot_reliability({kind: runs[(b, kind)] for b, kind in sorted(runs) if b == backbone},
                         out / f"reliability_{backbone}.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    verdict = verdicts(summary)
    (out / "verdict.md").write_text("\n".join(verdict).rstrip() + "\n")
    print("\n".join(lines + [""] + verdict))


if __name__ == "__main__":
    main()
