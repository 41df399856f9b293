"""What gradient regularisation (``method.name: gradient_reg``) costs per update, against the plain update.

Trains the same seeded run twice in this process, one after the other: ``kl`` and ``gradient_reg`` (the finite
difference: a second forward and backward at the perturbed weights on the same samples), and reads each
iteration's ``time/update`` and whole-step time from the trainer's records. The first iteration (warm-up) is
dropped; medians of the rest, and their ratio. Set-ups: the demo's SmolLM2-135M + LoRA (``configs/demo.yaml``) and
the same model with every weight trained (``--full``).

    .venv/bin/python benchmarks/bench_gradient_reg.py --steps 6 --out benchmarks/results/gradient_reg.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
from pathlib import Path

from elastic_reset.lm.device import describe_machine
from elastic_reset.rl.config import load_config
from elastic_reset.rl.trainer import RLTrainer

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def timed(overrides: list[str], steps: int) -> dict[str, float]:
    config = load_config(CONFIG, [f"steps={steps}", "eval.every=0", "checkpoint_every=0", "progress=false",
                                  "threads=2", *overrides])
    with tempfile.TemporaryDirectory() as out:
        records = [r for r in RLTrainer(config, Path(out) / "run").train() if "time/update" in r][1:]
    step = [sum(v for k, v in r.items() if k.startswith("time/")) for r in records]
    return {"update_s": statistics.median(r["time/update"] for r in records), "step_s": statistics.median(step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = {}
    for setup, extra in (("lora", []), ("full", ["model.lora=null", "algo.lr=1e-5"])):
        plain = timed(["method.name=kl", *extra], args.steps)
        gr = timed(["method.name=gradient_reg", "method.strength=0.01", *extra], args.steps)
        rows[setup] = {"kl": plain, "gradient_reg": gr, "update_ratio": gr["update_s"] / plain["update_s"],
                       "step_ratio": gr["step_s"] / plain["step_s"]}
        print(f"{setup}: update {plain['update_s']:.2f} s -> {gr['update_s']:.2f} s "
              f"({rows[setup]['update_ratio']:.2f}x); step {plain['step_s']:.2f} s -> {gr['step_s']:.2f} s "
              f"({rows[setup]['step_ratio']:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps({"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                        "machine": describe_machine(), "steps": args.steps, "rows": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
