"""Does it learn, and how fast, against an implementation nobody here wrote? TRL's ``GRPOTrainer`` and this
engine on the same task, model, LoRA, sample budget and learning rate, judged by one held-out evaluation.

The work: SmolLM2-135M-Instruct + LoRA (r=16, α=32, q_proj/v_proj, no dropout), the ``vader``
task (reward: VADER positivity of the continuation), 4 prompts × 4 completions of exactly 24 new tokens per
optimizer step, one optimizer step per rollout, no KL penalty (β = 0 on both sides: this measures learning, not
drift; neither side computes reference log-probs then), constant learning rate (TRL's default linear decay is
switched off), Adam, gradient clipping at 1.0, temperature 1, 2 torch threads, fp32 (``--precision bf16`` for a CPU
with AVX-512 BF16; ``--device cuda`` for a GPU).

Rows: ``TRL GRPO`` (``GRPOTrainer``, its defaults otherwise: group-normalised advantages, DAPO loss; its default
gradient checkpointing off, as our rows run: the same work per step), ``TRL GRPO, activations recomputed`` (row
``trl_gc``: the same with TRL's default gradient checkpointing, which every run of this script before 2026-11-27
had in its ``TRL GRPO`` row; same samples and curve, more time per step), ``ours RLOO``
(leave-one-out baseline, whitened advantages) and ``ours PPO`` (16 prompts × 1, value head, GAE with the
default λ = 1, 2 epochs of one minibatch: two optimizer steps per rollout; the paper's algorithm). Against TRL's
``RLOOTrainer``: ``TRL RLOO`` (row ``trl_rloo``: an ``RLOOConfig`` with the same shapes, β = 0, its defaults
otherwise) and ``ours RLOO as RLOOTrainer`` (row ``rloo_as_trl``: the same ``RLOOConfig`` carried over by
``config_from_rloo``, as a TRL user would; its ratio is to ``TRL RLOO``, every other row's to ``TRL GRPO``);
``ours GRPO as GRPOTrainer`` (row ``grpo_as_trl``: the ``TRL GRPO`` row's ``GRPOConfig`` through
``config_from_grpo``).

Held-out evaluation, identical for every row and outside the timed training: the 10 validation prompts of the
task (never trained on) × ``--eval-samples`` completions each, drawn by this project's sampler with a fixed seed
from the row's current model, scored by the same reward. Wall time counts training only (the evaluation's time
is subtracted). The report gives, per row, held-out reward against wall time and against samples seen (one
figure), and the time to first reach ``--target`` (an absolute held-out reward) as a ratio ours / TRL.

    .venv/bin/python benchmarks/learning_vs_trl.py [--steps 24] [--lr 2e-3] [--target 0.75] [--rows trl,rloo,ppo]
    .venv/bin/python benchmarks/learning_vs_trl.py --rows trl_rloo,rloo_as_trl ...   # TRL's RLOOTrainer
    .venv/bin/python benchmarks/learning_vs_trl.py --combine seed0.json seed1.json ... --out seeds.json

Writes ``benchmarks/results/learning_vs_trl.json`` and ``.png``. One seed per row: a ratio from one run is a
measurement of that run, not a distribution.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_engine_vs_trl import machine_info  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "learning_vs_trl.json"
NEW_TOKENS = 24
PROMPTS, GENERATIONS = 4, 4
LORA = dict(r=16, alpha=32, dropout=0.0, target_modules=["q_proj", "v_proj"])
EVAL_SEED = 1234
ROWS = {"trl": "TRL GRPO", "trl_gc": "TRL GRPO, activations recomputed", "trl_rloo": "TRL RLOO",
        "rloo": "ours RLOO", "ppo": "ours PPO", "rloo_as_trl": "ours RLOO as RLOOTrainer",
        "grpo_as_trl": "ours GRPO as GRPOTrainer"}
"""``--rows`` names and the rows they make."""
BASELINES = {"TRL GRPO", "TRL RLOO"}


def baseline_of(row: str) -> str:
    """The TRL row a row's ratio is taken to."""
    return "TRL RLOO" if row == ROWS["rloo_as_trl"] else "TRL GRPO"


