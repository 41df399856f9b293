"""``elastic-reset``: the command line.

    elastic-reset train CONFIG.yaml --out RUN_DIR [--resume] [--set key=value ...]
    elastic-reset compare CONFIG.yaml --out GRID_DIR --methods kl,elastic_reset --seeds 3
                  [--set key=value ...] [--method-set LABEL:key=value ...] [--drift perplexity|kl_init|drift_bleu]
                  [--score reward|task_bleu]
    elastic-reset pareto RUN_DIR... --out FIG.png [--drift perplexity|kl_init|drift_bleu] [--score reward|task_bleu]
                  (default score and drift: the runs' task's own, recorded in each run's task.json)
    elastic-reset demo [--out DIR] [--steps N]
    elastic-reset build-reward-model imdb [--data-dir ../shared/data] [--out DIR] [--n-train N] [--n-test N]
                  [--epochs E] [--batch-size B] [--max-length L] [--lr LR] [--seed S] [--force]
    elastic-reset build-policy imdb [--data-dir ../shared/data] [--out DIR] [--steps N] [--force]
    elastic-reset build-translation --data-dir ../shared/data [--out DIR] [--max-epochs N] [--label-smoothing E]
                                   [--device auto|cpu|cuda] [--force]
    elastic-reset reward-model train --backbone smollm2|minilm --data hh-rlhf [--data stack-exchange|PAIRS.jsonl]
                  [--data-dir ../shared/data] [--advantage] [--seed S] [--epochs E] [--lr LR] [--batch-size B]
                  [--max-tokens T] [--save-steps N] [--group-by-length] [--out DIR] [--resume]
    elastic-reset reward-model evaluate DIR [--split test] [--data-dir ../shared/data] [--force]
"""

from __future__ import annotations

import argparse
import sys

from elastic_reset.errors import ElasticResetError
from elastic_reset.evaluation.runs import DRIFTS, SCORES


def _train(args: argparse.Namespace) -> int:
    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.trainer import RLTrainer

    config = load_config(args.config, args.set or [])
    trainer = RLTrainer(config, args.out, resume=args.resume)
    trainer.train()
    if trainer.dp.is_main:
        print(f"run written to {args.out} (metrics.jsonl, checkpoints/)")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from elastic_reset.compare import parse_method_overrides, parse_methods, run_grid
    from elastic_reset.evaluation.summary import format_dominance, format_table

    methods = parse_methods(args.methods)
    method_overrides = parse_method_overrides(args.method_set or [], methods)
    # The command as parsed, in canonical form: rerunning it continues (or reproduces) this grid.
    command = ["elastic-reset", "compare", args.config, "--out", args.out, "--methods",
               ",".join(m if label == m else f"{label}={m}" for label, m in methods.items()),
               "--seeds", str(args.seeds)]
    for flag, value in (("--drift", args.drift), ("--score", args.score)):
        command += [flag, value] if value is not None else []
    for item in args.set or []:
        command += ["--set", item]
    for item in args.method_set or []:
        command += ["--method-set", item]
    summary = run_grid(args.config, args.out, methods, args.seeds, args.set or [], method_overrides,
                       drift=args.drift, command=command, score=args.score)
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


def _demo(args: argparse.Namespace) -> int:
    from elastic_reset.demo import run_demo

    run_demo(args.out, steps=args.steps, model=args.model)
    return 0


