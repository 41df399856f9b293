"""Does training do what it claims? Each algorithm raises a reward, and each drift-control method has its effect.

Tiny byte-level Llama on the ``letter_frequency`` task (reward: the fraction of the completion's characters that
are "e"; the random initial model scores ≈ 0.005). A few dozen iterations take a few seconds. Every test here
compares against a number it could miss: flipping the sign of a policy loss, or switching a method off, makes it
fail (checked by breaking the code on purpose when the tests were written).
"""

from __future__ import annotations

import copy

import pytest
import torch

from elastic_reset.rl import policy as policy_module
from elastic_reset.rl.trainer import RLTrainer
from helpers import ROOT, evals, independent_top_p, learning_config


def train(tmp_path, *overrides: str) -> tuple[RLTrainer, dict[int, dict]]:
    trainer = RLTrainer(learning_config(*overrides), tmp_path)
    return trainer, evals(trainer.train())


# ----------------------------------------------------------------------------------------------- algorithms
GRPO = ("algo.epochs=2", "algo.loss_aggregation=sequence", "algo.clip_range_high=0.28")
"""A TRL GRPO user's: num_iterations 2 (the clipped ratio over a reused batch), loss_type grpo, DAPO's clip-higher."""
TRL_RLOO = ("algo.ratio=sequence_sum", "algo.loss_aggregation=sequence")
"""A TRL RLOOTrainer user's loss (config_from_rloo): the whole completion's ratio, one loss per completion."""


@pytest.mark.parametrize("algo,lr,extra", [("ppo", 3e-3, ()), ("reinforce", 1e-2, ()), ("rloo", 1e-2, ()),
                                           ("rloo", 3e-3, GRPO), ("rloo", 1e-2, TRL_RLOO)])
def test_each_algorithm_raises_the_held_out_reward(tmp_path, algo, lr, extra):
    # PPO takes epochs x minibatches optimizer steps per iteration (REINFORCE/RLOO one): at 1e-2 it learned on one
    # seed of two and collapsed to reward 0 on the other; at 3e-3 it reached 1.0 on both.
    _, ev = train(tmp_path, f"algo.name={algo}", f"algo.lr={lr}", *extra)
    start, end = ev[0]["eval/reward"], ev[30]["eval/reward"]
    assert start < 0.05
    assert end > start + 0.15, f"{algo}: held-out reward {start:.3f} -> {end:.3f} in 30 iterations"


def test_rewards_normalised_before_the_sum_let_a_quiet_reward_be_learned_beside_a_loud_one(tmp_path):
    # GDPO (algo.reward_aggregation): the letter "e" (0..1) beside uniform noise on a scale of 30 (weight 0.3 of
    # 0..100). Summed, the noise drowns the letter's signal; each normalised in its group first, it does not.
    # Measured on seeds 0-2: summed 0.00 -> 0.00 on all three; normalised first 0.00 -> 0.83 / 1.00 / 1.00.
    import random

    from elastic_reset.tasks import get_task
    from elastic_reset.tasks.toy import PROMPTS

    def e_share(prompts, completions, **kwargs):
        return [c.count("e") / len(c) if c else 0.0 for c in completions]

    ends = {}
    for aggregation in ("sum", "normalize_then_sum"):
        rng = random.Random(0)

        def loud_noise(prompts, completions, **kwargs):
            return [100 * rng.random() for _ in completions]
        task = get_task("prompts", dataset=[{"prompt": p} for p in PROMPTS], reward=[e_share, loud_noise],
                        reward_weights=[1.0, 0.3])
        config = learning_config("task.name=prompts", f"algo.reward_aggregation={aggregation}")
        ev = evals(RLTrainer(config, tmp_path / aggregation, task=task).train())
        assert ev[0]["eval/rewards/e_share"] < 0.05
        ends[aggregation] = ev[30]["eval/rewards/e_share"]
    assert ends["normalize_then_sum"] > 0.5 > ends["sum"], ends


# ----------------------------------------------------------------------------------------------- KL penalty
def test_a_kl_penalty_keeps_the_policy_closer_to_the_initial_model(tmp_path):
    _, free = train(tmp_path / "none", "method.name=none")
    _, penalised = train(tmp_path / "kl", "method.name=kl", "kl.coef=0.5")
    free_kl, kl = free[30]["eval/kl_init"], penalised[30]["eval/kl_init"]
    assert kl < 0.5 * free_kl, f"KL to init at the end: beta=0 {free_kl:.2f}, beta=0.5 {kl:.2f}"


# ----------------------------------------------------------------------------------------------- resets
def test_reset_to_init_returns_to_the_initial_policy_and_the_reward_recovers(tmp_path):
    # Resets at 20 and 40. Right after one the policy IS θ0 and evaluation draws the same noise, so step 20
    # reproduces step 0 exactly; the optimizer state is kept (the authors' code), and the reward comes back.
    _, ev = train(tmp_path, "steps=40", "method.name=reset_to_init", "method.reset_every=20", "eval.every=1")
    assert ev[19]["eval/reward"] > ev[0]["eval/reward"] + 0.15
    assert ev[20]["eval/reward"] == ev[0]["eval/reward"] and ev[20]["eval/kl_init"] == pytest.approx(0, abs=1e-5)
    assert ev[39]["eval/reward"] > ev[0]["eval/reward"] + 0.15


