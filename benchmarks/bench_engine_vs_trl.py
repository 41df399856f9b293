"""One RL training step of our engine against TRL 1.16's ``GRPOTrainer``, for the same work, in one process.

The work per step: SmolLM2-135M-Instruct + LoRA (r=16, α=32, q_proj/v_proj, no dropout), 16 completions
of exactly 32 new tokens (EOS suppressed until then: ``min_new_tokens = max_new_tokens = 32`` on both sides),
VADER positivity reward, prompts from the ``vader`` task, a KL penalty of 0.05 against the adapter-disabled model
(so both sides run a reference forward), one optimizer step, 2 torch threads.

Rows:

- ``TRL GRPO``: ``GRPOTrainer`` with 4 prompts × 4 generations (``per_device_train_batch_size=16``,
  ``num_generations=4``, ``gradient_accumulation_steps=1``: 16 completions generated and trained per optimizer
  step), ``beta=0.05``, ``bf16=True, use_cpu=True`` (and a ``bf16=False`` fp32 row). Each step is timed by a
  ``TrainerCallback`` (``on_step_begin`` → ``on_step_end``); its breakdown comes from timing the trainer's own
  ``_generate`` (sampling + decoding), ``_calculate_rewards`` and the no-grad calls of
  ``_get_per_token_logps_and_entropies`` (reference / old log-probs); "update" is the rest of the step.
- ``ours PPO``: :class:`~elastic_reset.rl.trainer.RLTrainer`, 16 prompts × 1, one epoch, one minibatch of 16
  (one optimizer step, like GRPO's), value head + GAE.
- ``ours RLOO``: 4 prompts × 4 samples, one optimizer step: the closest match to GRPO.

Our rows call ``trainer.train_step()`` directly; the breakdown is the ``time/*`` fields of the returned record
(``sample`` = sampling; ``reward`` = decoding + VADER; ``ref`` = the reference log-probs; ``update`` = forward,
advantages, backward, optimizer step). With one epoch of one minibatch, as here, the update's own forward gives
the old log-probs (and PPO's values), as TRL's GRPO does with one iteration; otherwise they are a separate forward,
counted in ``ref``. Every row: ``--warmup`` steps discarded, then the
median of ``--steps`` timed steps. Ratios are ours / TRL at the same precision.

    .venv/bin/python benchmarks/bench_engine_vs_trl.py [--steps 5] [--warmup 1] [--out PATH]
        [--rows trl-bf16,trl-fp32,ours-ppo-bf16,ours-rloo-bf16,ours-ppo-fp32,ours-rloo-fp32]

The table is printed and written, with the machine and its load average, to
``benchmarks/results/engine_vs_trl.json``. Timings from a loaded machine (load average well above the 2 threads
used) are inflated and noisy: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "engine_vs_trl.json"

NEW_TOKENS = 32
COMPLETIONS = 16
KL_COEF = 0.05
LR = 1e-5
LORA = dict(r=16, alpha=32, dropout=0.0, target_modules=["q_proj", "v_proj"])
TRL_PROMPTS, TRL_GENERATIONS = 4, 4  # 4 prompts × 4 generations = 16 completions per optimizer step
ALL_ROWS = ("trl-bf16", "trl-fp32", "ours-ppo-bf16", "ours-rloo-bf16", "ours-ppo-fp32", "ours-rloo-fp32")
PARTS = ("sample", "reward", "ref", "update")
NOTES = [
    "TRL breakdown: sample = GRPOTrainer._generate (model.generate + decoding), reward = _calculate_rewards, "
    "ref = no-grad _get_per_token_logps_and_entropies (reference log-probs; TRL skips old log-probs when "
    "num_iterations=1 and generation is aligned with the optimizer step), update = the rest of the step.",
    "Ours breakdown: the time/* fields of RLTrainer.train_step(): sample = KV-cache sampling, reward = decoding + "
    "VADER, ref = old log-probs (+ values for PPO) and reference log-probs, update = advantages + forward/backward/"
    "AdamW step.",
    "TRL bf16=True on CPU: accelerate wraps the PeftModel forward in bf16 autocast, but model.generate calls the "
    "base model's forward directly, so TRL's sampling runs in fp32 (see config.autocast_on_in of the TRL rows).",
    "Ratios compare ours with TRL at the same precision setting; the target is ratio <= 0.5.",
    "On --device cuda both sides keep fp32 weights; bf16 rows are autocast mixed precision (TRL: accelerate's, "
    "ours: model.autocast bf16); times include the GPU work (each step ends with host reads of its results).",
]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def machine_info(threads: int) -> dict:
    import peft
    import trl

    from elastic_reset.lm.device import describe_machine

    return {
        **describe_machine(),
        "trl": trl.__version__,
        "peft": peft.__version__,
        "threads": threads,
        # glibc allocator settings change both sides' timings (freshly mapped memory page-faults): recorded
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }


def summarize(name: str, steps: list[dict], warmup: int, **extra) -> dict:
    """Median of the timed steps (the first ``warmup`` are dropped) for the total and each part."""
    timed = steps[warmup:]
    row = {"row": name, **extra, "warmup": warmup, "timed_steps": len(timed),
           "median_s": median([s["total"] for s in timed])}
    for part in PARTS:
        row[f"median_{part}_s"] = median([s[part] for s in timed if part in s])
    row["completion_length"] = median([s["completion_length"] for s in timed if s.get("completion_length") is not None])
    row["steps"] = steps
    return row


# ------------------------------------------------------------------------------------------------------- TRL GRPO
def run_trl(bf16: bool, warmup: int, steps: int, threads: int, device: str = "cpu") -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from elastic_reset.models import load_smollm2
    from elastic_reset.rewards.vader import vader_positive
    from elastic_reset.tasks import get_task

    task = get_task("vader")
    dataset = Dataset.from_dict({"prompt": list(task.train_prompts)})
    model, tokenizer = load_smollm2()

    def vader_reward(prompts, completions, **kwargs):
        return vader_positive(prompts, completions)

    records: list[dict] = []

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.current: dict | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.current = {p: 0.0 for p in ("sample", "reward", "ref")}
            self.current["threads"] = torch.get_num_threads()
            self.current["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            cur = self.current
            cur["total"] = time.perf_counter() - cur.pop("start")
            cur["update"] = cur["total"] - cur["sample"] - cur["reward"] - cur["ref"]
            records.append(cur)
            self.current = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            # Logged right after on_step_end of the same step (logging_steps=1).
            if logs and records and "completions/mean_length" in logs:
                records[-1]["completion_length"] = float(logs["completions/mean_length"])

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=COMPLETIONS,
            num_generations=TRL_GENERATIONS,
            gradient_accumulation_steps=1,
            num_iterations=1,
            beta=KL_COEF,
            learning_rate=LR,
            max_completion_length=NEW_TOKENS,
            generation_kwargs={"min_new_tokens": NEW_TOKENS},  # EOS impossible before 32 tokens: exactly 32
            temperature=1.0,
            top_p=1.0,
            bf16=bf16,
            use_cpu=device == "cpu",
            gradient_checkpointing=False,
            disable_dropout=True,
            report_to="none",
            logging_steps=1,
            disable_tqdm=True,
            save_strategy="no",
            max_steps=warmup + steps,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=vader_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                   target_modules=list(LORA["target_modules"]), bias="none",
                                   task_type="CAUSAL_LM"),
            callbacks=[timer],
        )
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout

        phase = ["update"]  # which part of the step is running, for the autocast probe below

        def timed(name, part, only_no_grad=False):
            fn = getattr(trainer, name)

            @functools.wraps(fn)
            def wrapper(*a, **kw):
                if timer.current is None or (only_no_grad and torch.is_grad_enabled()):
                    return fn(*a, **kw)
                t0, outer = time.perf_counter(), phase[0]
                phase[0] = part
                try:
                    return fn(*a, **kw)
                finally:
                    phase[0] = outer
                    timer.current[part] += time.perf_counter() - t0

            setattr(trainer, name, wrapper)

        # Probe: is bf16 autocast actually on when TRL runs the transformer in each part of the step?
        autocast_seen: dict[str, set] = {}

        def probe(module, inputs):
            autocast_seen.setdefault(phase[0], set()).add(torch.is_autocast_enabled(device))

        first_layer = trainer.accelerator.unwrap_model(trainer.model).get_base_model().model.layers[0]
        first_layer.register_forward_pre_hook(probe)

        timed("_generate", "sample")
        timed("_calculate_rewards", "reward")
        timed("_get_per_token_logps_and_entropies", "ref", only_no_grad=True)  # the grad call is the update
        torch.set_num_threads(threads)
        trainer.train()
        trl_args = {"per_device_train_batch_size": args.per_device_train_batch_size,
                    "num_generations": args.num_generations, "prompts_per_step": TRL_PROMPTS,
                    "gradient_accumulation_steps": args.gradient_accumulation_steps, "beta": args.beta,
                    "loss_type": args.loss_type, "bf16": args.bf16, "use_cpu": args.use_cpu,
                    "max_completion_length": args.max_completion_length,
                    "generation_kwargs": args.generation_kwargs,
                    "model_dtype": str(next(trainer.model.parameters()).dtype),
                    "autocast_on_in": {k: sorted(v) for k, v in autocast_seen.items()}}
        trainer = None  # breaks the trainer <-> callback-closure cycle (closures read it, so no `del`)
    del model
    gc.collect()
    return summarize("TRL GRPO", records, warmup, precision="bf16" if bf16 else "fp32",
                     shape=f"{TRL_PROMPTS} prompts x {TRL_GENERATIONS} generations", config=trl_args)


# ----------------------------------------------------------------------------------------------------- our engine
def our_config(algo: str, bf16: bool, total_steps: int, threads: int, device: str = "cpu",
               cuda_graphs: bool = False, compile: bool = False) -> dict:
    if algo == "ppo":
        algo_cfg = {"name": "ppo", "prompts_per_step": COMPLETIONS, "samples_per_prompt": 1, "epochs": 1,
                    "minibatch_size": COMPLETIONS, "lr": LR}
    else:
        algo_cfg = {"name": "rloo", "prompts_per_step": TRL_PROMPTS, "samples_per_prompt": TRL_GENERATIONS,
                    "epochs": 1, "minibatch_size": COMPLETIONS, "lr": LR}
    return {
        "seed": 0,
        "steps": total_steps,
        "model": {"name": "smollm2", "autocast": "bf16" if bf16 else "none", "lora": dict(LORA), "device": device},
        "task": {"name": "vader"},
        "sampling": {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "cuda_graphs": cuda_graphs,
                     "compile": compile},
        "algo": algo_cfg,
        "kl": {"coef": KL_COEF},
        "method": {"name": "kl"},
        "eval": {"every": 0},
        "checkpoint_every": 0,
        "progress": False,
        "threads": threads,
    }


def run_ours(algo: str, bf16: bool, warmup: int, steps: int, threads: int, device: str = "cpu",
             cuda_graphs: bool = False, compile: bool = False) -> dict:
    from elastic_reset.rl.config import config_from_dict
    from elastic_reset.rl.trainer import RLTrainer

    cfg_dict = our_config(algo, bf16, warmup + steps, threads, device, cuda_graphs, compile)
    config = config_from_dict(cfg_dict)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-ours-") as tmp:
        trainer = RLTrainer(config, Path(tmp) / "run")
        torch.set_num_threads(threads)
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            record = trainer.train_step()
            total = time.perf_counter() - t0
            records.append({"total": total, **{p: record[f"time/{p}"] for p in PARTS},
                            "completion_length": record["response_length"], "threads": torch.get_num_threads()})
        trainer.metrics.close()
        trainer = None  # closures read it, so no `del`
    gc.collect()
    shape = (f"{COMPLETIONS} prompts x 1, 1 epoch, 1 minibatch of {COMPLETIONS}" if algo == "ppo"
             else f"{TRL_PROMPTS} prompts x {TRL_GENERATIONS} samples, 1 minibatch of {COMPLETIONS}")
    return summarize(f"ours {algo.upper()}", records, warmup, precision="bf16" if bf16 else "fp32", shape=shape,
                     config=cfg_dict)


# ---------------------------------------------------------------------------------------------------------- report
def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def add_ratios(rows: list[dict]) -> None:
    trl = {r["precision"]: r for r in rows if r["row"] == "TRL GRPO" and r.get("median_s")}
    for r in rows:
        if r["row"] == "TRL GRPO" or not r.get("median_s"):
            continue
        base = trl.get(r["precision"])
        r["ratio_vs_trl"] = None if base is None else r["median_s"] / base["median_s"]
        r["ratio_vs_trl_precision"] = None if base is None else base["precision"]
        r["target_met"] = None if base is None else r["ratio_vs_trl"] <= 0.5


def table(rows: list[dict]) -> str:
    head = ("| row | precision | shape | median s/step | sample | reward | ref+old logprobs | update | "
            "completion len | ratio ours/TRL |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['precision']} | {r.get('shape', '')} | FAILED: {r['error']} "
                         "| | | | | | |")
            continue
        ratio = r.get("ratio_vs_trl")
        lines.append(
            f"| {r['row']} | {r['precision']} | {r['shape']} | {fmt(r['median_s'])} | {fmt(r['median_sample_s'])} "
            f"| {fmt(r['median_reward_s'], 3)} | {fmt(r['median_ref_s'])} | {fmt(r['median_update_s'])} "
            f"| {fmt(r['completion_length'], 1)} | {'–' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps per row, discarded (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where both sides run (default cpu; on cuda, bf16 rows are mixed precision on the GPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="our rows decode through captured CUDA graphs (sampling.cuda_graphs)")
    parser.add_argument("--compile", action="store_true",
                        help="with --cuda-graphs: the steps compiled before capture (sampling.compile; the "
                             "compilation falls in the warm-up step)")
    parser.add_argument("--rows", default=",".join(ALL_ROWS),
                        help=f"comma-separated subset of {','.join(ALL_ROWS)} (default: all)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(wanted) - set(ALL_ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {', '.join(ALL_ROWS)}")

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = machine_info(args.threads)
    info["loadavg_start"] = list(os.getloadavg())
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    print(f"# {info['gpu'] or info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
          f"transformers {info['transformers']}, "
          f"trl {info['trl']}, {args.threads} threads, load average {info['loadavg_start'][0]:.2f}", flush=True)

    rows: list[dict] = []
    for name in [r for r in ALL_ROWS if r in wanted]:
        side, *rest = name.split("-")
        bf16 = rest[-1] == "bf16"
        print(f"# running {name} ({args.warmup} warm-up + {args.steps} timed steps) ...", flush=True)
        t0 = time.perf_counter()
        try:
            if side == "trl":
                row = run_trl(bf16, args.warmup, args.steps, args.threads, args.device)
            else:
                row = run_ours(rest[0], bf16, args.warmup, args.steps, args.threads, args.device, args.cuda_graphs,
                               args.compile)
        except Exception as err:  # a refused configuration (e.g. bf16 on CPU) is reported, not fatal
            traceback.print_exc()
            row = {"row": "TRL GRPO" if side == "trl" else f"ours {rest[0].upper()}",
                   "precision": "bf16" if bf16 else "fp32", "error": f"{type(err).__name__}: {err}"[:300]}
        row["id"] = name
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if "error" not in row:
            print(f"#   median {row['median_s']:.2f} s/step over {row['timed_steps']} steps "
                  f"(all: {[round(s['total'], 2) for s in row['steps']]})", flush=True)

    add_ratios(rows)
    info["loadavg_end"] = list(os.getloadavg())
    md = table(rows)
    print()
    print(md)
    checked = [r for r in rows if r.get("target_met") is not None]
    if checked:
        print()
        for r in checked:
            print(f"target (ours <= 0.5 x TRL, {r['precision']}): {r['row']} ratio {r['ratio_vs_trl']:.2f} -> "
                  f"{'met' if r['target_met'] else 'NOT met'}")
    for r in rows:
        seen = (r.get("config") or {}).get("autocast_on_in")
        if r["row"] == "TRL GRPO" and seen is not None:
            print(f"TRL {r['precision']}: bf16 autocast on during {seen}")
    load = info["loadavg_start"][0]
    if load > 1.5 and args.device == "cpu":
        print(f"WARNING: 1-minute load average was {load:.2f} at the start (> 1.5 on this machine): other work "
              "competed for the cores, timings are inflated and noisy.")
    result = {
        "benchmark": "one RL training step, ours vs TRL GRPOTrainer",
        "work": {"model": "SmolLM2-135M-Instruct", "lora": LORA, "completions_per_step": COMPLETIONS,
                 "new_tokens": NEW_TOKENS, "reward": "elastic_reset.rewards.vader.vader_positive",
                 "prompts": "vader task train prompts", "kl_coef": KL_COEF, "optimizer_steps_per_step": 1},
        "args": {"steps": args.steps, "warmup": args.warmup, "threads": args.threads, "rows": wanted,
                 "device": args.device},
        "machine": info,
        "notes": NOTES,
        "rows": rows,
        "table_markdown": md,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
