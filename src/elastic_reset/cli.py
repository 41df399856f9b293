"""``elastic-reset``: the command line.

    elastic-reset train CONFIG.yaml --out RUN_DIR [--resume] [--set key=value ...]
                  [--model NAME] [--prompts FILE|DATASET] [--reward SPEC ...] [--trl grpo|rloo] [--print-config]
    elastic-reset compare CONFIG.yaml --out GRID_DIR --methods kl,elastic_reset --seeds 3
                  [--set key=value ...] [--method-set LABEL:key=value ...] [--drift perplexity|kl_init|drift_bleu]
                  [--score reward|task_bleu] [--model NAME] [--prompts FILE|DATASET] [--reward SPEC ...]
                  [--trl grpo|rloo] [--jobs N] [--prune-finished]
    elastic-reset pareto RUN_DIR... --out FIG.png [--drift perplexity|kl_init|drift_bleu] [--score reward|task_bleu]
                  (default score and drift: the runs' task's own, recorded in each run's task.json)
    elastic-reset export RUN_DIR --out DIR [--step N] [--ema] [--merge] [--push-to-hub REPO]
    elastic-reset sweep RUN_DIR --lambdas 0.5,1.5 [--toward init|ema]
    elastic-reset demo [--out DIR] [--steps N] [--model smollm2|tiny-llama]
    elastic-reset config [PREFIX]       (every run-config setting: key, type, default, what it does)
    elastic-reset build imdb-classifier [--data-dir ../shared/data] [--out DIR] [--n-train N] [--n-test N]
                  [--epochs E] [--batch-size B] [--max-length L] [--lr LR] [--seed S] [--force]
    elastic-reset build imdb-policy [--data-dir ../shared/data] [--out DIR] [--steps N] [--force]
    elastic-reset build imdb-smollm2 [--data-dir ../shared/data] [--out DIR] [--steps N] [--batch-size B]
                  [--context T] [--lora-r R] [--lr LR] [--seed S] [--resume] [--force]
    elastic-reset build translation-agents --data-dir ../shared/data [--out DIR] [--corpus tatoeba|multi30k]
                  [--max-epochs N] [--pretrain-lines N] [--label-smoothing E] [--device auto|cpu|cuda]
                  [--force] [--resume] [--adapt DIR]
    elastic-reset build gold-pairs [--data-dir ../shared/data] [--n-pairs N] [--temperature T] [--seed S]
                  [--force] [--resume]
                  (old names, still accepted: build-reward-model imdb, build-policy imdb, build-translation)
    elastic-reset reward-model train --backbone smollm2|minilm --data hh-rlhf [--data stack-exchange|PAIRS.jsonl]
                  [--data-dir ../shared/data] [--advantage] [--seed S] [--epochs E] [--lr LR] [--batch-size B]
                  [--max-tokens T] [--save-steps N] [--group-by-length] [--out DIR] [--resume] [--report-to TRACKER]
    elastic-reset reward-model evaluate DIR [--split test] [--data-dir ../shared/data] [--force]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from elastic_reset.errors import ElasticResetError
from elastic_reset.evaluation.runs import DRIFTS, SCORES


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` items, after those that ``--model``, ``--prompts`` and ``--reward`` stand for (TRL's CLI habits:
    ``--model_name_or_path``, ``--dataset_name``, ``--reward_funcs``); a ``--set`` given too wins. ``--prompts``
    replaces the config's task options; ``--reward`` alone replaces only its reward. With ``--trl``, ``--prompts``
    is the recipe's ``dataset_name`` instead (:func:`_recipe_dataset`), and its rewards stay."""
    from elastic_reset.tasks.prompts import source_option

    items = [f"model.name={json.dumps(args.model)}"] if args.model else []
    reward = (args.reward if len(args.reward) > 1 else args.reward[0]) if args.reward else None
    if args.prompts is not None and not getattr(args, "trl", None):
        options = {source_option(args.prompts): args.prompts, **({"reward": reward} if reward else {})}
        items += ["task.name=prompts", f"task.options={json.dumps(options)}"]
    elif reward:
        items += ["task.name=prompts", f"task.options.reward={json.dumps(reward)}"]
    return items + (args.set or [])


def _recipe_dataset(args: argparse.Namespace) -> str | None:
    """``--prompts`` with ``--trl``: the recipe's ``dataset_name``, as ``trl grpo --dataset_name`` replaces it."""
    return args.prompts if getattr(args, "trl", None) else None


