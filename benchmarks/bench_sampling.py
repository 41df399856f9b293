"""Time :func:`elastic_reset.rl.sampling.sample` against ``model.generate`` on SmolLM2-135M.

16 left-padded prompts (IMDB review openings of 8-64 tokens when ``../shared/data`` exists, else fixed sentences)
x 32 new tokens (min = max, so every run does the same work), plain sampling (T=1, no top-k/top-p), 2 threads:
fp32, bf16 autocast, and bf16 autocast with LoRA(q, v, r=16) adapters (frozen base: the training setup). Median of 3
timed runs after one warm-up each. ``generate`` runs as a user would call it: under autocast, with its own
``no_grad``.

    .venv/bin/python benchmarks/bench_sampling.py [--threads 2] [--repeats 3] [--batch 16] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from elastic_reset.models import load_smollm2
from elastic_reset.rl.sampling import SamplingConfig, sample

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ELASTIC_RESET_DATA", ROOT.parent / "shared" / "data"))

FALLBACK = [
    "This movie was", "I went to see this film last night with my family and",
    "The acting in this picture is", "Honestly, the worst part of the whole thing was the way the director",
    "A beautiful, quiet story about", "If you like action movies, you will",
    "The plot makes no sense at all, but", "My favourite scene is the one where",
]


def prompts(tokenizer, batch: int) -> list[str]:
    path = DATA / "imdb" / "test.jsonl.gz"
    if path.is_file():
        texts = []
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i % 1500 == 0:  # the file is all-negative then all-positive: stride through both halves
                    texts.append(json.loads(line)["text"])
                if len(texts) == batch:
                    break
        lengths = [8 + (56 * i) // max(batch - 1, 1) for i in range(batch)]  # 8 ... 64 tokens
        return [tokenizer.decode(tokenizer(t)["input_ids"][:n]) for t, n in zip(texts, lengths)]
    return [FALLBACK[i % len(FALLBACK)] for i in range(batch)]


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2()
    model.eval()
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts(tokenizer, args.batch), return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    n = args.new_tokens
    config = SamplingConfig(max_new_tokens=n, min_new_tokens=n, merge_lora=False)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def ours(dtype):
        gen = torch.Generator().manual_seed(0)
        return lambda: sample(model, ids, mask, config, pad_token_id=pad, eos_token_id=eos, generator=gen,
                              autocast_dtype=dtype)

    def hf(dtype):
        def run():
            ctx = torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext()
            with ctx:
                model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=n,
                               min_new_tokens=n, temperature=1.0, top_k=0, top_p=1.0,
                               pad_token_id=pad, eos_token_id=eos)
        return run

    print(f"SmolLM2-135M, {args.batch} prompts (prompt length {ids.shape[1]} padded) x {n} new tokens, "
          f"{args.threads} threads, median of {args.repeats} after a warm-up; torch {torch.__version__}; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    print(f"{'setup':<10} {'sample (s)':>11} {'generate (s)':>13} {'generate/sample':>16}")
    rows = [("fp32", None, False), ("bf16", torch.bfloat16, False), ("bf16+LoRA", torch.bfloat16, True)]
    for name, dtype, lora in rows:
        if lora:
            from peft import LoraConfig

            from elastic_reset.lm.lora import add_lora

            model = add_lora(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
            model.eval()
        t_ours = median_time(ours(dtype), args.repeats)
        t_hf = median_time(hf(dtype), args.repeats)
        print(f"{name:<10} {t_ours:>11.2f} {t_hf:>13.2f} {t_hf / t_ours:>15.2f}x", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f} (other processes sharing the CPU inflate both columns)")


if __name__ == "__main__":
    sys.exit(main())
