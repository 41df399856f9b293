"""What the project trains before RL, on tiny data and models: the small IMDB policy (``elastic-reset build
imdb-policy``) and the sentiment classifier's training on transformers' ``Trainer`` (``build imdb-classifier``)."""

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
    with pytest.raises(FileNotFoundError, match="elastic-reset build imdb-policy"):
        RLTrainer(config, tmp_path / "run")
    pretrain_policy(PRETRAIN_TEXTS, REFERENCE_TEXTS, tmp_path / "cache" / "imdb-gpt2", TINY, log=lambda _: None)
    trainer = RLTrainer(config, tmp_path / "run2")
    record = trainer.train_step()
    assert torch.isfinite(torch.tensor(record["reward"])) and record["response_length"] > 0


def tiny_bert_folder(path):
    """A randomly initialised two-layer, 32-wide BERT with the byte-level test tokenizer, saved as a folder."""
    from transformers import BertConfig, BertModel

    from elastic_reset.models import byte_tokenizer

    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_classifier_trains_on_the_trainer_and_its_loss_falls(tmp_path):
    # A trivially learnable set (the last word says the label): the Trainer-based loop runs end to end, the loss
    # falls, and the folder it writes loads back as the reward.
    import random

    from elastic_reset.pretrain.classifier import train_sentiment_classifier
    from elastic_reset.rewards.classifier import SentimentReward

    rng = random.Random(0)
    texts = [" ".join(rng.choice("abcdefg") for _ in range(rng.randint(2, 12))) + (" yes" if i % 2 else " no")
             for i in range(128)]
    labels = [i % 2 for i in range(128)]
    lines = []
    metrics = train_sentiment_classifier(texts, labels, tmp_path / "clf", base_model=tiny_bert_folder(tmp_path / "b"),
                                         epochs=4, batch_size=16, lr=3e-3, max_length=32, seed=0,
                                         eval_texts=texts[:32], eval_labels=labels[:32], log=lines.append,
                                         log_every=8)
    assert metrics["trainer"] == "transformers.Trainer" and metrics["steps"] == 32 == len(metrics["train_loss"])
    first, last = metrics["train_loss"][:8], metrics["train_loss"][-8:]
    assert sum(last) / 8 < 0.8 * sum(first) / 8, metrics["train_loss"]
    assert metrics["final_train_loss"] == pytest.approx(sum(last) / 8)
    assert metrics["test_accuracy"] >= 0.9
    assert sum(line.startswith("epoch ") for line in lines) == 4  # one line every 8 steps
    reward = SentimentReward(tmp_path / "clf", max_length=32)
    assert reward.tokenizer.truncation_side == "left" and reward.model.config.id2label == {0: "negative",
                                                                                          1: "positive"}
    # The accuracy the build reports is the reward's own on the same texts (the Trainer returns predictions in
    # its length-grouped order: each must meet its own label).
    scores = reward.score(texts[:32])
    right = sum((p >= 0.5) == bool(y) for p, y in zip(scores, labels[:32]))
    assert abs(right - 32 * metrics["test_accuracy"]) <= 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