def _add_task_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model.name: a Hub name or a folder (or smollm2, tiny-llama, ...)")
    parser.add_argument("--prompts", metavar="FILE|DATASET", help="the prompts task on this file or folder, or "
                        "datasets name: task.name=prompts, task.options.path (or .dataset); replaces the config's "
                        "task options (with --trl: the recipe's dataset_name, its rewards kept)")
    parser.add_argument("--reward", action="append", metavar="SPEC", help="a reward of the prompts task, as "
                        "task.options.reward: module:function, path/to/file.py:function, a TRL reward name "
                        "(think_format_reward, ...) or a reward model's "
                        "folder (repeatable: summed)")
    parser.add_argument("--trl", choices=("grpo", "rloo"), help="the config is the YAML of `trl grpo --config` (or "
                        "`trl rloo`): its trainer's, model's and script's settings carried over (docs/trl.md)")


def _train(args: argparse.Namespace) -> int:
    from elastic_reset.errors import ConfigError
    from elastic_reset.rl.config import config_to_yaml
    from elastic_reset.rl.from_trl import load_run_config, recipe_output_dir
    from elastic_reset.rl.trainer import RLTrainer

    config = load_run_config(args.config, args.trl, _overrides(args), _recipe_dataset(args))
    if args.print_config:
        print(config_to_yaml(config), end="")
        return 0
    if args.out is None and args.trl:  # as `trl grpo --config` writes into the recipe's output_dir
        args.out = recipe_output_dir(args.config)
    if args.out is None:
        raise ConfigError("--out: the run directory is required (or --print-config to see the config only)"
                          + ("; the recipe names no output_dir" if args.trl else ""))
    trainer = RLTrainer(config, args.out, resume=args.resume)
    rendering = getattr(trainer.task, "rendering", None)  # a prompts task's
    if rendering and trainer.dp.is_main:
        print(f"prompts: {rendering}", flush=True)
    trainer.train()
    if trainer.dp.is_main:
        print(f"run written to {args.out} (metrics.jsonl, checkpoints/)")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elastic_reset.compare import GridConfig, parse_method_overrides, parse_methods, run_grid
    from elastic_reset.evaluation.summary import format_dominance, format_table

    methods = parse_methods(args.methods)
    method_overrides = parse_method_overrides(args.method_set or [], methods)
    args.set = _overrides(args)  # the canonical command below says them as --set
    # The command as parsed, in canonical form: rerunning it continues (or reproduces) this grid.
    command = ["elastic-reset", "compare", args.config, "--out", args.out, "--methods",
               ",".join(m if label == m else f"{label}={m}" for label, m in methods.items()),
               "--seeds", str(args.seeds)]
    for flag, value in (("--trl", args.trl), ("--prompts", _recipe_dataset(args)), ("--drift", args.drift),
                        ("--score", args.score)):
        command += [flag, value] if value is not None else []
    command += ["--jobs", str(args.jobs)] if args.jobs != 1 else []
    command += ["--prune-finished"] if args.prune_finished else []
    for item in args.set or []:
        command += ["--set", item]
    for item in args.method_set or []:
        command += ["--method-set", item]
    summary = run_grid(GridConfig(Path(args.config), args.trl, _recipe_dataset(args)), args.out, methods, args.seeds, args.set or [],
                       method_overrides, drift=args.drift, command=command, score=args.score, jobs=args.jobs,
                       prune=args.prune_finished)
    if summary is None:
        return 0  # a data-parallel rank other than 0: rank 0 reports
    print(format_dominance(summary["dominance"]))
    print(format_table(summary))
    print(f"grid written to {args.out} (summary.json, pareto.png, pareto_curves.png)")
    return 0


