"""Per-token decoding cost on a GPU: Hugging Face ``generate`` (what TRL's GRPOTrainer samples with) against this
engine's ``sample()`` and a bare forward loop, on a randomly initialised model of SmolLM2-135M's shape with LoRA on
q/v (the timings do not depend on the weights' values, so no model file has to travel to the GPU machine).
Batch 16, prompts of 16 tokens, 32 new tokens; median of 3 calls after one warm-up; then ``sample()`` with
``cuda_graphs`` (issue 40: static KV cache, each step a replayed CUDA graph) at batch 16 and 64 against the
memory-bandwidth limit (one read of the weights per step); then a torch.profiler table of one ``sample()`` call,
which separates the GPU's own time from the host's.

    python benchmarks/decode_gpu.py        # needs CUDA; see BENCHMARKS.md, "On a GPU and on several processes"
"""
import time

import torch
from peft import LoraConfig
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

from elastic_reset.lm.lora import add_lora
from elastic_reset.rl.config import SamplingConfig
from elastic_reset.rl.sampling import sample


def main() -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).cuda()
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = add_lora(model, lora)
    model.eval()
    B, TQ, N = 16, 16, 32
    ids = torch.randint(3, 49152, (B, TQ), device="cuda")
    mask = torch.ones_like(ids)
    mask[:4, :3] = 0  # some left padding, as in real batches

    def timed(fn, reps=3):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2] / N * 1e3

    @torch.no_grad()
    def gen(dtype=None):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, min_new_tokens=N, max_new_tokens=N,
                           top_p=1.0, top_k=0, temperature=1.0, pad_token_id=2)

    def ours(dtype, ids=ids, mask=mask, **kw):
        g = torch.Generator("cuda").manual_seed(0)
        sample(model, ids, mask, SamplingConfig(max_new_tokens=N, min_new_tokens=N, **kw), pad_token_id=2,
               eos_token_id=2, generator=g, autocast_dtype=dtype)

    @torch.no_grad()
    def raw(dtype=None):
        from transformers import DynamicCache
        cache = DynamicCache()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1)
            am = mask
            for _ in range(N - 1):
                am = torch.cat([am, am.new_ones(B, 1)], 1)
                out = model(input_ids=tok[:, None], attention_mask=am, cache=out.cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1)

    print("ms per token, batch 16, 32 new tokens, prompt 16, torch", torch.__version__, torch.cuda.get_device_name())
    print(f"HF generate fp32 (TRL's sampler)        {timed(gen):6.1f}")
    print(f"HF generate bf16 autocast               {timed(lambda: gen(torch.bfloat16)):6.1f}")
    print(f"ours sample() bf16 autocast             {timed(lambda: ours(torch.bfloat16)):6.1f}")
    print(f"ours sample() fp32                      {timed(lambda: ours(None)):6.1f}")
    print(f"ours sample() bf16, no EOS check at all {timed(lambda: ours(torch.bfloat16, stop_at_eos=False)):6.1f}")
    print(f"raw forward loop fp32 (argmax)          {timed(raw):6.1f}")
    print(f"raw forward loop bf16 autocast          {timed(lambda: raw(torch.bfloat16)):6.1f}")
    # Issue 40: graph-captured steps. The bandwidth limit: every step reads each weight once (bf16: 2 bytes each).
    weight_bytes = 2 * sum(p.numel() for p in model.parameters())
    bandwidth = {"H100": 3.35e12, "H200": 4.8e12}
    peak = next((v for k, v in bandwidth.items() if k in torch.cuda.get_device_name()), None)
    limit = f", bandwidth limit {peak / weight_bytes:,.0f} steps/s" if peak else ""
    print(f"weights {weight_bytes / 1e9:.2f} GB in bf16{limit}")
    for batch in (16, 64):
        big_ids = torch.randint(3, 49152, (batch, TQ), device="cuda")
        big_mask = torch.ones_like(big_ids)
        big_mask[: batch // 4, :3] = 0
        for graphs in (False, True):
            ms = timed(lambda: ours(torch.bfloat16, big_ids, big_mask, cuda_graphs=graphs))
            print(f"ours sample() bf16, batch {batch:3d}, cuda_graphs={graphs!s:5}: {ms:6.2f} ms per step, "
                  f"{batch * 1e3 / ms:8,.0f} tokens/s")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ours(torch.bfloat16)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
