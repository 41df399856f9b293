"""The small IMDB policy builder (``elastic-reset build-policy``), on a few sentences and a tiny config."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_reset.pretrain.imdb import PretrainConfig, pretrain_policy
from elastic_reset.tasks.vader import PRETRAIN_TEXTS, REFERENCE_TEXTS

TINY = PretrainConfig(vocab_size=300, n_layer=1, n_embd=64, context=16, batch_size=4, steps=40, lr=3e-3)


def test_pretraining_learns_the_text_and_writes_a_loadable_folder(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = PRETRAIN_TEXTS * 4
    metrics = pretrain_policy(texts, REFERENCE_TEXTS, tmp_path / "policy", TINY, log=lambda _: None)
    untrained = pretrain_policy(texts, REFERENCE_TEXTS, tmp_path / "untrained",
                                PretrainConfig(**{**TINY.__dict__, "steps": 1}), log=lambda _: None)
    # Trained on the pretraining sentences: far better than one step, even on other (held-out) sentences.
    assert metrics["held_out_perplexity"] < 0.5 * untrained["held_out_perplexity"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and len(tokenizer) == model.config.vocab_size
    text = PRETRAIN_TEXTS[0]
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level BPE is lossless
    assert json.loads((tmp_path / "policy" / "pretrain_metrics.json").read_text())["config"]["steps"] == 40
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_the_rl_engine_loads_the_built_policy_by_name(tmp_path, monkeypatch):
    from elastic_reset.rl.config import config_from_dict
    from elastic_reset.rl.trainer import RLTrainer

    monkeypatch.setenv("ELASTIC_RESET_CACHE", str(tmp_path / "cache"))
    config = config_from_dict({"steps": 1, "model": {"name": "imdb-gpt2", "max_prompt_tokens": 8},
                               "task": {"name": "vader"}, "sampling": {"max_new_tokens": 4},
                               "algo": {"prompts_per_step": 2, "minibatch_size": 2}, "eval": {"every": 0},
                               "progress": False})
    with pytest.raises(FileNotFoundError, match="elastic-reset build-policy imdb"):
        RLTrainer(config, tmp_path / "run")
    pretrain_policy(PRETRAIN_TEXTS, REFERENCE_TEXTS, tmp_path / "cache" / "imdb-gpt2", TINY, log=lambda _: None)
    trainer = RLTrainer(config, tmp_path / "run2")
    record = trainer.train_step()
    assert torch.isfinite(torch.tensor(record["reward"])) and record["response_length"] > 0
