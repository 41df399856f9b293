"""Cost of Elastic Reset, and of each anchor preset, relative to one training step of SmolLM2-135M.

Measures, on the CPU, with a fixed number of torch threads:

- one training step: forward + backward on 16 sequences x 48 random token ids (labels = inputs), then
  ``optimizer.step()`` and ``optimizer.zero_grad()``;
- ``ElasticReset.update()`` (the fused EMA lerp), in a tight loop;
- ``ElasticReset.reset()`` in mode ``elastic`` (θ ← θ̄, θ̄ ← θ0) and in mode ``ema`` (θ ← θ̄ only); both include
  the ‖θ − θ̄‖ computed for the reset's event, which is also timed alone;
- ``ElasticReset.step()`` amortised with a reset every 17 steps: measured over blocks of 17 consecutive calls,
  and derived as update + reset/17;
- in the loop: ``update()`` and ``reset()`` timed right after each timed train step (cold caches, as in a real
  training loop), and (update + reset/17) / train step taken per pair, so that a load from other processes that
  drifts during the run affects both sides of each ratio alike.

for three set-ups: (a) full fine-tuning in fp32 (AdamW over all 134.5M parameters), (b) LoRA via peft (r=16,
alpha=32, q_proj and v_proj) in fp32, and (c) the same LoRA with a bf16 autocast forward, as the engine runs it.
Each :class:`~elastic_reset.core.Anchor` preset is timed the same way in the loop: ``update()`` and ``pull()``
after each timed train step, (update + pull/17) / train step per pair. An optional fourth, ``full_bf16`` (a bf16
model, AdamW over all parameters, fp32 EMA), exercises the dtype conversion path (``--configs full_bf16``).

Each figure is a median over ``--repeats`` runs after warm-up, timed with ``time.perf_counter``. The script prints a
markdown table and writes the numbers, with the machine and date, as JSON (``--out``).

    .venv/bin/python benchmarks/bench_core.py
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from elastic_reset.core import PRESETS, Anchor
from elastic_reset.core.elastic_reset import ElasticReset
from elastic_reset.models import load_smollm2

BATCH, SEQ_LEN = 16, 48
DECAY, RESET_EVERY = 0.995, 17
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
LR_FULL, LR_LORA = 1e-5, 1.41e-5
TARGETS_PCT = {"full_fp32": 1.0, "full_bf16": 1.0, "lora_fp32": 0.05, "lora_bf16": 0.05}
ALL_CONFIGS = ("full_fp32", "lora_fp32", "lora_bf16", "full_bf16")
DEFAULT_CONFIGS = ("full_fp32", "lora_fp32", "lora_bf16")
DESCRIPTIONS = {
    "full_fp32": "full fine-tuning, fp32, AdamW over all params",
    "lora_fp32": "LoRA r=16 (q,v), fp32",
    "lora_bf16": "LoRA r=16 (q,v), bf16 autocast forward",
    "full_bf16": "full fine-tuning, bf16 weights, AdamW over all params (fp32 EMA: conversion path)",
}


# ------------------------------------------------------------------------------------------------------ timing
def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_ms(fn, warmup: int, repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return [_timed(fn) for _ in range(repeats)]


def summary(samples: list[float]) -> dict:
    return {
        "median_ms": statistics.median(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "n": len(samples),
        "samples_ms": [round(s, 4) for s in samples],
    }


# ------------------------------------------------------------------------------------------------------ machine
def machine_info(threads: int) -> dict:
    from elastic_reset.lm.device import describe_machine

    return {**describe_machine(), "torch_threads": torch.get_num_threads(), "threads_requested": threads}


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------------ set-ups
def build(config: str):
    """(model, optimizer, autocast context factory) for one set-up."""
    if config in ("full_fp32", "full_bf16"):
        dtype = torch.bfloat16 if config == "full_bf16" else torch.float32
        model, _ = load_smollm2(dtype)
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR_FULL)
        return model, opt, contextlib.nullcontext
    from peft import LoraConfig

    from elastic_reset.lm.lora import add_lora

    base, _ = load_smollm2(torch.float32)
    model = add_lora(base, LoraConfig(task_type="CAUSAL_LM", bias="none", **LORA))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR_LORA)
    if config == "lora_bf16":
        return model, opt, lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return model, opt, contextlib.nullcontext


def bench_config(config: str, args, ids: torch.Tensor) -> dict:
    print(f"\n== {config}: {DESCRIPTIONS[config]}", flush=True)
    t0 = time.perf_counter()
    model, opt, autocast = build(config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    result: dict = {
        "description": DESCRIPTIONS[config],
        "trainable_params": sum(p.numel() for p in trainable),
        "trainable_tensors": len(trainable),
        "param_dtype": str(trainable[0].dtype),
        "target_pct": TARGETS_PCT[config],
        "load_s": round(time.perf_counter() - t0, 2),
        "load_average_before": loadavg(),
    }

    def train_step():
        with autocast():
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # The train step, then update() and reset() right after each one (cold caches, as in a real training loop).
    # Resetting after every step changes what is trained, not what anything costs: only the timings matter here.
    er = ElasticReset(model, decay=DECAY, reset_every=RESET_EVERY, mode="elastic")
    result["er_direct_path"] = er._direct
    for _ in range(args.warmup):
        train_step()
        er.update()
        er.reset()
    train, update_after_step, reset_after_step = [], [], []
    for i in range(args.repeats):
        train.append(_timed(train_step))
        update_after_step.append(_timed(er.update))
        reset_after_step.append(_timed(er.reset))
        print(f"   train step {i + 1}/{args.repeats}: {train[-1]:.0f} ms; then update {update_after_step[-1]:.2f} ms, "
              f"reset {reset_after_step[-1]:.2f} ms", flush=True)
    result["train_step"] = summary(train)
    result["update_after_train_step"] = summary(update_after_step)
    result["reset_after_train_step"] = summary(reset_after_step)
    # In the loop: each update (and reset, weighted 1/17) against the train step just before it. Per-pair ratios
    # are robust to a load from other processes that drifts over the run.
    result["in_loop_amortised_pct_paired"] = statistics.median(
        100.0 * (u + r / RESET_EVERY) / t for u, r, t in zip(update_after_step, reset_after_step, train))

    er_reps = args.er_repeats
    result["update"] = summary(time_ms(er.update, warmup=3, repeats=er_reps))
    result["reset_elastic"] = summary(time_ms(er.reset, warmup=2, repeats=er_reps))
    # The part of a reset that is not a copy: ‖θ − θ̄‖ for the event (a temporary the size of the covered tensors).
    result["distance"] = summary(time_ms(er.distance, warmup=2, repeats=er_reps))
    del er
    gc.collect()

    er_ema = ElasticReset(model, decay=DECAY, reset_every=RESET_EVERY, mode="ema")
    result["reset_ema"] = summary(time_ms(er_ema.reset, warmup=2, repeats=er_reps))
    del er_ema
    gc.collect()

    # step() as a loop calls it: blocks of 17 consecutive calls, each block ending in exactly one reset.
    er_step = ElasticReset(model, decay=DECAY, reset_every=RESET_EVERY, mode="elastic")
    blocks = max(3, er_reps // 4)

    def block():
        for _ in range(RESET_EVERY):
            er_step.step()

    per_step = [ms / RESET_EVERY for ms in time_ms(block, warmup=1, repeats=blocks)]
    assert er_step.num_resets == blocks + 1, (er_step.num_resets, blocks)
    result["step_amortised_measured"] = summary(per_step)
    er_step = None  # frees it (a closure reads it, so no `del`)
    gc.collect()

    derived = result["update"]["median_ms"] + result["reset_elastic"]["median_ms"] / RESET_EVERY
    result["step_amortised_derived"] = {"median_ms": derived, "formula": f"update + reset_elastic / {RESET_EVERY}"}

    train_ms = result["train_step"]["median_ms"]
    for key in ("update", "update_after_train_step", "reset_after_train_step", "reset_elastic", "distance",
                "reset_ema", "step_amortised_measured", "step_amortised_derived"):
        result[key]["pct_of_train_step"] = 100.0 * result[key]["median_ms"] / train_ms
    # The verdict uses the in-loop figure: it is what a training loop pays (caches cold after the train step), and
    # its per-pair ratios survive a load from other processes, which inflates the tight-loop timings of the many
    # small parallel regions of the foreach calls far more than the train step. The strictest estimate is kept too.
    result["meets_target"] = result["in_loop_amortised_pct_paired"] <= result["target_pct"]
    worst = max(result["step_amortised_measured"]["pct_of_train_step"],
                result["step_amortised_derived"]["pct_of_train_step"],
                result["in_loop_amortised_pct_paired"])
    result["worst_estimate_pct"] = worst
    result["meets_target_on_every_estimate"] = worst <= result["target_pct"]
    result["anchors"] = bench_anchors(model, opt, train_step, args)
    result["load_average_after"] = loadavg()
    model = opt = None  # frees them before the next set-up (closures read them, so no `del`)
    gc.collect()
    return result


PRESET_SETTINGS = {"elastic_reset": {"decay": DECAY}, "reset_to_ema": {"decay": DECAY}, "ema_anchor": {"decay": DECAY},
                   "ref_sync": {"alpha": 0.6}, "liti": {"eta": 0.5}}


def bench_anchors(model, opt, train_step, args) -> dict:
    """Each :class:`Anchor` preset as a loop pays for it: after each timed train step, ``update()`` (the EMA, where
    the preset keeps one) and ``pull()``, weighted 1/17 as a pull every 17 steps; ratios taken per pair."""
    out = {}
    for name in PRESETS:
        extra = {"optimizer": opt} if name == "ref_reset" else {}
        anchor = Anchor.preset(name, model, every=RESET_EVERY, **PRESET_SETTINGS.get(name, {}), **extra)
        pulls = bool(anchor.pulls)
        train, update, pull = [], [], []
        for i in range(args.warmup + args.repeats):
            t = _timed(train_step)
            u = _timed(anchor.update)
            p = _timed(anchor.pull) if pulls else 0.0
            if i >= args.warmup:
                train.append(t)
                update.append(u)
                pull.append(p)
        out[name] = {
            "copies": sorted(anchor.copies),
            "update_after_train_step_ms": statistics.median(update),
            "pull_after_train_step_ms": statistics.median(pull),
            "in_loop_amortised_pct_paired": statistics.median(
                100.0 * (u + p / RESET_EVERY) / t for u, p, t in zip(update, pull, train)),
        }
        print(f"   anchor {name}: update {out[name]['update_after_train_step_ms']:.2f} ms, pull "
              f"{out[name]['pull_after_train_step_ms']:.2f} ms, in the loop "
              f"{out[name]['in_loop_amortised_pct_paired']:.3f} % of a train step", flush=True)
        anchor = None
        gc.collect()
    return out


# ------------------------------------------------------------------------------------------------------ report
def _cell(r: dict, key: str) -> str:
    ms, pct = r[key]["median_ms"], r[key]["pct_of_train_step"]
    digits = 2 if ms >= 1 else 3
    return f"{ms:.{digits}f} ms ({pct:.{3 if pct < 0.1 else 2}f} %)"


def _in_loop(r: dict) -> str:
    ms = r["update_after_train_step"]["median_ms"] + r["reset_after_train_step"]["median_ms"] / RESET_EVERY
    pct = r["in_loop_amortised_pct_paired"]
    return f"{ms:.{2 if ms >= 1 else 3}f} ms ({pct:.{3 if pct < 0.1 else 2}f} %)"


def markdown_table(results: dict) -> str:
    head = ("| set-up | trainable params | train step | `update()` | `update()` after a train step | "
            "`reset()` elastic | of which ‖θ − θ̄‖ | `reset()` ema | "
            f"`step()` amortised, reset every {RESET_EVERY} (measured) | update + reset/{RESET_EVERY} (derived) | "
            f"in the loop: (update + reset/{RESET_EVERY}) after each train step | "
            "target | met (in the loop) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in results.items():
        lines.append(
            f"| {name}: {r['description']} | {r['trainable_params'] / 1e6:.2f} M ({r['trainable_tensors']} tensors) "
            f"| {r['train_step']['median_ms']:.0f} ms | {_cell(r, 'update')} | {_cell(r, 'update_after_train_step')} "
            f"| {_cell(r, 'reset_elastic')} | {_cell(r, 'distance')} | {_cell(r, 'reset_ema')} "
            f"| {_cell(r, 'step_amortised_measured')} | {_cell(r, 'step_amortised_derived')} | {_in_loop(r)} "
            f"| ≤ {r['target_pct']:g} % | {'yes' if r['meets_target'] else 'NO'} |"
        )
    return "\n".join(lines)


def anchors_table(results: dict) -> str:
    """Per set-up and preset: (update + pull/17) after each train step, as a share of it, against the target."""
    presets = list(next(iter(results.values()))["anchors"])
    head = "| set-up | " + " | ".join(f"`{p}`" for p in presets) + " | target |"
    lines = [head, "|" + "---|" * (len(presets) + 2)]
    for name, r in results.items():
        cells = [f"{r['anchors'][p]['in_loop_amortised_pct_paired']:.3f} %" for p in presets]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | ≤ {r['target_pct']:g} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed train steps per set-up (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed train steps first (default 2)")
    parser.add_argument("--er-repeats", type=int, default=20,
                        help="timed calls of each Elastic Reset operation (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--configs", nargs="+", choices=ALL_CONFIGS, default=list(DEFAULT_CONFIGS),
                        help=f"set-ups to run (default: {' '.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.er_repeats < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--repeats, --er-repeats and --threads must be >= 1, --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = dt.datetime.now(dt.timezone.utc)
    load_before = loadavg()
    t0 = time.perf_counter()
    info = machine_info(args.threads)
    print(f"{info['cpu']}, {info['cores']} CPUs, {info['mem_gib']} GiB, torch {info['torch']}, "
          f"{info['torch_threads']} threads; load average {load_before}", flush=True)

    vocab = 49152
    ids = torch.randint(0, vocab, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(args.seed))
    results = {c: bench_config(c, args, ids) for c in args.configs}

    total_s = time.perf_counter() - t0
    load_after = loadavg()
    table = markdown_table(results)
    anchors = anchors_table(results)
    print("\n" + table + "\n\nThe anchor presets, in the loop:\n" + anchors)
    print(f"\ntotal {total_s:.0f} s; load average before {load_before}, after {load_after}")

    record = {
        "benchmark": "elastic_reset core overhead vs one SmolLM2-135M train step",
        "command": " ".join(["python", *sys.argv]) if argv is None else None,
        "date": started.isoformat(timespec="seconds"),
        "machine": info,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "settings": {
            "batch": BATCH, "seq_len": SEQ_LEN, "decay": DECAY, "reset_every": RESET_EVERY,
            "repeats": args.repeats, "warmup": args.warmup, "er_repeats": args.er_repeats,
            "lora": LORA, "lr_full": LR_FULL, "lr_lora": LR_LORA, "seed": args.seed,
            "statistic": "median of time.perf_counter() intervals",
        },
        "results": results,
        "markdown_table": table,
        "anchors_markdown_table": anchors,
        "total_s": round(total_s, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