@pytest.mark.parametrize("method", ["elastic_reset", "reset_to_ema"])
def test_a_reset_to_the_ema_pulls_the_policy_back_and_the_reward_recovers(tmp_path, method):
    # The EMA updated once per iteration with decay 0.9 (the authors' IMDB clock): at the first reset, at step 10
    # while the reward is still rising, 0.9^10 = 35 % of the EMA is θ0, so the policy jumps back towards θ0 (less
    # KL), then learns back. Resets at 10, 20 and 30.
    trainer, ev = train(tmp_path, f"method.name={method}", "method.reset_every=10", "method.decay=0.9",
                        "method.ema_update=iteration", "eval.every=1", "eval.ema=false")
    before, after = ev[9]["eval/kl_init"], ev[10]["eval/kl_init"]
    assert after < 0.8 * before, f"KL to init before/after the reset: {before:.2f} / {after:.2f}"
    assert ev[29]["eval/reward"] > ev[0]["eval/reward"] + 0.15
    ema = trainer.method.ema
    assert ema.num_resets == 3
    assert all(torch.equal(p.detach(), e) for p, e in zip(ema.params, ema.ema)) == (method == "reset_to_ema")
    # Elastic Reset restarts the EMA at θ0 after the policy took its value; reset-to-EMA never restarts it.
    assert all(torch.equal(e, t0) for e, t0 in zip(ema.ema, ema.init)) == (method == "elastic_reset")


def test_ema_only_tracks_a_slower_copy_that_drifts_less(tmp_path):
    trainer, ev = train(tmp_path, "method.name=ema_only", "method.decay=0.9")
    end = ev[30]
    assert trainer.method.ema.num_resets == 0
    assert 0 < end["eval_ema/kl_init"] < end["eval/kl_init"]
    assert end["eval_ema/reward"] > ev[0]["eval/reward"] + 0.05  # the EMA learned too, just later


# ----------------------------------------------------------------------------------------------- NLPO
def test_nlpo_only_samples_what_the_delayed_mask_model_allows(tmp_path, monkeypatch):
    # The mask model stays the initial policy for the whole run (update_every > steps). Every token the policy
    # samples in training must lie in the INITIAL policy's top-p set, recomputed here independently; plain RL
    # leaves that set as soon as it learns to write "e".
    captured = []
    real_sample = policy_module.sample

    def spy(model, query_ids, query_mask, *args, **kwargs):
        rollout = real_sample(model, query_ids, query_mask, *args, **kwargs)
        captured.append((query_ids, query_mask, rollout))
        return rollout

    def allowed(initial, ids, mask, r, eos_id: int) -> torch.Tensor:
        """[B, Tr] bool: whether each sampled token is in the initial policy's top-0.1 set (at least 4 tokens;
        EOS excluded, as the sampler excludes it before min_new_tokens), recomputed without a KV cache."""
        out = torch.ones(r.response_ids.shape, dtype=torch.bool)
        with torch.no_grad():
            for i in range(len(r)):
                query, n = ids[i, mask[i].bool()][None], int(r.response_mask[i].sum())
                logits = initial(input_ids=torch.cat([query, r.response_ids[i, :n - 1][None]], 1)).logits[0]
                logits = logits[query.shape[1] - 1:].index_fill(-1, torch.tensor([eos_id]), float("-inf"))
                sets = independent_top_p(logits, 0.1, 4)
                out[i, :n] = sets.gather(-1, r.response_ids[i, :n, None]).squeeze(-1)
        return out

    def outside_initial_top_p(method: str) -> float:
        captured.clear()
        trainer = RLTrainer(learning_config(f"method.name={method}", "method.nlpo_top_p=0.1",
                                            "method.nlpo_min_tokens=4", "method.nlpo_update_every=1000",
                                            "eval.every=0"), tmp_path / method)
        initial = copy.deepcopy(trainer.model)
        monkeypatch.setattr(policy_module, "sample", spy)
        trainer.train()
        monkeypatch.undo()
        outside = total = 0
        for ids, mask, r in captured[-5:]:
            valid = r.response_mask.bool()
            outside += int((~allowed(initial, ids, mask, r, trainer.tokenizer.eos_token_id) & valid).sum())
            total += int(valid.sum())
        return outside / total

    assert outside_initial_top_p("nlpo") == 0.0
    assert outside_initial_top_p("none") > 0.03


# ----------------------------------------------------------------------------------------------- multitask
def test_multitask_keeps_the_pretraining_text_likely(tmp_path):
    def pretrain_nll(trainer: RLTrainer) -> float:
        with torch.no_grad():
            return float(trainer.policy.nll(trainer.task.pretrain_texts))

    plain, _ = train(tmp_path / "none", "method.name=none", "eval.every=0")
    multitask, _ = train(tmp_path / "multitask", "method.name=multitask", "method.multitask_coef=1.0",
                         "eval.every=0")
    assert pretrain_nll(multitask) < pretrain_nll(plain) - 0.5


def test_the_smoke_config_visibly_learns(tmp_path):
    # configs/smoke.yaml is what a newcomer runs to see the install work: its held-out reward must rise clearly.
    from elastic_reset.rl.config import load_config

    records = RLTrainer(load_config(ROOT / "configs" / "smoke.yaml", ["progress=false"]), tmp_path / "run").train()
    first, last = evals(records)[0]["eval/reward"], evals(records)[30]["eval/reward"]
    assert first < 0.1 and last > 0.9
