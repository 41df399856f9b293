"""Selective Rehearsal (paper 2 §3.2): the selection, the loss term, and what it does to a run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import REHEARSAL, tiny_config

from elastic_reset.errors import ConfigError
from elastic_reset.lm.scoring import forward_response
from elastic_reset.rl import components as components_module
from elastic_reset.rl.rehearsal import Rehearsal, select_representatives
from elastic_reset.rl.trainer import RLTrainer


def blobs(sizes: list[int]) -> np.ndarray:
    """Points around far-apart centres, ``sizes[i]`` around centre i: k-means finds exactly these groups."""
    rng = np.random.default_rng(0)
    return np.concatenate([10.0 * i + 0.01 * rng.standard_normal((n, 4)) for i, n in enumerate(sizes)])


def test_selection_keeps_the_best_k_of_every_cluster():
    scores = [0.1, 0.9, 0.5, 0.7,   # group 0: best are 1, 3
              0.2, 0.3, 0.8, 0.0,   # group 1: 6, 5
              0.6, 0.4, 0.95, 0.5]  # group 2: 10, 8
    chosen = select_representatives(blobs([4, 4, 4]), scores, clusters=3, top_k=2)
    groups = {}
    for index, cluster in chosen:
        groups.setdefault(cluster, []).append(index)
    assert sorted(groups.values()) == [[1, 3], [6, 5], [10, 8]]  # best first inside each cluster


def test_a_cluster_smaller_than_top_k_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^rehearsal.top_k: 2 per cluster, but cluster \d holds 1 of the 9"):
        select_representatives(blobs([4, 4, 1]), np.arange(9.0), clusters=3, top_k=2)
    with pytest.raises(ConfigError, match="^rehearsal.clusters: 4 clusters of 3 candidates"):
        select_representatives(blobs([3]), np.arange(3.0), clusters=4, top_k=1)


def test_the_loss_is_gamma_times_the_mean_summed_response_nll():
    from elastic_reset.models import tiny_causal_lm

    torch.manual_seed(0)
    model = tiny_causal_lm()
    examples = [{"prompt": "a", "response": "b", "query_ids": [5, 6, 7], "response_ids": [8, 9], "score": 1.0,
                 "cluster": 0},
                {"prompt": "c", "response": "d", "query_ids": [10], "response_ids": [11, 12, 13], "score": 0.5,
                 "cluster": 1}]
    rehearsal = Rehearsal(examples, coef=0.01, batch=2)
    loss, stats = rehearsal.loss(lambda batch: forward_response(model, batch).logprobs, rehearsal.next_batch(0))

    def summed_nll(query, response):  # by hand: one unpadded sequence, log-softmax of the next-token logits
        ids = torch.tensor([query + response])
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        return -sum(logp[len(query) - 1 + t, tok] for t, tok in enumerate(response))

    with torch.no_grad():
        nlls = [summed_nll(e["query_ids"], e["response_ids"]) for e in examples]
    assert float(loss.detach()) == pytest.approx(0.01 * float(sum(nlls)) / 2, rel=1e-4)
    assert stats["rehearsal/nll"] == pytest.approx(float(sum(nlls)) / 5, rel=1e-4)  # per token: 5 tokens
    loss.backward()  # it trains the policy
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_a_run_rehearses_the_initial_policys_best_answers_and_trains_on_the_other_prompts(tmp_path, monkeypatch):
    # 2 iterations of 4 optimizer steps, 4 examples each: 32 = 5 rounds of the 6 examples and 2 more.
    run = ("method.name=selective_rehearsal", *REHEARSAL, "rehearsal.batch=4", "checkpoint_every=1")
    config = tiny_config(*run, "steps=2")
    trainer = RLTrainer(config, tmp_path / "run")
    examples = [json.loads(line) for line in (tmp_path / "run" / "rehearsal.jsonl").read_text().splitlines()]
    assert len(examples) == 6 and sorted(e["cluster"] for e in examples) == [0, 0, 0, 1, 1, 1]
    reserved = {e["prompt"] for e in examples}
    assert reserved <= set(trainer.task.train_prompts) and not reserved & set(trainer.train_prompts)
    assert len(trainer.train_prompts) == len(trainer.task.train_prompts) - len(reserved)
    for cluster in (0, 1):  # what the initial policy wrote, best first within a cluster
        scores = [e["score"] for e in examples if e["cluster"] == cluster]
        assert scores == sorted(scores, reverse=True)
    records = trainer.train()
    assert all("rehearsal/nll" in r for r in records if "policy_loss" in r)

    # Resumed, the run reads its set back instead of sampling a new one, and continues its rehearsal order.
    def no_sampling(*args):
        raise AssertionError("a resumed run selected its rehearsal set again")

    monkeypatch.setattr(components_module, "choose_examples", no_sampling)
    resumed = RLTrainer(tiny_config(*run, "steps=3"), tmp_path / "run", resume=True)
    assert rehearsal_of(resumed).examples == examples
    assert rehearsal_of(resumed).position == rehearsal_of(trainer).position == 2
    resumed.close()


def rehearsal_of(trainer) -> Rehearsal:
    """The run's Selective Rehearsal set, held by its rehearsal component."""
    (component,) = [c for c in trainer.components if c.key == "rehearsal"]
    return component.rehearsal


def rehearsal_nll(trainer, examples) -> float:
    """Per-token NLL of every rehearsal example under the trainer's policy now."""
    with torch.no_grad():
        rehearsal = Rehearsal(examples, coef=1.0, batch=len(examples))
        _, stats = rehearsal.loss(lambda batch: trainer.policy.score(batch, masked=False).logprobs,
                                  rehearsal.next_batch(trainer.tokenizer.pad_token_id).to(trainer.device))
    return stats["rehearsal/nll"]


def test_rehearsal_keeps_the_rehearsal_set_likelier_than_plain_rl(tmp_path):
    common = ["steps=12", "algo.lr=3e-3", "kl.coef=0", "kl.target=null", *REHEARSAL]
    with_sr = RLTrainer(tiny_config("method.name=none", "rehearsal.coef=0.2", *common), tmp_path / "sr")
    examples = rehearsal_of(with_sr).examples
    before = rehearsal_nll(with_sr, examples)
    with_sr.train()
    plain = RLTrainer(tiny_config("method.name=none", *common[:4]), tmp_path / "plain")
    plain.train()
    after_sr, after_plain = rehearsal_nll(with_sr, examples), rehearsal_nll(plain, examples)
    assert after_sr < before < after_plain  # rehearsed: likelier than at the start; plain RL: drifted away


def test_rehearsal_settings_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="^rehearsal.top_k: 8 clusters x 4 exceed the 16 candidates"):
        tiny_config("method.name=selective_rehearsal", "rehearsal.prompts=16")
    with pytest.raises(ConfigError, match="^rehearsal: method 'frozen' never updates the policy"):
        tiny_config("method.name=frozen", "rehearsal.top_k=1")
    with pytest.raises(ConfigError, match="^rehearsal.prompts: 64 exceeds the task's 30 training prompts"):
        RLTrainer(tiny_config("method.name=selective_rehearsal", "rehearsal.prompts=64"), tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_rehearsal_set_that_leaves_too_few_training_prompts_is_refused_by_name(tmp_path):
    # 30 training prompts, 6 reserved: 24 left for 25 a step
    config = tiny_config("method.name=selective_rehearsal", *REHEARSAL, "algo.prompts_per_step=25",
                         "algo.minibatch_size=10")
    with pytest.raises(ConfigError, match=r"rehearsal.exclude: the 6 prompts .* leave 24 training prompts"):
        RLTrainer(config, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