def _pareto(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elastic_reset.evaluation.figures import curves_path, report
    from elastic_reset.evaluation.runs import find_run_dirs, group_runs, load_run
    from elastic_reset.evaluation.summary import format_dominance, format_table

    runs = []
    for item in args.runs:
        # LABEL=DIR groups DIR's runs under LABEL (e.g. two KL coefficients of method kl side by side).
        label, path = None, item
        if "=" in item and not Path(item).exists():
            label, path = item.split("=", 1)
        for run_dir in find_run_dirs(path):
            runs.append(load_run(run_dir, method=label, drift=args.drift, score=args.score))
    groups = group_runs(runs)
    summary, rows = report(groups, args.out)
    print(format_dominance(rows))
    print(format_table(summary))
    print(f"figures written to {args.out} and {curves_path(args.out)}")
    return 0


def _export(args: argparse.Namespace) -> int:
    import shlex

    from elastic_reset.rl.export import export_run

    # The command as parsed, in canonical form, for the model card.
    command = ["elastic-reset", "export", args.run, "--out", args.out]
    command += (["--step", str(args.step)] if args.step is not None else []) + ["--ema"] * args.ema
    command += ["--merge"] * args.merge + (["--push-to-hub", args.push_to_hub] if args.push_to_hub else [])
    out = export_run(args.run, args.out, step=args.step, ema=args.ema, merge=args.merge,
                     push_to_hub=args.push_to_hub, command=shlex.join(command))
    print(f"policy written to {out}" + (f" and pushed to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from elastic_reset.rl.sweep import SWEEP_FILE, sweep_run

    try:
        lambdas = [float(x) for x in args.lambdas.split(",") if x.strip()]
    except ValueError:
        raise ElasticResetError(f"--lambdas: expected comma-separated numbers, got {args.lambdas!r}") from None
    for r in sweep_run(args.run, lambdas, args.toward):
        drift = f", perplexity {r['eval/perplexity']:.2f}" if "eval/perplexity" in r else ""
        print(f"λ {r['lambda']:g} toward {r['toward']}: reward {r['eval/reward']:.4f}, KL to init "
              f"{r['eval/kl_init']:.3f}{drift}")
    print(f"written to {os.path.join(args.run, SWEEP_FILE)}")
    return 0


def _config(args: argparse.Namespace) -> int:
    import textwrap

    from elastic_reset.rl.config import describe_fields

    rows = [r for r in describe_fields() if r[0].startswith(args.prefix or "")]
    if not rows:
        raise ElasticResetError(f"config {args.prefix}: no setting starts with it (try `elastic-reset config`)")
    for key, kind, default, doc in rows:
        print(f"{key}  ({kind}, default {default})")
        print(textwrap.fill(doc, width=100, initial_indent="    ", subsequent_indent="    "))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from elastic_reset.demo import run_demo

    run_demo(args.out, steps=args.steps, model=args.model)
    return 0


def _build_imdb_classifier(args: argparse.Namespace) -> int:
    from elastic_reset.pretrain.classifier import build_imdb_classifier

    out, metrics = build_imdb_classifier(args.data_dir, args.out, n_train=args.n_train, n_test=args.n_test,
                                         epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                                         lr=args.lr, seed=args.seed, force=args.force)
    print(f"IMDB sentiment reward model: test accuracy {metrics['test_accuracy']:.4f} on {metrics['test_size']} "
          f"held-out test reviews, trained on {metrics['train_size']} in {metrics['train_seconds']:.0f}s; "
          f"written to {out}")
    return 0


def _build_imdb_policy(args: argparse.Namespace) -> int:
    from elastic_reset.pretrain.imdb import build_imdb_policy

    out, metrics = build_imdb_policy(args.data_dir, args.out, steps=args.steps, force=args.force,
                                     device=args.device)
    print(f"IMDB policy: {metrics['parameters'] / 1e6:.1f}M parameters, held-out perplexity "
          f"{metrics['held_out_perplexity']:.1f} after {metrics['train_seconds']:.0f} s; written to {out}")
    return 0


def _build_imdb_smollm2(args: argparse.Namespace) -> int:
    from elastic_reset.pretrain.imdb_smollm2 import AdaptConfig, build_imdb_smollm2

    config = AdaptConfig(lora_r=args.lora_r or None, context=args.context, batch_size=args.batch_size, steps=args.steps,
                         lr=args.lr, seed=args.seed)
    out, metrics = build_imdb_smollm2(args.data_dir, args.out, config=config, resume=args.resume, force=args.force)
    print(f"IMDB SmolLM2 policy: held-out perplexity {metrics['held_out_perplexity_before']:.2f} → "
          f"{metrics['held_out_perplexity']:.2f} after {metrics['train_seconds']:.0f} s; written to {out}")
    return 0


def _build_gold_pairs(args: argparse.Namespace) -> int:
    from elastic_reset.data.imdb import train_prompts
    from elastic_reset.models import gold_pairs_path, imdb_classifier, imdb_smollm2_path
    from elastic_reset.rewards.gold import GoldPairsConfig, build_gold_pairs

    config = GoldPairsConfig(n_pairs=args.n_pairs, temperature=args.temperature, seed=args.seed,
                             batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    config.validate()
    out = args.out or gold_pairs_path(config.n_pairs, config.temperature, config.seed)
    policy = args.policy or imdb_smollm2_path()
    gold = imdb_classifier(args.gold, "--gold")  # before minutes of sampling, not after
    out, metrics = build_gold_pairs(policy, gold, train_prompts(args.data_dir, config.n_pairs), out, config,
                                    force=args.force, resume=args.resume)
    print(f"gold pairs: {metrics['pairs']} written to {out} in {metrics['seconds']:.0f} s; labels agree with the "
          f"gold's order on {metrics['label_agrees_with_gold']:.3f} of pairs (T = {config.temperature:g}), mean "
          f"|gold gap| {metrics['mean_abs_gold_gap']:.2f}")
    return 0


def _build_translation_agents(args: argparse.Namespace) -> int:
    from elastic_reset.pretrain.translation import build_translation_agents

    out, metrics = build_translation_agents(args.data_dir, args.out, max_epochs=args.max_epochs,
                                            pretrain_lines=args.pretrain_lines, corpus=args.corpus,
                                            label_smoothing=args.label_smoothing, device=args.device,
                                            force=args.force, resume=args.resume, adapt=args.adapt,
                                            jobs=args.jobs)
    val = metrics["pretrained"]["val"]
    print(f"Translation Game agents written to {out} in {metrics['build_seconds']:.0f} s; PRETRAINED (val): task "
          f"{val['task_bleu']:.1f} BLEU, drift {val['drift_bleu']:.1f} BLEU")
    return 0


def _renamed(old: str, new: str, func):
    """The handler of an old command name: a one-line note naming the new command, then the same build."""
    def run(args: argparse.Namespace) -> int:
        print(f"elastic-reset: note: `{old}` is now `elastic-reset {new}`", file=sys.stderr)
        return func(args)
    return run


def _reward_model_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elastic_reset.models import reward_model_path
    from elastic_reset.reward_models.train import RewardModelConfig, train_reward_model

    config = RewardModelConfig(backbone=args.backbone, advantage=args.advantage, data=args.data,
                               data_dir=args.data_dir, seed=args.seed, epochs=args.epochs, lr=args.lr,
                               batch_size=args.batch_size, max_tokens=args.max_tokens, bf16=args.bf16,
                               save_steps=args.save_steps, group_by_length=args.group_by_length,
                               report_to=args.report_to or [])
    out = Path(args.out) if args.out else reward_model_path(args.backbone, args.advantage, args.data, args.seed)
    metrics = train_reward_model(config, out, resume=args.resume)
    print(f"reward model written to {out} in {metrics['train_seconds']:.0f} s; test accuracy "
          f"{_accuracy(metrics['test'])}, ECE {metrics['test']['ece']:.3f}")
    return 0


def _reward_model_evaluate(args: argparse.Namespace) -> int:
    from elastic_reset.reward_models.evaluate import EVALUATION, evaluate_reward_model

    results = evaluate_reward_model(args.path, tuple(args.split or ["test"]), args.data_dir, force=args.force)
    for split, metrics in results.items():
        subsets = [("all", metrics), *metrics["datasets"].items()]
        parts = [f"{name} {_accuracy(m)} / {m['ece']:.3f}" for name, m in subsets]
        print(f"{split} ({metrics['pairs']} pairs), accuracy / ECE: {', '.join(parts)}")
    print(f"written to {args.path}/{EVALUATION}")
    return 0


def _accuracy(metrics: dict) -> str:
    """``0.510 ± 0.021`` (standard error over prompts), or the accuracy alone for metrics that predate it."""
    se = metrics.get("accuracy_se")
    return f"{metrics['accuracy']:.3f}" + ("" if se is None else f" ± {se:.3f}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("elastic-reset")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _number(convert, ok, expected: str):
    """An argparse ``type`` that refuses, while parsing (before any model loads), what ``ok`` does not accept."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value
    return parse


_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
_seed = _number(int, lambda v: 0 <= v < 2**32, f"an integer from 0 to {2**32 - 1}")  # numpy's range (transformers)


def _add_report_metrics(parser: argparse.ArgumentParser) -> None:
    # None: each run's own, from the task.json its trainer wrote (reward and perplexity for runs that have none).
    parser.add_argument("--drift", choices=tuple(DRIFTS), default=None,
                        help="drift metric on the y axis (default: the task's own, perplexity; the Translation "
                             "Game: drift_bleu)")
    parser.add_argument("--score", choices=tuple(SCORES), default=None,
                        help="task score on the x axis (default: the task's own, reward; the Translation Game: "
                             "task_bleu)")


def _imdb_data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help="folder holding imdb/{train,test}.jsonl.gz, e.g. "
                        "../shared/data (default: the Hugging Face `imdb` dataset, needs a network or its cache)")


def _imdb_classifier_options(parser: argparse.ArgumentParser) -> None:
    _imdb_data_dir_option(parser)
    parser.add_argument("--out", default=None, help="where to write it (default: the cache path the task reads, "
                        "$ELASTIC_RESET_CACHE or ~/.cache/elastic_reset, /imdb-sentiment-minilm)")
    parser.add_argument("--n-train", type=_positive_int, default=6000, help="training reviews (default 6000)")
    parser.add_argument("--n-test", type=_positive_int, default=2000, help="held-out test reviews for the accuracy "
                        "(default 2000)")
    parser.add_argument("--epochs", type=_positive_int, default=1, help="default 1")
    parser.add_argument("--batch-size", type=_positive_int, default=16, help="default 16")
    parser.add_argument("--max-length", type=_positive_int, default=256, help="tokens kept per review, from the end "
                        "(default 256)")
    parser.add_argument("--lr", type=_positive_float, default=5e-5, help="peak learning rate (default 5e-5)")
    parser.add_argument("--seed", type=_seed, default=0, help="default 0")
    parser.add_argument("--force", action="store_true", help="replace a reward model already at --out")


def _imdb_policy_options(parser: argparse.ArgumentParser) -> None:
    _imdb_data_dir_option(parser)
    parser.add_argument("--out", default=None, help="where to write it (default: the cache path model.name "
                        "imdb-gpt2 reads, $ELASTIC_RESET_CACHE or ~/.cache/elastic_reset, /imdb-gpt2)")
    parser.add_argument("--steps", type=_positive_int, default=None, help="optimizer steps (default: "
                        "PretrainConfig's)")
    parser.add_argument("--force", action="store_true", help="replace a policy already at --out")
    parser.add_argument("--device", default="auto", help="auto (default: CUDA when present), cpu or cuda[:N]")


def _imdb_smollm2_options(parser: argparse.ArgumentParser) -> None:
    _imdb_data_dir_option(parser)
    parser.add_argument("--out", default=None, help="where to write it (default: the cache path model.name "
                        "imdb-smollm2 reads)")
    parser.add_argument("--steps", type=_positive_int, default=600, help="optimizer steps (default 600)")
    parser.add_argument("--batch-size", type=_positive_int, default=4, help="windows per step (default 4)")
    parser.add_argument("--context", type=_positive_int, default=256, help="tokens per window (default 256)")
    parser.add_argument("--lora-r", type=_non_negative_int, default=16, help="train LoRA adapters of this rank on "
                        "every linear layer, merged at the end (default 16); 0: train every weight")
    parser.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate (default 1e-3 with "
                        "LoRA, 5e-5 for every weight)")
    parser.add_argument("--seed", type=_seed, default=0, help="default 0")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted build from its checkpoint")
    parser.add_argument("--force", action="store_true", help="replace a policy already at --out")


def _gold_pairs_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help="folder holding imdb/train.jsonl.gz, e.g. ../shared/data "
                        "(default: the Hugging Face `imdb` dataset, needs a network or its cache)")
    parser.add_argument("--n-pairs", type=_positive_int, default=2000, help="pairs, one per IMDB train prompt "
                        "(default 2000)")
    parser.add_argument("--temperature", type=_positive_float, default=1.0, help="Bradley–Terry noise: P(a ≻ b) = "
                        "sigmoid((g_a - g_b) / T) in gold log-odds (default 1)")
    parser.add_argument("--seed", type=_seed, default=0, help="seeds the sampling and the labels (default 0)")
    parser.add_argument("--policy", default=None, help="causal-LM folder whose continuations are paired (default: "
                        "the imdb-smollm2 build)")
    parser.add_argument("--gold", default=None, help="sentiment classifier folder that labels them (default: the "
                        "imdb-classifier build)")
    parser.add_argument("--batch-size", type=_positive_int, default=16, help="prompts per generation (default 16)")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=48, help="tokens per continuation "
                        "(default 48, as configs/imdb_135m.yaml)")
    parser.add_argument("--out", default=None, help="where to write them (default: the cache, "
                        "gold-pairs/imdb-n<N>-t<T>-seed<S>)")
    parser.add_argument("--force", action="store_true", help="replace pairs already at --out (and start again "
                        "from no samples)")
    parser.add_argument("--resume", action="store_true", help="go on from the samples an interrupted build left "
                        "beside --out (<out>.partial.jsonl)")


def _translation_agents_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, help="folder holding multi30k/, e.g. ../shared/data")
    parser.add_argument("--out", default=None, help="where to write them (default: the cache path the "
                        "translation_game task reads)")
    parser.add_argument("--max-epochs", type=_positive_int, default=None, help="at most this many epochs per model "
                        "(default 10; each stops early on its validation score)")
    parser.add_argument("--corpus", choices=("tatoeba", "multi30k"), default="tatoeba", help="pretrain out of "
                        "domain on translation-pretrain/ (Tatoeba, early-stopped on its dev pairs: the paper's "
                        "set-up, default) or on a part of Multi30k train (the earlier in-domain agents)")
    parser.add_argument("--pretrain-lines", type=_non_negative_int, default=None, help="lines of Multi30k train "
                        "pretrained on too (tatoeba: default 0) or only (multi30k: default half, 14,500); the game "
                        "is played on the rest")
    parser.add_argument("--label-smoothing", type=float, default=None, help="label smoothing of the pretraining "
                        "loss (default 0.1)")
    parser.add_argument("--device", default="auto", help="where to pretrain: cpu, cuda, cuda:N, or auto (CUDA when "
                        "present; a GPU builds the agents in minutes)")
    parser.add_argument("--force", action="store_true", help="replace agents already at --out")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted build from its last finished "
                        "epoch (kept in <out>.checkpoints/ until the build is written)")
    parser.add_argument("--jobs", type=_positive_int, default=1, help="train the three agents side by side in this "
                        "many processes (at most 3; the same agents as one at a time): for a GPU or a CPU with cores "
                        "to spare")
    parser.add_argument("--adapt", metavar="DIR", default=None, help="instead of a build: continue the agents of a "
                        "Tatoeba-only build in DIR on --pretrain-lines lines of Multi30k train for --max-epochs epochs "
                        "(default 3, lr 3e-4; minutes on a CPU); the game plays on the other lines")


# name -> (help, options, handler, old command or None, whether the old command took the task name "imdb")
BUILDS = {
    "imdb-classifier": ("the IMDB task's reward: all-MiniLM-L6-v2 fine-tuned as a sentiment classifier on IMDB "
                        "train reviews (transformers' Trainer), cached where the task looks for it",
                        _imdb_classifier_options, _build_imdb_classifier, "build-reward-model", True),
    "imdb-policy": ("a GPT-2 of 5M parameters pretrained on the IMDB train reviews, cached as model.name "
                    "imdb-gpt2", _imdb_policy_options, _build_imdb_policy, "build-policy", True),
    "imdb-smollm2": ("SmolLM2-135M-Instruct adapted to the IMDB train reviews by next-token training "
                     "(transformers' Trainer), cached as model.name imdb-smollm2", _imdb_smollm2_options,
                     _build_imdb_smollm2, None, False),
    "gold-pairs": ("pairs of the IMDB policy's continuations labelled by the gold (the sentiment classifier) with "
                   "Bradley–Terry noise, for proxy reward models (`reward-model train --data DIR/pairs.jsonl`)",
                   _gold_pairs_options, _build_gold_pairs, None, False),
    "translation-agents": ("the Translation Game's agents (FR→EN, EN→DE, an English LM) pretrained out of domain "
                           "on Tatoeba (~6 min an epoch on 2 cores; resumable)", _translation_agents_options,
                           _build_translation_agents, "build-translation", False),
}


def _add_build_commands(sub) -> None:
    """``build <model>``, one per model the project trains before RL, and the old command names as aliases."""
    build = sub.add_parser("build", help="train a model the project needs before RL and cache it where the "
                                         "task or config that uses it looks")
    build_sub = build.add_subparsers(dest="build_command", required=True)
    for name, (text, options, handler, old, takes_task) in BUILDS.items():
        parser = build_sub.add_parser(name, help=text)
        options(parser)
        parser.set_defaults(func=handler)
        if old is None:
            continue
        old_command = f"{old} imdb" if takes_task else old
        alias = sub.add_parser(old, help=f"old name of `build {name}`")
        if takes_task:
            alias.add_argument("task", choices=("imdb",), help="whose model to build")
        options(alias)
        alias.set_defaults(func=_renamed(old_command, f"build {name}", handler))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elastic-reset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one run from a YAML config")
    train.add_argument("config", help="YAML file (see configs/)")
    train.add_argument("--out", help="run directory (config.yaml, metrics.jsonl, checkpoints/)")
    train.add_argument("--print-config", action="store_true", help="print the config the run would train with (every "
                       "setting, as its config.yaml would hold it) and stop: nothing is written")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set algo.lr=1e-5 (repeatable)")
    _add_task_flags(train)
    train.set_defaults(func=_train)

    compare = sub.add_parser("compare", help="train methods × seeds from one config (resumable), then report")
    compare.add_argument("config", help="YAML file (see configs/)")
    compare.add_argument("--out", required=True, help="grid directory: <method>/seed<i>/ runs, summary.json, "
                         "pareto.png, pareto_curves.png")
    compare.add_argument("--methods", required=True, help="comma-separated drift-control methods, e.g. "
                         "kl,elastic_reset; LABEL=METHOD adds a named variant (er_paper=elastic_reset), "
                         "configured with --method-set LABEL:KEY=VALUE")
    compare.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method (default 3)")
    compare.add_argument("--jobs", type=int, default=1, help="cells trained at once, each in its own process "
                         "with the CPU cores shared out and its output in <run>/train.log (default 1: one after "
                         "the other, in this process); a GPU is shared by all")
    compare.add_argument("--prune-finished", action="store_true",
                         help="delete each finished cell's checkpoints (config, metrics and final/ policy stay); "
                              "a pruned cell cannot be continued to more steps")
    compare.add_argument("--set", action="append", metavar="KEY=VALUE",
                         help="override a config value for every run (repeatable)")
    compare.add_argument("--method-set", action="append", metavar="LABEL:KEY=VALUE",
                         help="override a config value for one method's runs, e.g. elastic_reset:kl.coef=0.001 "
                              "(repeatable)")
    _add_task_flags(compare)
    _add_report_metrics(compare)
    compare.set_defaults(func=_compare)

    pareto = sub.add_parser("pareto", help="Pareto frontier and curves figures, dominance and a final table "
                                           "from run directories")
    pareto.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories (or directories holding runs, e.g. a compare grid); runs are "
                             "grouped by their config's method.name, or by LABEL given as LABEL=RUN_DIR")
    pareto.add_argument("--out", required=True, help="Pareto figure (PNG); the curves go to <stem>_curves.png")
    _add_report_metrics(pareto)
    pareto.set_defaults(func=_pareto)

    export = sub.add_parser("export", help="a run's policy as a save_pretrained folder (LoRA adapter, merged or "
                                           "full model) with its tokenizer and a model card")
    export.add_argument("run", metavar="RUN_DIR", help="a run directory (`elastic-reset train --out`)")
    export.add_argument("--out", required=True, help="the folder to write")
    export.add_argument("--step", type=_positive_int, default=None, help="the checkpoint of this step (default: "
                        "the latest)")
    export.add_argument("--ema", action="store_true", help="the EMA weights of Elastic Reset instead of the policy's")
    export.add_argument("--merge", action="store_true", help="with LoRA: fold the adapter into the base and write "
                        "the full model (default: the adapter alone)")
    export.add_argument("--push-to-hub", metavar="REPO", default=None, help="also upload the folder to this "
                        "Hugging Face Hub repository (needs a token: `hf auth login` or HF_TOKEN)")
    export.set_defaults(func=_export)

    sweep = sub.add_parser("sweep", help="evaluate θa + λ(θ − θa) between a run's policy and its initial model "
                                         "(λ > 1: ExPO) or its EMA, without more RL; into RUN/sweep.jsonl")
    sweep.add_argument("run", metavar="RUN_DIR", help="a run directory (its latest checkpoint is used)")
    sweep.add_argument("--lambdas", required=True, help="comma-separated λ, e.g. 0.25,0.5,0.75,1.25,1.5")
    sweep.add_argument("--toward", choices=("init", "ema"), default="init", help="the anchor θa (default: the "
                       "initial model; ema: the run's EMA; with LoRA, a second adapter holds its rank-2r part)")
    sweep.set_defaults(func=_sweep)

    config = sub.add_parser("config", help="list every run-config setting with its type, default and meaning")
    config.add_argument("prefix", nargs="?", default=None, help="only the settings starting with this (e.g. algo)")
    config.set_defaults(func=_config)
    demo = sub.add_parser("demo", help="RL without drift control vs Elastic Reset on SmolLM2 (LoRA): minutes on a "
                          "2-core CPU (times per CPU kind: BENCHMARKS.md)")
    demo.add_argument("--out", default="demo_out", help="where the two runs are written")
    demo.add_argument("--steps", type=_positive_int, default=None, help="training iterations per run (also scales "
                      "the reset period and the evaluation interval; default: configs/demo.yaml's)")
    demo.add_argument("--model", default="smollm2", help="smollm2, or tiny-llama for a seconds-long smoke run")
    demo.set_defaults(func=_demo)

    _add_build_commands(sub)

    rm = sub.add_parser("reward-model", help="reward models trained on preference pairs (Bradley-Terry or the "
                                             "Advantage Model)")
    rm_sub = rm.add_subparsers(dest="reward_model_command", required=True)
    rm_train = rm_sub.add_parser("train", help="train one, evaluate it on val and test, cache it")
    rm_train.add_argument("--backbone", default="minilm", help="smollm2 (LoRA), minilm, tiny-llama, or a folder")
    rm_train.add_argument("--data", action="append", required=True, help="hh-rlhf, stack-exchange, or a JSONL file "
                          "of prompt/chosen/rejected (repeatable)")
    rm_train.add_argument("--data-dir", default=None, help="folder holding hh-rlhf/ and stack-exchange-paired/")
    rm_train.add_argument("--advantage", action="store_true", help="the Advantage Model (eq. 6) instead of BT")
    rm_train.add_argument("--seed", type=_seed, default=0)
    rm_train.add_argument("--epochs", type=_positive_float, default=1.0)
    rm_train.add_argument("--lr", type=_positive_float, default=None, help="default: 1e-4 (smollm2), 3e-5 (minilm)")
    rm_train.add_argument("--batch-size", type=_positive_int, default=8)
    rm_train.add_argument("--max-tokens", type=_positive_int, default=256)
    rm_train.add_argument("--save-steps", type=_positive_int, default=100, help="a checkpoint every N steps (what "
                          "an interruption can lose; SmolLM2 on 2 CPU cores: ~25 s a step)")
    rm_train.add_argument("--group-by-length", action="store_true", help="batches of pairs of similar length: "
                          "less padding (1.4x fewer tokens a step on hh-rlhf + stack-exchange), another batch order")
    rm_train.add_argument("--out", default=None, help="default: the cache, reward-models/<backbone>-<rm|am>-"
                          "<data>-seed<S>")
    rm_train.add_argument("--bf16", action="store_true", help="bf16 mixed-precision training, for a GPU (on an "
                          "AVX-512 BF16 CPU it was no faster than fp32 for SmolLM2)")
    rm_train.add_argument("--resume", action="store_true", help="continue an interrupted run from its checkpoint")
    rm_train.add_argument("--report-to", action="append", metavar="TRACKER", help="an experiment tracker, as "
                          "transformers' report_to (tensorboard, wandb, trackio, mlflow, ..., all); repeat for "
                          "several; none by default")
    rm_train.set_defaults(func=_reward_model_train)
    rm_eval = rm_sub.add_parser("evaluate", help="score a trained model again on its own split: accuracy and ECE "
                                "overall, per category and per preference set, into <path>/evaluation.json")
    rm_eval.add_argument("path", help="a folder `reward-model train` wrote")
    rm_eval.add_argument("--split", action="append", choices=("train", "val", "test"), help="default: test "
                         "(repeatable)")
    rm_eval.add_argument("--data-dir", default=None, help="default: the folder the model was trained from")
    rm_eval.add_argument("--force", action="store_true", help="replace an evaluation.json already there")
    rm_eval.set_defaults(func=_reward_model_evaluate)
    return parser


def _user_error(err: BaseException) -> str | None:
    """The one-line message for an error the user can act on, or None for a bug (which keeps its traceback)."""
    if isinstance(err, OSError) and err.errno is not None and err.filename is not None:
        # The OS's reason and the file it concerns (a read-only or full --out, a missing permission).
        files = str(err.filename) + ("" if err.filename2 is None else f" -> {err.filename2}")
        return f"{files}: {err.strerror or os.strerror(err.errno)}"
    if isinstance(err, (ElasticResetError, FileExistsError, FileNotFoundError, PermissionError)):
        return " ".join(str(err).split())
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        if "torch" in sys.modules:  # only a command that imported torch can have joined a process group
            from elastic_reset.rl.distributed import leave_process_group

            leave_process_group()  # under `accelerate launch`: the ranks part once all of them have finished
        return status
    except KeyboardInterrupt:
        if args.debug:
            raise
        # Ctrl-C is the user's own doing: no traceback, and the shell's status for SIGINT (128 + 2).
        print("elastic-reset: interrupted", file=sys.stderr)
        return 130
    except (ElasticResetError, OSError) as err:
        message = _user_error(err)
        if args.debug or message is None:
            raise
        # One line: the message names the key or the file; --debug shows where it came from.
        print(f"elastic-reset: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
