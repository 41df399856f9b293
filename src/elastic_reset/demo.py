"""``elastic-reset demo``: PPO with a KL penalty against Elastic Reset on SmolLM2 + LoRA, on the VADER task.

Both runs start from the same model and seed; Elastic Reset uses a 10x smaller KL coefficient (as the paper does,
§6) and resets twice. The table shows validation reward (VADER positivity) and drift (perplexity on held-out
human sentences, KL to the initial model) over training, with the resets marked.
"""

from __future__ import annotations

from pathlib import Path

from elastic_reset.rl.checkpoint import read_metrics
from elastic_reset.rl.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
RUNS = {"kl": ["method.name=kl"], "elastic_reset": ["method.name=elastic_reset", "kl.coef=0.005"]}


def run_demo(out: str | Path = "demo_out", steps: int | None = None, model: str = "smollm2") -> dict:
    from elastic_reset.rl.trainer import RLTrainer

    out = Path(out)
    results = {}
    for name, overrides in RUNS.items():
        extra = [f"model.name={model}"] + ([f"steps={steps}"] if steps else [])
        if model.startswith("tiny"):
            extra += ["model.lora=null", "algo.lr=3e-4"]
        config = load_config(CONFIG, overrides + extra)
        if steps:
            config.method.reset_every = max(1, steps // 3)
            config.eval.every = max(1, steps // 6)
        run_dir = out / name
        print(f"\n== {name}: {run_dir}")
        RLTrainer(config, run_dir, resume=run_dir.exists()).train()
        results[name] = read_metrics(run_dir / "metrics.jsonl")
    _print_table(results)
    print(f"\nRuns (config.yaml, metrics.jsonl, checkpoints) are in {out.resolve()}")
    return results


def _print_table(results: dict) -> None:
    print("\nvalidation: reward = VADER positivity (higher is better); ppl = perplexity on held-out sentences and "
          "kl = KL to the initial model (lower is less drift)")
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