def _build_reward_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elastic_reset.rewards.classifier import train_sentiment_classifier
    from elastic_reset.tasks.imdb import default_reward_model_path, load_imdb, shuffled

    out = Path(args.out) if args.out else default_reward_model_path()
    if (out / "config.json").exists() and not args.force:
        raise FileExistsError(f"{out}: a reward model is already there (pass --force to rebuild it)")
    # Seeded shuffles: the files are ordered all-negative then all-positive.
    train = shuffled(load_imdb(args.data_dir, "train"), args.seed, "imdb-classifier-train")[:args.n_train]
    test = shuffled(load_imdb(args.data_dir, "test"), args.seed, "imdb-classifier-test")[:args.n_test]
    metrics = train_sentiment_classifier(
        [t for t, _ in train], [y for _, y in train], out, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, max_length=args.max_length, seed=args.seed,
        eval_texts=[t for t, _ in test], eval_labels=[y for _, y in test],
        metadata={"task": args.task, "data_dir": args.data_dir or "hf:imdb",
                  "train_split": "train (seeded shuffle, first n_train)",
                  "test_split": "test (seeded shuffle, first n_test)"})
    print(f"IMDB sentiment reward model: test accuracy {metrics['test_accuracy']:.4f} on {metrics['test_size']} "
          f"held-out test reviews, trained on {metrics['train_size']} in {metrics['train_seconds']:.0f}s; "
          f"written to {out}")
    return 0