def trl_config(args, output_dir: str, kind: str = "grpo", checkpointing: bool = False):
    """TRL's ``GRPOConfig`` (or ``RLOOConfig``) for this control: the shapes above, β = 0, constant lr."""
    from trl import GRPOConfig, RLOOConfig

    return (GRPOConfig if kind == "grpo" else RLOOConfig)(
        output_dir=output_dir, per_device_train_batch_size=PROMPTS * GENERATIONS, num_generations=GENERATIONS,
        gradient_accumulation_steps=1, num_iterations=1, beta=0.0, learning_rate=args.lr,
        lr_scheduler_type="constant", max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS}, temperature=1.0, top_p=1.0,
        bf16=args.precision == "bf16", use_cpu=args.device == "cpu", disable_dropout=True, report_to="none",
        gradient_checkpointing=checkpointing, logging_steps=1, disable_tqdm=True, save_strategy="no",
        max_steps=args.steps, seed=args.seed, dataloader_num_workers=0)


class HeldOut:
    """The held-out reward of a model: the task's validation prompts × ``samples`` completions, fixed noise."""

    def __init__(self, tokenizer, samples: int, autocast_dtype):
        from elastic_reset.tasks import get_task

        self.task = get_task("vader")
        self.tokenizer = tokenizer
        self.prompts = [p for p in self.task.eval_prompts for _ in range(samples)]
        self.autocast_dtype = autocast_dtype
        self.seconds = 0.0

    @torch.no_grad()
    def __call__(self, model) -> float:
        from elastic_reset.rl.sampling import SamplingConfig, sample

        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer(self.prompts, return_tensors="pt", padding=True)
        self.tokenizer.padding_side = side
        device = next(model.parameters()).device
        with fp32_attention_while(model, self.autocast_dtype):
            rollout = sample(model, enc.input_ids.to(device), enc.attention_mask.to(device),
                             SamplingConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS),
                             pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
                             generator=torch.Generator(device).manual_seed(EVAL_SEED),
                             autocast_dtype=self.autocast_dtype)
        ids = rollout.response_ids.masked_fill(rollout.response_mask == 0, self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        reward = sum(self.task.reward_fn(self.prompts, texts)) / len(texts)
        model.train(was_training)
        self.seconds += time.perf_counter() - t0
        return float(reward)


@contextlib.contextmanager
def fp32_attention_while(model, dtype):
    """Under bf16 on a CPU our trainer runs attention in fp32 (``use_fp32_attention``) and TRL's model in bf16, so,
    each evaluated as it trains, the two rows' held-out samples would differ from step 0 although both models
    compute the same function there (on an AVX-512 BF16 Xeon: 0.551 vs 0.528; on an AVX2 CPU, one LoRA model: 0.581 with
    bf16 attention, 0.592 with fp32). The evaluation runs TRL's model with fp32 attention too (a no-op for ours,
    already switched) and switches it back afterwards, so TRL trains as it would without this benchmark."""
    from elastic_reset.lm.cpu_bf16 import use_fp32_attention

    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    before = getattr(base.config, "_attn_implementation", None)
    switched = use_fp32_attention(model, dtype)
    try:
        yield
    finally:
        if switched:
            base.set_attn_implementation(before)


def run_trl(args, kind: str = "grpo", checkpointing: bool = False) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer, RLOOTrainer

    from elastic_reset.models import load_smollm2
    from elastic_reset.rewards.vader import vader_positive
    from elastic_reset.tasks import get_task

    model, tokenizer = load_smollm2()
    held_out = HeldOut(tokenizer, args.eval_samples, torch.bfloat16 if args.precision == "bf16" else None)
    points: list[dict] = []

    def reward(prompts, completions, **kwargs):
        return vader_positive(prompts, completions)

    class Evaluate(TrainerCallback):
        def on_train_begin(self, a, state, control, **kwargs):
            self.start = time.perf_counter()
            points.append({"step": 0, "samples": 0, "wall_s": 0.0, "reward": held_out(trainer.model)})

        def on_step_end(self, a, state, control, **kwargs):
            step = state.global_step
            if step % args.eval_every == 0 or step == args.steps:
                wall = time.perf_counter() - self.start - held_out.seconds
                points.append({"step": step, "samples": step * PROMPTS * GENERATIONS, "wall_s": wall,
                               "reward": held_out(trainer.model)})
                print(f"#   TRL step {step}: held-out {points[-1]['reward']:.3f} at {wall:.0f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="learn-trl-") as tmp:
        config = trl_config(args, tmp, kind, checkpointing)
        trainer = (GRPOTrainer if kind == "grpo" else RLOOTrainer)(
            model=model, reward_funcs=reward, args=config,
            train_dataset=Dataset.from_dict({"prompt": list(get_task("vader").train_prompts)}),
            processing_class=tokenizer, callbacks=[Evaluate()],
            peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                   target_modules=list(LORA["target_modules"]), bias="none", task_type="CAUSAL_LM"))
        trainer.remove_callback(PrinterCallback)
        torch.set_num_threads(args.threads)
        trainer.train()
        settings = {k: str(getattr(config, k)) for k in ("loss_type", "scale_rewards", "normalize_advantages",
                                                          "beta", "learning_rate", "lr_scheduler_type",
                                                          "max_grad_norm", "epsilon", "gradient_checkpointing")
                    if hasattr(config, k)}
        trainer = None  # breaks the trainer <-> callback-closure cycle (closures read it, so no `del`)
    del model
    gc.collect()
    row = ROWS["trl_rloo"] if kind == "rloo" else ROWS["trl_gc"] if checkpointing else ROWS["trl"]
    return {"row": row, "config": settings, "points": points}


def run_ours(args, algo: str) -> dict:
    from elastic_reset.rl.config import config_from_dict
    from elastic_reset.rl.trainer import RLTrainer

    shape = ({"name": "rloo", "prompts_per_step": PROMPTS, "samples_per_prompt": GENERATIONS, "epochs": 1}
             if algo == "rloo" else
             {"name": "ppo", "prompts_per_step": PROMPTS * GENERATIONS, "samples_per_prompt": 1, "epochs": 2})
    config = {
        "seed": args.seed, "steps": args.steps,
        "model": {"name": "smollm2", "autocast": "bf16" if args.precision == "bf16" else "none", "lora": dict(LORA),
                  "device": args.device},
        "task": {"name": "vader"},
        "sampling": {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "cuda_graphs": args.cuda_graphs,
                     "compile": args.compile},
        "algo": {**shape, "lr": args.lr, "minibatch_size": PROMPTS * GENERATIONS},
        # β = 0 on both sides; TRL then runs no reference model, and ours skips the reference forward of its
        # KL diagnostic too (kl.log_every 0): the same work.
        "method": {"name": "none"}, "kl": {"log_every": 0}, "eval": {"every": 0}, "checkpoint_every": 0,
        "progress": False,
        "threads": args.threads,
    }
    resolved = config_from_dict(config)
    if algo in ("rloo_as_trl", "grpo_as_trl"):  # what a TRL user's config becomes here, this control's model and task
        from elastic_reset.rl.from_trl import config_from_grpo, config_from_rloo

        kind = algo.split("_")[0]
        theirs = trl_config(args, tempfile.gettempdir(), kind)
        theirs.generation_kwargs = None  # refused here: the same setting as sampling.min_new_tokens below
        carry = config_from_rloo if kind == "rloo" else config_from_grpo
        resolved = carry(theirs, [f"{k}={json.dumps(v)}" for k, v in (
            ("model.name", "smollm2"), ("model.lora", dict(LORA)), ("model.device", args.device),
            ("task.name", "vader"), ("sampling.min_new_tokens", NEW_TOKENS),
            ("kl.log_every", 0), ("eval.every", 0), ("checkpoint_every", 0), ("progress", False),
            ("threads", args.threads))])
    points: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="learn-ours-") as tmp:
        trainer = RLTrainer(resolved, Path(tmp) / "run")
        held_out = HeldOut(trainer.tokenizer, args.eval_samples, trainer.autocast_dtype)
        torch.set_num_threads(args.threads)
        points.append({"step": 0, "samples": 0, "wall_s": 0.0, "reward": held_out(trainer.model)})
        wall = 0.0
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            trainer.train_step()
            wall += time.perf_counter() - t0
            if step % args.eval_every == 0 or step == args.steps:
                points.append({"step": step, "samples": step * PROMPTS * GENERATIONS, "wall_s": wall,
                               "reward": held_out(trainer.model)})
                print(f"#   ours {algo} step {step}: held-out {points[-1]['reward']:.3f} at {wall:.0f} s", flush=True)
        trainer.close()
        trainer.metrics.close()
        trainer = None  # closures read it, so no `del`
    gc.collect()
    return {"row": ROWS[algo], "config": {"algo": resolved.algo.__dict__}, "points": points}


