"""One training step of a SmolLM2-135M + LoRA reward model (RM) and Advantage Model (AM): each pair read as
separate sequences (prompt + chosen, prompt + rejected, and for the AM the prompt alone) against one row per pair
that reads the prompt once (``reward_models.packing``). Side by side in one run, as ratios.

Also counts the tokens an epoch of the training split costs each way (HH-RLHF + Stack Exchange, split seed 0,
``--max-tokens`` per prompt + response), which is what the step time follows. The batches are random draws of
``--batch-size`` training pairs (the same for every row); each row times forward + backward of the loss, after one
untimed warm-up batch. Needs ``../shared/data``.

    .venv/bin/python benchmarks/bench_reward_model_step.py [--batches 4] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import time
from pathlib import Path

import torch

from elastic_reset.data.preferences import load_preferences, split_by_prompt
from elastic_reset.reward_models.losses import advantage_model_loss, bradley_terry_loss
from elastic_reset.reward_models.model import RewardModelConfig, build_model
from elastic_reset.reward_models.packing import PairCollator, encode_pairs, pair_scores

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ELASTIC_RESET_DATA", ROOT.parent / "shared" / "data"))


def epoch_tokens(features: list[dict], advantage: bool) -> int:
    """Real (unpadded) tokens one epoch reads."""
    if "responses" in features[0]:
        return sum(f["length"] for f in features)
    return sum(len(f["chosen"]) + len(f["rejected"]) + (len(f["prompt"]) if advantage else 0) for f in features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "reward_model_step.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    train = split_by_prompt(load_preferences(["hh-rlhf", "stack-exchange"], str(DATA)))["train"]
    rng = random.Random(0)
    batches = [rng.sample(train, args.batch_size) for _ in range(args.batches + 1)]  # the first one warms up
    rows = []
    for advantage in (False, True):
        model, tokenizer = build_model(RewardModelConfig(backbone="smollm2", advantage=advantage))
        collate = PairCollator(tokenizer.pad_token_id)
        loss_fn = advantage_model_loss if advantage else bradley_terry_loss
        for shared in (False, True):
            seconds = []
            for i, pairs in enumerate(batches):
                batch = collate(encode_pairs(pairs, tokenizer, args.max_tokens, share_prompt=shared))
                start = time.perf_counter()
                loss_fn(*pair_scores(model, batch)).backward()
                if i:
                    seconds.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
            tokens = epoch_tokens(encode_pairs(train, tokenizer, args.max_tokens, share_prompt=shared), advantage)
            rows.append({"model": "AM" if advantage else "RM", "prompt": "shared" if shared else "separate",
                         "seconds_per_step": sum(seconds) / len(seconds), "steps": seconds, "epoch_tokens": tokens})
            print(f"{rows[-1]['model']} {rows[-1]['prompt']:>8}: {rows[-1]['seconds_per_step']:.1f} s/step, "
                  f"{tokens / 1e6:.2f}M tokens an epoch", flush=True)
    for model in ("RM", "AM"):
        separate, shared = (r for r in rows if r["model"] == model)
        print(f"{model}: shared / separate = {shared['seconds_per_step'] / separate['seconds_per_step']:.2f} in time, "
              f"{shared['epoch_tokens'] / separate['epoch_tokens']:.2f} in tokens")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()), "threads": args.threads,
              "batch_size": args.batch_size, "max_tokens": args.max_tokens, "train_pairs": len(train), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
