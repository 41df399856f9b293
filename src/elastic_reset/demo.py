"""``elastic-reset demo``: RL without drift control against Elastic Reset on SmolLM2 + LoRA, on the VADER task.

The reward is the VADER positivity of the continuation: easy to hack (a string of "great love wonderful" scores
well), which is the point. Drift is measured for a task without a dataset: perplexity of the policy on text
sampled once from the initial policy (``eval.reference: initial_samples``), and KL to the initial model on fresh
samples.

Both runs use the same RLOO settings, model, seed and samples (``configs/demo.yaml``, chosen because they raise the
held-out reward within a few minutes on a 2-core CPU; see BENCHMARKS.md). The baseline (``none``) has no KL penalty
and no resets: the drift-unconstrained run. Elastic Reset adds only its EMA and resets, so any difference between
the two is the resets'. The demo is a one-seed :func:`~elastic_reset.compare.run_grid`, so it is resumable (run it
again to continue after an interruption) and writes the same report as ``elastic-reset compare``: the Pareto
figure, the reward and drift curves with the resets marked, and ``summary.json``.
"""

from __future__ import annotations

from pathlib import Path

from elastic_reset.io import read_metrics

CONFIG = Path(__file__).resolve().parent / "configs" / "demo.yaml"
METHODS = ["none", "elastic_reset"]


def run_demo(out: str | Path = "demo_out", steps: int | None = None, model: str = "smollm2") -> dict:
    from elastic_reset.compare import run_grid
    from elastic_reset.evaluation.summary import format_dominance

    out = Path(out)
    overrides = [f"model.name={model}"]
    if steps:
        overrides += [f"steps={steps}", f"method.reset_every={max(1, steps // 3)}", f"eval.every={max(1, steps // 6)}"]
    if model.startswith("tiny"):
        overrides += ["model.lora=null", "algo.lr=3e-4"]
    command = ["elastic-reset", "demo", "--out", str(out), "--model", model]
    command += ["--steps", str(steps)] if steps else []
    summary = run_grid(CONFIG, out, METHODS, 1, overrides, command=command)
    results = {name: read_metrics(out / name / "seed0" / "metrics.jsonl") for name in METHODS}
    _print_table(results)
    print()
    for run in summary["runs"]:
        wall = "finished in an earlier call" if run["action"] == "skipped" else f"{run['wall_s'] / 60:.1f} min"
        print(f"wall time, {run['method']}: {wall}")
    print()
    print(format_dominance(summary["dominance"]))
    print(f"\nPareto frontier (reward vs perplexity): {(out / 'pareto.png').resolve()}")
    print(f"Reward and drift over training, resets marked: {(out / 'pareto_curves.png').resolve()}")
    print(f"Runs (config.yaml, metrics.jsonl, checkpoints) and summary.json are in {out.resolve()}")
    return results


def _print_table(results: dict) -> None:
    print("\nvalidation: reward = VADER positivity (higher is better); ppl = perplexity on text the initial policy "
          "wrote and kl = KL to the initial model (lower is less drift)")
    header = f"{'step':>5} " + " ".join(f"| {name:^29}" for name in results)
    print(header)
    print(f"{'':>5} " + " ".join(f"| {'reward':>8} {'ppl':>9} {'kl':>7}  " for _ in results))
    steps = sorted({r["step"] for recs in results.values() for r in recs if "eval/reward" in r})
    for previous, step in zip([-1] + steps, steps):
        cells = []
        for recs in results.values():
            ev = next((r for r in recs if r["step"] == step and "eval/reward" in r), None)
            reset = any(previous < r["step"] <= step and "reset" in r for r in recs)
            cells.append(f"| {ev['eval/reward']:8.3f} {ev['eval/perplexity']:9.2f} {ev['eval/kl_init']:7.2f}"
                         f"{' R' if reset else '  '}" if ev else f"| {'':29}")
        print(f"{step:>5} " + " ".join(cells))
    print("R: a reset happened since the previous row")
    for name, recs in results.items():
        last = [r for r in recs if "eval/sample" in r]
        if last:
            print(f"\n{name}, a validation sample at step {last[-1]['step']}: {last[-1]['eval/sample']!r}")