def _build_policy(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from elastic_reset.models import IMDB_POLICY_DIRNAME, cache_dir
    from elastic_reset.pretrain.imdb import PretrainConfig, pretrain_policy
    from elastic_reset.tasks.imdb import load_imdb, shuffled

    out = Path(args.out) if args.out else cache_dir() / IMDB_POLICY_DIRNAME
    if (out / "config.json").exists() and not args.force:
        raise FileExistsError(f"{out}: a policy is already there (pass --force to rebuild it)")
    config = PretrainConfig() if args.steps is None else replace(PretrainConfig(), steps=args.steps)
    train = [t for t, _ in load_imdb(args.data_dir, "train")]
    # Perplexity on test reviews the IMDB task never uses as prompts or reference texts (the end of its shuffle).
    held_out = [t for t, _ in shuffled(load_imdb(args.data_dir, "test"), 0, "imdb-test")[-500:]]
    metrics = pretrain_policy(train, held_out, out, config)
    print(f"IMDB policy: {metrics['parameters'] / 1e6:.1f}M parameters, held-out perplexity "
          f"{metrics['held_out_perplexity']:.1f} after {metrics['train_seconds']:.0f} s; written to {out}")
    return 0


def _build_translation(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from elastic_reset.models import translation_agents_path
    from elastic_reset.pretrain.translation import AgentConfig, build_agents

    out = Path(args.out) if args.out else translation_agents_path(required=False)
    if out.exists() and not args.force:
        raise FileExistsError(f"{out}: Translation Game agents are already there (pass --force to rebuild them)")
    config = AgentConfig(pretrain_lines=args.pretrain_lines)
    if args.max_epochs is not None:
        config = replace(config, max_epochs=args.max_epochs)
    if args.label_smoothing is not None:
        config = replace(config, label_smoothing=args.label_smoothing)
    metrics = build_agents(args.data_dir, out, config, device=args.device)
    val = metrics["pretrained"]["val"]
    print(f"Translation Game agents written to {out} in {metrics['build_seconds']:.0f} s; PRETRAINED (val): task "
          f"{val['task_bleu']:.1f} BLEU, drift {val['drift_bleu']:.1f} BLEU")
    return 0


def _reward_model_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elastic_reset.models import cache_dir
    from elastic_reset.reward_models.build import RewardModelConfig, train_reward_model

    config = RewardModelConfig(backbone=args.backbone, advantage=args.advantage, data=args.data,
                               data_dir=args.data_dir, seed=args.seed, epochs=args.epochs, lr=args.lr,
                               batch_size=args.batch_size, max_tokens=args.max_tokens, bf16=args.bf16,
                               save_steps=args.save_steps, group_by_length=args.group_by_length)
    names = "+".join(Path(d).stem.split(".")[0] for d in args.data)
    name = f"{args.backbone}-{'am' if args.advantage else 'rm'}-{names}-seed{args.seed}"
    out = Path(args.out) if args.out else cache_dir() / "reward-models" / name
    metrics = train_reward_model(config, out, resume=args.resume)
    print(f"reward model written to {out} in {metrics['train_seconds']:.0f} s; test accuracy "
          f"{_accuracy(metrics['test'])}, ECE {metrics['test']['ece']:.3f}")
    return 0


def _reward_model_evaluate(args: argparse.Namespace) -> int:
    from elastic_reset.reward_models.build import EVALUATION, evaluate_reward_model

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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _add_report_metrics(parser: argparse.ArgumentParser) -> None:
    # None: each run's own, from the task.json its trainer wrote (reward and perplexity for runs that have none).
    parser.add_argument("--drift", choices=tuple(DRIFTS), default=None,
                        help="drift metric on the y axis (default: the task's own, perplexity; the Translation "
                             "Game: drift_bleu)")
    parser.add_argument("--score", choices=tuple(SCORES), default=None,
                        help="task score on the x axis (default: the task's own, reward; the Translation Game: "
                             "task_bleu)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elastic-reset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one run from a YAML config")
    train.add_argument("config", help="YAML file (see configs/)")
    train.add_argument("--out", required=True, help="run directory (config.yaml, metrics.jsonl, checkpoints/)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set algo.lr=1e-5 (repeatable)")
    train.set_defaults(func=_train)

    compare = sub.add_parser("compare", help="train methods × seeds from one config (resumable), then report")
    compare.add_argument("config", help="YAML file (see configs/)")
    compare.add_argument("--out", required=True, help="grid directory: <method>/seed<i>/ runs, summary.json, "
                         "pareto.png, pareto_curves.png")
    compare.add_argument("--methods", required=True, help="comma-separated drift-control methods, e.g. "
                         "kl,elastic_reset; LABEL=METHOD adds a named variant (er_paper=elastic_reset), "
                         "configured with --method-set LABEL:KEY=VALUE")
    compare.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method (default 3)")
    compare.add_argument("--set", action="append", metavar="KEY=VALUE",
                         help="override a config value for every run (repeatable)")
    compare.add_argument("--method-set", action="append", metavar="LABEL:KEY=VALUE",
                         help="override a config value for one method's runs, e.g. elastic_reset:kl.coef=0.001 "
                              "(repeatable)")
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

    demo = sub.add_parser("demo", help="RL without drift control vs Elastic Reset on SmolLM2 (LoRA), ~11 min on a CPU")
    demo.add_argument("--out", default="demo_out", help="where the two runs are written")
    demo.add_argument("--steps", type=_positive_int, default=None, help="training iterations per run (also scales "
                      "the reset period and the evaluation interval; default: configs/demo.yaml's)")
    demo.add_argument("--model", default="smollm2", help="smollm2, or tiny-llama for a seconds-long smoke run")
    demo.set_defaults(func=_demo)

    reward = sub.add_parser("build-reward-model", help="train a task's learned reward model (IMDB: a MiniLM "
                            "sentiment classifier) and cache it where the task looks for it")
    reward.add_argument("task", choices=("imdb",), help="whose reward model to build")
    reward.add_argument("--data-dir", default=None, help="folder holding imdb/{train,test}.jsonl.gz, e.g. "
                        "../shared/data (default: the Hugging Face `imdb` dataset, needs a network or its cache)")
    reward.add_argument("--out", default=None, help="where to write it (default: the cache path the task reads, "
                        "$ELASTIC_RESET_CACHE or ~/.cache/elastic_reset, /imdb-sentiment-minilm)")
    reward.add_argument("--n-train", type=_positive_int, default=6000, help="training reviews (default 6000)")
    reward.add_argument("--n-test", type=_positive_int, default=2000, help="held-out test reviews for the accuracy "
                        "(default 2000)")
    reward.add_argument("--epochs", type=_positive_int, default=1, help="default 1")
    reward.add_argument("--batch-size", type=_positive_int, default=16, help="default 16")
    reward.add_argument("--max-length", type=_positive_int, default=256, help="tokens kept per review, from the end "
                        "(default 256)")
    reward.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (default 5e-5)")
    reward.add_argument("--seed", type=int, default=0, help="default 0")
    reward.add_argument("--force", action="store_true", help="replace a reward model already at --out")
    reward.set_defaults(func=_build_reward_model)

    policy = sub.add_parser("build-policy", help="pretrain a task's small policy on its training text (IMDB: a "
                            "GPT-2 of 5M parameters on the train reviews) and cache it as model.name imdb-gpt2")
    policy.add_argument("task", choices=("imdb",), help="whose policy to build")
    policy.add_argument("--data-dir", default=None, help="folder holding imdb/{train,test}.jsonl.gz, e.g. "
                        "../shared/data (default: the Hugging Face `imdb` dataset, needs a network or its cache)")
    policy.add_argument("--out", default=None, help="where to write it (default: the cache path model.name "
                        "imdb-gpt2 reads, $ELASTIC_RESET_CACHE or ~/.cache/elastic_reset, /imdb-gpt2)")
    policy.add_argument("--steps", type=_positive_int, default=None, help="optimizer steps (default: "
                        "PretrainConfig's)")
    policy.add_argument("--force", action="store_true", help="replace a policy already at --out")
    policy.set_defaults(func=_build_policy)

    game = sub.add_parser("build-translation", help="pretrain the Translation Game's agents (FR→EN, EN→DE, an "
                                                    "English LM) on half of Multi30k train, ~40 min on 2 cores")
    game.add_argument("--data-dir", required=True, help="folder holding multi30k/, e.g. ../shared/data")
    game.add_argument("--out", default=None, help="where to write them (default: the cache path the "
                      "translation_game task reads)")
    game.add_argument("--max-epochs", type=_positive_int, default=None, help="at most this many epochs per model "
                      "(default 10; each stops early on its validation score)")
    game.add_argument("--pretrain-lines", type=_positive_int, default=None, help="lines of Multi30k train to "
                      "pretrain on (default: half, 14,500); the game is played on the rest")
    game.add_argument("--label-smoothing", type=float, default=None, help="label smoothing of the pretraining "
                      "loss (default 0.1)")
    game.add_argument("--device", default="auto", help="where to pretrain: cpu, cuda, cuda:N, or auto (CUDA when "
                      "present; a GPU builds the agents in minutes)")
    game.add_argument("--force", action="store_true", help="replace agents already at --out")
    game.set_defaults(func=_build_translation)

    rm = sub.add_parser("reward-model", help="reward models trained on preference pairs (Bradley-Terry or the "
                                             "Advantage Model)")
    rm_sub = rm.add_subparsers(dest="reward_model_command", required=True)
    rm_train = rm_sub.add_parser("train", help="train one, evaluate it on val and test, cache it")
    rm_train.add_argument("--backbone", default="minilm", help="smollm2 (LoRA), minilm, tiny-llama, or a folder")
    rm_train.add_argument("--data", action="append", required=True, help="hh-rlhf, stack-exchange, or a JSONL file "
                          "of prompt/chosen/rejected (repeatable)")
    rm_train.add_argument("--data-dir", default=None, help="folder holding hh-rlhf/ and stack-exchange-paired/")
    rm_train.add_argument("--advantage", action="store_true", help="the Advantage Model (eq. 6) instead of BT")
    rm_train.add_argument("--seed", type=int, default=0)
    rm_train.add_argument("--epochs", type=float, default=1.0)
    rm_train.add_argument("--lr", type=float, default=None, help="default: 1e-4 (smollm2), 3e-5 (minilm)")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ElasticResetError, FileExistsError, FileNotFoundError, PermissionError) as err:
        if args.debug:
            raise
        # One line: the message names the key or the file; --debug shows where it came from.
        message = " ".join(str(err).split())
        print(f"elastic-reset: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
