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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_cuda_build_without_cuda_is_refused_naming_the_option(tmp_path):
    from elastic_reset.errors import ConfigError

    with pytest.raises(ConfigError, match="^--device: 'cuda' asked for"):
        pretrain_policy(PRETRAIN_TEXTS, REFERENCE_TEXTS, tmp_path / "policy", TINY, log=lambda _: None, device="cuda")
    assert not (tmp_path / "policy").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_policy_builds_on_a_gpu_as_on_the_cpu(tmp_path):
    texts = PRETRAIN_TEXTS * 4
    cpu = pretrain_policy(texts, REFERENCE_TEXTS, tmp_path / "cpu", TINY, log=lambda _: None, device="cpu")
    gpu = pretrain_policy(texts, REFERENCE_TEXTS, tmp_path / "gpu", TINY, log=lambda _: None, device="cuda")
    assert cpu["device"] == "cpu" and gpu["device"].startswith("cuda")
    # The same initial weights and batches: fp32 on either device ends at nearly the same perplexity.
    assert gpu["held_out_perplexity"] == pytest.approx(cpu["held_out_perplexity"], rel=0.02)


@pytest.mark.parametrize("name,folder,marker,command", [
    ("imdb_policy_path", "imdb-gpt2", "config.json", "build imdb-policy"),
    ("imdb_smollm2_path", "imdb-smollm2", "config.json", "build imdb-smollm2"),
    ("translation_agents_path", "translation-game", "fr-en/config.json", "build translation-agents")])
def test_a_built_model_is_found_in_the_cache_and_a_missing_one_names_its_build_command(tmp_path, monkeypatch, name,
                                                                                      folder, marker, command):
    import elastic_reset.models as models

    monkeypatch.setenv("ELASTIC_RESET_CACHE", str(tmp_path))
    path_of = getattr(models, name)
    (tmp_path / folder / marker).parent.mkdir(parents=True)  # a folder without the model is not the model
    with pytest.raises(FileNotFoundError, match=f"elastic-reset {command}"):
        path_of()
    assert path_of(required=False) == tmp_path / folder  # where the build writes it
    (tmp_path / folder / marker).write_text("{}")
    assert path_of() == tmp_path / folder


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


# ------------------------------------------------------------------ build imdb-smollm2 (tiny-llama stands in)
SMALL_ADAPT = dict(base="tiny-llama", context=32, batch_size=4, save_steps=10)


# A random tiny model learns the byte distribution mostly through its embeddings, which LoRA leaves alone.
@pytest.mark.parametrize("lora_r, lr, ratio", [(None, 3e-3, 0.5), (4, 3e-2, 0.8)])
def test_adapting_lowers_held_out_perplexity_and_writes_a_plain_model(tmp_path, lora_r, lr, ratio):
    from transformers import AutoModelForCausalLM

    from elastic_reset.pretrain.imdb_smollm2 import AdaptConfig, adapt_smollm2

    torch.set_num_threads(1)
    config = AdaptConfig(steps=40, lora_r=lora_r, lr=lr, **SMALL_ADAPT)
    metrics = adapt_smollm2(PRETRAIN_TEXTS * 4, REFERENCE_TEXTS, tmp_path / "policy", config, log=lambda _: None)
    assert metrics["held_out_perplexity"] < ratio * metrics["held_out_perplexity_before"]
    assert not (tmp_path / "policy.checkpoints").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")  # LoRA merged: a plain model, no adapter
    assert not any("lora" in name for name, _ in model.named_parameters())
    stored = json.loads((tmp_path / "policy" / "pretrain_metrics.json").read_text())
    assert stored["config"]["lora_r"] == lora_r and stored["held_out_perplexity"] == metrics["held_out_perplexity"]
    # What the policy writes, before and after, on the same random numbers: the first held-out reviews continued.
    assert [s["prompt"] for s in stored["samples"]] == [REFERENCE_TEXTS[i][:32] for i in range(3)]
    assert all(s["after"] and s["before"] != s["after"] for s in stored["samples"])


def test_an_interrupted_adaptation_resumes_to_the_same_model(tmp_path, monkeypatch):
    from transformers import Trainer, TrainerCallback

    from elastic_reset.pretrain.imdb_smollm2 import AdaptConfig, adapt_smollm2

    torch.set_num_threads(1)
    config = AdaptConfig(steps=30, lr=3e-3, **SMALL_ADAPT)
    texts = PRETRAIN_TEXTS * 4
    full = adapt_smollm2(texts, REFERENCE_TEXTS, tmp_path / "full", config, log=lambda _: None)

    class Steps(TrainerCallback):  # the steps this process trains; crashes at crash_at
        def __init__(self, crash_at=None):
            self.crash_at, self.done = crash_at, set()

        def on_step_end(self, args, state, control, **kwargs):
            self.done.add(state.global_step)
            if state.global_step == self.crash_at:
                raise KeyboardInterrupt

    def watched(steps):  # the build makes its own Trainer: add ours beside each callback it adds
        add = Trainer.add_callback
        monkeypatch.setattr(Trainer, "add_callback", lambda self, cb: (add(self, cb), add(self, steps))[0])

    watched(Steps(crash_at=25))
    with pytest.raises(KeyboardInterrupt):
        adapt_smollm2(texts, REFERENCE_TEXTS, tmp_path / "cut", config, log=lambda _: None)
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match="--resume"):
        adapt_smollm2(texts, REFERENCE_TEXTS, tmp_path / "cut", config, log=lambda _: None)
    watched(steps := Steps())
    resumed = adapt_smollm2(texts, REFERENCE_TEXTS, tmp_path / "cut", config, resume=True, log=lambda _: None)
    assert steps.done == set(range(21, 31))  # from the checkpoint of step 20, not from the start
    assert resumed["train_loss"][-1] == pytest.approx(full["train_loss"][-1], rel=1e-4)
    assert resumed["held_out_perplexity"] == pytest.approx(full["held_out_perplexity"], rel=1e-4)


def test_the_build_refuses_a_bad_setting_before_anything_loads(tmp_path):
    from elastic_reset.errors import ConfigError
    from elastic_reset.pretrain.imdb_smollm2 import AdaptConfig, adapt_smollm2

    for bad, field in ((AdaptConfig(base="gpt2"), "base"), (AdaptConfig(lora_r=0), "lora_r"),
                       (AdaptConfig(lr=float("nan")), "lr"), (AdaptConfig(steps=0), "steps")):
        with pytest.raises(ConfigError, match=f"^{field}: expected"):
            adapt_smollm2(["a review"], ["another"], tmp_path / "policy", bad, log=lambda _: None)


def test_the_build_command_trains_lora_16_by_default_and_every_weight_with_lora_r_0(monkeypatch, tmp_path):
    from elastic_reset.cli import main
    from elastic_reset.pretrain import imdb_smollm2

    seen = []
    monkeypatch.setattr(imdb_smollm2, "build_imdb_smollm2", lambda data_dir, out, config, **kw: seen.append(config)
                        or (tmp_path, {"held_out_perplexity_before": 2.0, "held_out_perplexity": 1.0,
                                       "train_seconds": 0.0}))
    assert main(["build", "imdb-smollm2", "--out", str(tmp_path)]) == 0
    assert main(["build", "imdb-smollm2", "--out", str(tmp_path), "--lora-r", "0"]) == 0
    assert [c.lora_r for c in seen] == [16, None] and [c.learning_rate() for c in seen] == [1e-3, 5e-5]
