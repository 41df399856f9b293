"""``elastic-reset``: the command line.

    elastic-reset train CONFIG.yaml --out RUN_DIR [--resume] [--set key=value ...]
    elastic-reset demo [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import sys

from elastic_reset.rl.config import ConfigError


def _train(args: argparse.Namespace) -> int:
    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.trainer import RLTrainer

    config = load_config(args.config, args.set or [])
    trainer = RLTrainer(config, args.out, resume=args.resume)
    trainer.train()
    print(f"run written to {args.out} (metrics.jsonl, checkpoints/)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from elastic_reset.demo import run_demo

    run_demo(args.out, steps=args.steps, model=args.model)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elastic-reset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one run from a YAML config")
    train.add_argument("config", help="YAML file (see configs/)")
    train.add_argument("--out", required=True, help="run directory (config.yaml, metrics.jsonl, checkpoints/)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set algo.lr=1e-5 (repeatable)")
    train.set_defaults(func=_train)

    demo = sub.add_parser("demo", help="PPO+KL vs Elastic Reset on SmolLM2 (LoRA), a few minutes on a CPU")
    demo.add_argument("--out", default="demo_out", help="where the two runs are written")
    demo.add_argument("--steps", type=int, default=None, help="training iterations per run")
    demo.add_argument("--model", default="smollm2", help="smollm2, or tiny-llama for a seconds-long smoke run")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileExistsError, FileNotFoundError) as err:
        print(f"elastic-reset: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