def time_to(points: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation whose held-out reward reaches ``target`` (None: never)."""
    return next((p["wall_s"] for p in points if p["reward"] >= target), None)


def plot(rows: list[dict], target: float, path: Path, where: str = "2 CPU threads") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for row in rows:
        pts = row["points"]
        for ax, key in zip(axes, ("wall_s", "samples")):
            ax.plot([p[key] for p in pts], [p["reward"] for p in pts], marker="o", label=row["row"])
    for ax, label in zip(axes, (f"training wall time (s, {where})", "completions trained on")):
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out reward (VADER positivity)")
    axes[0].legend()
    fig.suptitle("SmolLM2-135M + LoRA, vader task, 16 completions / step, same lr: TRL GRPO vs this engine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratio_cell(row: dict) -> str:
    """A row's ratio to TRL; "< r" where TRL never reached the target (its whole run's time bounds the ratio)."""
    return ("< " if row.get("ratio_is_upper_bound") else "") + f"{row['ratio_vs_trl']:.2f}"


def combine(paths: list[Path], out: Path) -> str:
    """Several seeds' result files as one table: each seed's time to the target per row, and the ratio of the
    medians over seeds (one seed's time to a threshold moves by tens of seconds with its sampling noise)."""
    import statistics

    runs = [json.loads(Path(p).read_text()) for p in paths]
    rows = [r["row"] for r in runs[0]["rows"]]
    target = float(runs[0]["args"]["target"])
    per_row: dict[str, list] = {row: [] for row in rows}
    lines = ["| seed | " + " | ".join(f"{row}: s/step, time to {target}" for row in rows) + " | ratio |",
             "|---" * (len(rows) + 2) + "|"]
    for path, run in zip(paths, runs):
        by_row = {r["row"]: r for r in run["rows"]}
        cells = []
        for row in rows:
            r = by_row[row]
            per_row[row].append(r)
            t = r["time_to_target_s"]
            cells.append(f"{r['total_wall_s'] / (r['points'][-1]['step'] or 1):.1f}, "
                         + ("not reached" if t is None else f"{t:.0f} s"))
        ours = next((r for r in run["rows"] if r.get("ratio_vs_trl") is not None), None)
        ratio_s = "–" if ours is None else _ratio_cell(ours)
        lines.append(f"| {run['args']['seed']} | " + " | ".join(cells) + f" | {ratio_s} |")
    medians = {}
    for row, results in per_row.items():
        times = [r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf") for r in results]
        medians[row] = statistics.median(times)
    summary = {}
    for row, t in medians.items():
        trl = medians.get(baseline_of(row))
        summary[row] = {"median_time_to_target_s": t,
                        "median_s_per_step": statistics.median(r["total_wall_s"] / r["points"][-1]["step"]
                                                               for r in per_row[row]),
                        "ratio_of_medians_vs_trl": None if trl in (None, float("inf")) or row in BASELINES
                        else t / trl}
    lines.append("| median | " + " | ".join(f"{summary[row]['median_s_per_step']:.1f}, "
                                          + ("not reached" if medians[row] == float("inf") else f"{medians[row]:.0f} s")
                                          for row in rows) + " | " + " ".join(
        f"{summary[row]['ratio_of_medians_vs_trl']:.2f}" for row in rows
        if summary[row]["ratio_of_medians_vs_trl"] is not None) + " |")
    table = "\n".join(lines)
    out.write_text(json.dumps({"files": [str(p) for p in paths], "target": target, "summary": summary,
                               "table_markdown": table}, indent=2) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                        help="only summarise earlier runs (one per seed) into --out, without training")
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per row (default 24)")
    parser.add_argument("--lr", type=float, default=2e-3,
                        help="learning rate, every row (default 2e-3, as in the first control)")
    parser.add_argument("--target", type=float, default=0.75, help="held-out reward to reach (default 0.75)")
    parser.add_argument("--eval-every", type=int, default=4, help="evaluate every this many steps (default 4)")
    parser.add_argument("--eval-samples", type=int, default=4, help="completions per held-out prompt (default 4)")
    parser.add_argument("--rows", default="trl,rloo,ppo", help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where every row runs")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="our rows decode through captured CUDA graphs (sampling.cuda_graphs)")
    parser.add_argument("--compile", action="store_true",
                        help="with --cuda-graphs: the steps compiled before capture (sampling.compile; the "
                             "compilation counts in the wall time)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.combine:
        print(combine(args.combine, args.out))
        return 0
    rows_wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    if set(rows_wanted) - set(ROWS) or not rows_wanted:
        parser.error(f"--rows: expected a subset of {','.join(ROWS)}, got {args.rows!r}")
    if args.steps < 1 or args.eval_every < 1 or args.eval_samples < 1:
        parser.error("--steps, --eval-every and --eval-samples must be >= 1")

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    print(f"# {info['gpu'] or info['cpu']}, AVX-512 BF16: {info['avx512_bf16']}, trl {info['trl']}, "
          f"{args.threads} threads", flush=True)
    rows = []
    for name in rows_wanted:
        print(f"# running {name} ...", flush=True)
        rows.append(run_trl(args, "rloo" if name == "trl_rloo" else "grpo", checkpointing=name == "trl_gc")
                    if name.startswith("trl") else run_ours(args, name))
    for row in rows:
        row["time_to_target_s"] = time_to(row["points"], args.target)
        row["final_reward"] = row["points"][-1]["reward"]
        row["total_wall_s"] = row["points"][-1]["wall_s"]
    for row in rows:
        trl = next((r for r in rows if r["row"] == baseline_of(row["row"])), None)
        if trl is not None and row["row"] not in BASELINES:
            ours, theirs = row["time_to_target_s"], trl["time_to_target_s"]
            # TRL never reaching the target bounds the ratio from above by its whole run's time.
            bound = theirs if theirs is not None else trl["total_wall_s"]
            row["ratio_vs_trl"] = None if ours is None else ours / bound
            row["ratio_is_upper_bound"] = ours is not None and theirs is None

    lines = ["| row | held-out reward: start → end | s/step | time to reach " + f"{args.target} | ratio ours / TRL |",
             "|---|---|---|---|---|"]
    for r in rows:
        t, ratio = r["time_to_target_s"], r.get("ratio_vs_trl")
        ratio_s = "–" if ratio is None else _ratio_cell(r)
        reached = "not reached" if t is None else f"{t:.0f} s"
        lines.append(f"| {r['row']} | {r['points'][0]['reward']:.3f} → {r['final_reward']:.3f} | "
                     f"{r['total_wall_s'] / args.steps:.1f} | {reached} | {ratio_s} |")
    table = "\n".join(lines)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure = args.out.with_suffix(".png")
    plot(rows, args.target, figure, info["gpu"] if args.device == "cuda" else f"{args.threads} CPU threads")
    args.out.write_text(json.dumps({"benchmark": "held-out reward vs wall time, ours vs TRL GRPOTrainer",
                                    "args": {k: str(v) for k, v in vars(args).items()}, "machine": info,
                                    "rows": rows, "table_markdown": table}, indent=2) + "\n")
    print(f"\nwrote {args.out} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
