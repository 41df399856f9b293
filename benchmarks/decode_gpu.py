"""Per-token decoding cost on a GPU, on a randomly initialised model of SmolLM2-135M's shape with LoRA on q/v (the
timings do not depend on the weights' values, so no model file has to travel to the GPU machine). Prompts of 16
tokens, 32 new tokens, median of 3 calls after one warm-up. Three parts, in this order (a time limit that cuts the
run keeps the first ones):

- ``graphs``: this engine's ``sample()`` eager, through ``cuda_graphs``, and through graphs of compiled steps
  (``compile``; bf16 only, first), bf16 autocast and fp32, batch 16 and 64, against the memory-bandwidth limit (one
  read of the weights per step). Besides the whole call per token (the prefill included), a step's cost: (time
  for 64 tokens - time for 32) / 32, and a captured step replayed alone; and the first call's time (the capture,
  and the compilation).
- ``profile``: torch.profiler over one ``sample()`` call through graphs, compiled and not (batch 16, bf16): the
  GPU's own time per token step against the step's wall time, and the kernels that take it.
- ``hf``: Hugging Face ``generate`` (what TRL's GRPOTrainer samples with), this engine eager, and a bare forward loop.

    python benchmarks/decode_gpu.py                     # needs CUDA; BENCHMARKS.md
    python benchmarks/decode_gpu.py --device cpu --layers 2 --parts graphs   # a smoke run of the script
"""
import argparse
import time

import torch
from peft import LoraConfig
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

from elastic_reset.lm.lora import add_lora
from elastic_reset.rl.config import SamplingConfig
from elastic_reset.rl.sampling import sample

TQ, N = 16, 32  # prompt length, new tokens
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s of HBM


def build(device: str, layers: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = add_lora(LlamaForCausalLM(cfg).to(device), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                                  target_modules=["q_proj", "v_proj"]))
    return model.eval()


def batch_of(size: int, device: str):
    ids = torch.randint(3, 49152, (size, TQ), device=device)
    mask = torch.ones_like(ids)
    mask[: size // 4, :3] = 0  # some left padding, as in real batches
    return ids, mask


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def seconds(fn, device: str, reps: int = 3) -> float:
    fn()
    sync(device)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def ours(model, ids, mask, dtype, tokens: int = N, **kw):
    g = torch.Generator(ids.device).manual_seed(0)
    sample(model, ids, mask, SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens, **kw), pad_token_id=2,
           eos_token_id=2, generator=g, autocast_dtype=dtype)


MODES = {"eager": {}, "graphs": {"cuda_graphs": True}, "compiled": {"cuda_graphs": True, "compile": True}}


def replay_ms(model, batch: int, dtype, compiled: bool, device: str) -> float | None:
    """A captured step's own time: its graph replayed N times back to back (no sampling or host work between steps),
    from the cache's first generated position, since each replay advances the write position the graph holds. None
    off CUDA, where nothing is captured."""
    from elastic_reset.lm import static_decoding

    held = static_decoding._STATES.get(model)
    key = ("decoder", batch, static_decoding._bucket(TQ), static_decoding._bucket(TQ) + N, dtype, compiled)
    state = held[1].get(key) if held else None
    if state is None or state.graph is None:
        return None
    layers = static_decoding._layers(state.cache)
    with torch.inference_mode():  # the cache's tensors were made under it
        saved = [layer.cumulative_length.clone() for layer in layers]
        for layer in layers:
            layer.cumulative_length.fill_(static_decoding._bucket(TQ))
    sync(device)
    t = time.perf_counter()
    for _ in range(N):
        state.graph.replay()
    sync(device)
    elapsed = (time.perf_counter() - t) / N * 1e3
    with torch.inference_mode():
        for layer, position in zip(layers, saved):
            layer.cumulative_length.copy_(position)
    return elapsed


