"""Memory and time of the policy update with and without activation checkpointing (``model.activation_checkpointing``,
TRL's ``gradient_checkpointing``).

SmolLM2-135M-Instruct + LoRA (r 16, α 32, q/v), as the trainer sets it up (``load_model_and_tokenizer``,
``Policy``): a batch of ``--batch`` prompts of 32 tokens with responses of ``--tokens`` tokens (random ids, all
real), the update's forward with grad (log-probs and entropy) and its backward, twice; each setting in a fresh
process. Reported: the peak memory above what the process held before the first forward (CPU: resident memory,
sampled every 2 ms; CUDA: ``max_memory_allocated``) and the median time of a forward + backward.

    .venv/bin/python benchmarks/bench_activation_memory.py [--batch 4] [--tokens 256] [--device cpu] [--threads 2]

Writes ``benchmarks/results/activation_memory.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "activation_memory.json"
PROMPT_TOKENS = 32


class PeakRss:
    """The highest resident memory of this process while it runs (a thread sampling every 2 ms)."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def child(args) -> dict:
    from elastic_reset.lm.device import autocast_dtype
    from elastic_reset.lm.rollout import Rollout
    from elastic_reset.rl.config import LoraConfig, ModelConfig, SamplingConfig
    from elastic_reset.rl.policy import Policy, load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    on = args.child == "on"
    config = ModelConfig(name="smollm2", lora=LoraConfig(r=16, alpha=32), activation_checkpointing=on)
    model, tokenizer = load_model_and_tokenizer(config)
    model.to(device)
    dtype = autocast_dtype(args.precision, device)
    policy = Policy(model, tokenizer, sampling=SamplingConfig(), max_prompt_tokens=None, autocast_dtype=dtype,
                    max_text_tokens=256, recompute=on)
    g = torch.Generator().manual_seed(0)
    b, t = args.batch, args.tokens
    vocab = model.config.vocab_size
    rollout = Rollout(query_ids=torch.randint(3, vocab, (b, PROMPT_TOKENS), generator=g),
                      query_mask=torch.ones(b, PROMPT_TOKENS, dtype=torch.long),
                      response_ids=torch.randint(3, vocab, (b, t), generator=g), response_mask=torch.ones(b, t),
                      logprobs=torch.zeros(b, t)).to(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    times = []
    with PeakRss() as rss:
        before_rss = rss.peak
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = policy.score(rollout, entropy=True)
            (-(out.logprobs.sum() / out.logprobs.numel())).backward()
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            del out
    peak = (torch.cuda.max_memory_allocated() - before) if cuda else rss.peak - before_rss
    return {"activation_checkpointing": on, "peak_above_model_mib": round(peak / 2**20, 1),
            "median_forward_backward_s": round(statistics.median(times), 3), "times_s": [round(x, 3) for x in times]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="response tokens per sequence")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("none", "bf16", "auto"), default="none",
                        help="model.autocast (none: fp32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_engine_vs_trl import machine_info

    rows = []
    for setting in ("off", "on"):
        done = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                               "--child", setting], capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    off, on = rows
    result = {"benchmark": "one update's forward + backward, activation checkpointing off / on",
              "args": {k: str(v) for k, v in vars(args).items() if k != "child"}, "machine": machine_info(args.threads),
              "rows": rows, "memory_ratio_on_off": round(on["peak_above_model_mib"] / off["peak_above_model_mib"], 3),
              "time_ratio_on_off": round(on["median_forward_backward_s"] / off["median_forward_backward_s"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"memory on/off {result['memory_ratio_on_off']}, time on/off {result['time_ratio_on_off']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