def part_graphs(model, device: str) -> None:
    weight_bytes = 2 * sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = next((v for k, v in BANDWIDTH.items() if k in name), None)
    limit = f", bandwidth limit {peak / weight_bytes:,.0f} steps/s ({weight_bytes / peak * 1e3:.3f} ms)" if peak else ""
    print(f"weights {weight_bytes / 1e9:.2f} GB in bf16{limit}; {name}, torch {torch.__version__}")
    # Compiled rows: bf16 and one length only (each shape is a compilation of its own, tens of seconds); their step
    # is the replay's time, not the 64-minus-32-tokens difference.
    rows = [(mode, dtype, size) for dtype in (torch.bfloat16, None) for size in (16, 64) for mode in MODES
            if mode != "compiled" or dtype is not None]
    rows.sort(key=lambda r: r[0] != "compiled")  # the compiled rows first: a time limit cuts the others
    for mode, dtype, size in rows:
        ids, mask = batch_of(size, device)
        kw = MODES[mode]
        t = time.perf_counter()
        try:
            ours(model, ids, mask, dtype, **kw)
        except Exception as err:  # e.g. no triton for the compiled rows: say so, measure the others
            print(f"ours sample() {'bf16' if dtype else 'fp32'}, batch {size:3d}, {mode:8}: failed: "
                  f"{type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        sync(device)
        first = time.perf_counter() - t
        whole = seconds(lambda: ours(model, ids, mask, dtype, **kw), device)
        step = None
        if mode != "compiled":
            step = (seconds(lambda: ours(model, ids, mask, dtype, 2 * N, **kw), device) - whole) / N * 1e3
        replay = replay_ms(model, size, dtype, mode == "compiled", device)
        best = replay if replay is not None else step
        print(f"ours sample() {'bf16' if dtype else 'fp32'}, batch {size:3d}, {mode:8}: {whole / N * 1e3:6.2f} ms per "
              f"token with the prefill, a step {'-' if step is None else f'{step:.2f}'} ms (64 - 32 tokens), "
              f"replayed alone {'-' if replay is None else f'{replay:.2f}'} ms, "
              f"{'-' if best is None else f'{size * 1e3 / best:,.0f}'} tokens/s; first call {first:.1f} s",
              flush=True)


def part_profile(model, device: str) -> None:
    ids, mask = batch_of(16, device)
    for mode in ("compiled", "graphs"):
        run = lambda: ours(model, ids, mask, torch.bfloat16, **MODES[mode])  # noqa: E731
        try:
            run()
        except Exception as err:
            print(f"profile of {mode}: failed: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            t = time.perf_counter()
            run()
            sync(device)
            wall = time.perf_counter() - t
        events = prof.key_averages()
        gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
        kernels = sum(e.count for e in events if getattr(e, "self_device_time_total", 0) > 0)
        print(f"one sample() {mode}, batch 16, bf16, {N} tokens: wall {wall * 1e3:.1f} ms, GPU busy "
              f"{gpu_us / 1e3:.1f} ms ({gpu_us / 1e3 / N:.2f} ms a token), {kernels} GPU kernel calls "
              f"({kernels / N:.0f} a token)")
        sort = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        print(events.table(sort_by=sort, row_limit=15, max_name_column_width=60), flush=True)


def part_hf(model, device: str) -> None:
    ids, mask = batch_of(16, device)
    B = ids.shape[0]

    @torch.no_grad()
    def generate(dtype=None):
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, min_new_tokens=N, max_new_tokens=N,
                           top_p=1.0, top_k=0, temperature=1.0, pad_token_id=2)

    @torch.no_grad()
    def raw(dtype=None):
        from transformers import DynamicCache
        cache = DynamicCache()
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1)
            am = mask
            for _ in range(N - 1):
                am = torch.cat([am, am.new_ones(B, 1)], 1)
                out = model(input_ids=tok[:, None], attention_mask=am, cache=out.cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1)

    ms = lambda fn: seconds(fn, device) / N * 1e3  # noqa: E731
    print(f"ms per token, batch 16, {N} new tokens, prompt {TQ}, the prefill included")
    print(f"HF generate fp32 (TRL's sampler)        {ms(generate):6.1f}")
    print(f"HF generate bf16 autocast               {ms(lambda: generate(torch.bfloat16)):6.1f}")
    print(f"ours sample() bf16 autocast             {ms(lambda: ours(model, ids, mask, torch.bfloat16)):6.1f}")
    print(f"ours sample() fp32                      {ms(lambda: ours(model, ids, mask, None)):6.1f}")
    print(f"ours sample() bf16, no EOS check at all "
          f"{ms(lambda: ours(model, ids, mask, torch.bfloat16, stop_at_eos=False)):6.1f}")
    print(f"raw forward loop fp32 (argmax)          {ms(raw):6.1f}")
    print(f"raw forward loop bf16 autocast          {ms(lambda: raw(torch.bfloat16)):6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=30, help="30: SmolLM2-135M's depth")
    parser.add_argument("--parts", default="graphs,profile,hf")
    args = parser.parse_args()
    model = build(args.device, args.layers)
    parts = {"graphs": part_graphs, "profile": part_profile, "hf": part_hf}
    for name in args.parts.split(","):
        parts[name](model, args.device)


if __name__ == "__main__":
    main()
