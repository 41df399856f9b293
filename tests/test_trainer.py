"""The RL engine end to end on a tiny byte-level Llama: every method and algorithm, resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from elastic_reset.io import read_metrics
from elastic_reset.rl.config import ConfigError, load_config
from elastic_reset.errors import DataFileError, RewardError, RunFileError
from elastic_reset.rl import ops
from elastic_reset.rl.trainer import RLTrainer
from elastic_reset.tasks import Task, get_task
from helpers import sigkill_after_step, tiny_config, trainable, without_times

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"



# ----------------------------------------------------------------------------------------------- methods
@pytest.mark.parametrize("algo,minibatch", [("ppo", 4), ("reinforce", 4), ("rloo", 4), ("reinforce", 8), ("rloo", 8)])
def test_each_algorithm_trains_and_logs(tmp_path, algo, minibatch):
    # minibatch 8 = the whole rollout: REINFORCE/RLOO then reuse the update's forward for the KL (the fused path).
    config = tiny_config(f"algo.name={algo}", "method.name=kl", f"algo.minibatch_size={minibatch}")
    trainer = RLTrainer(config, tmp_path)
    before = trainable(trainer)
    records = trainer.train()
    after = trainable(trainer)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-4)  # before the first update the policy is the reference
    assert any(not torch.equal(before[n], after[n]) for n in before)
    for key in ("reward", "kl", "kl_coef", "entropy", "policy_loss", "time/sample", "time/update"):
        assert all(math.isfinite(r[key]) for r in records), key
    if algo == "ppo":
        assert all("value_loss" in r and "clipfrac" in r for r in records)


def test_single_pass_ppo_equals_ppo_with_a_separate_old_forward(tmp_path):
    # One epoch of one minibatch: the update's own forward gives the old log-probs and values (ratio exactly 1).
    # Its optimizer step must be the one a run that recomputes them in a separate no-grad forward takes first.
    fused = RLTrainer(tiny_config("algo.epochs=1", "algo.minibatch_size=8"), tmp_path / "fused")
    separate = RLTrainer(tiny_config("algo.epochs=2", "algo.minibatch_size=8"), tmp_path / "separate")
    first: dict[str, torch.Tensor] = {}
    original = separate.optimizer.step

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        if not first:
            first.update(trainable(separate))
            first.update({f"head.{k}": v.clone() for k, v in separate.value_head.state_dict().items()})
        return out

    separate.optimizer.step = spy
    record = fused.train_step()
    separate.train_step()
    assert record["ratio_mean"] == 1.0 and record["clipfrac"] == 0.0 and record["approx_kl"] == 0.0
    after = {**trainable(fused), **{f"head.{k}": v for k, v in fused.value_head.state_dict().items()}}
    assert after.keys() == first.keys()
    for name, value in after.items():
        torch.testing.assert_close(value, first[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ratio,surrogate", [("token", "clip"), ("sequence", "clip"), ("token", "cispo")])
def test_rloo_with_a_ratio_reuses_its_batch_for_every_epoch(tmp_path, ratio, surrogate):
    # TRL's num_iterations: 2 epochs x 2 minibatches = 4 optimizer steps an iteration, the later ones off-policy
    tight = "algo.clip_range_high=1.0001" if surrogate == "cispo" else "algo.clip_range=0.0001"
    trainer = RLTrainer(tiny_config("algo.name=rloo", "algo.samples_per_prompt=2", "algo.epochs=2",
                                    f"algo.ratio={ratio}", "algo.minibatch_size=4", f"algo.surrogate={surrogate}",
                                    tight), tmp_path)
    steps = []
    original = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (steps.append(1), original(*a, **k))[1]
    record = trainer.train_step()
    assert len(steps) == 4
    assert record["ratio_mean"] != 1.0 and record["approx_kl"] > 0  # the second epoch saw a moved policy
    # the later steps' ratios outside 1 ± 1e-4 (clip) or above 1.0001 (CISPO's cap, TRL's epsilon_high) are clipped
    assert record["clipfrac"] > 0


def test_nlpo_with_a_ratio_starts_each_batch_at_ratio_one(tmp_path):
    # The sampler records the unmasked log-probs; a ratio must be taken against NLPO's masked distribution, which
    # the first optimizer step on a fresh batch (the policy that sampled it) gives again: approx_kl 0.
    trainer = RLTrainer(tiny_config("method.name=nlpo", "method.nlpo_top_p=0.5", "algo.name=rloo",
                                    "algo.samples_per_prompt=2", "algo.epochs=2", "algo.minibatch_size=8"), tmp_path)
    seen = []
    original = trainer.estimator.loss
    trainer.estimator.loss = lambda *args: (lambda r: (seen.append(r[1]), r)[1])(original(*args))
    trainer.train_step()
    assert seen[0]["approx_kl"] == pytest.approx(0.0, abs=1e-6) and seen[1]["approx_kl"] > 1e-5


def test_top_entropy_quantile_takes_the_gradient_from_the_high_entropy_tokens_only(tmp_path):
    # the same seed samples the same batch: the loss sees its advantages at the top 30 % of the real tokens by this
    # forward's entropy and 0 at the others; the logged entropy (over every token) is unchanged
    common = ("algo.name=rloo", "algo.samples_per_prompt=2", "algo.minibatch_size=8", "algo.epochs=1")
    seen, records = {}, {}
    for name, extra in (("every", ()), ("top", ("algo.top_entropy_quantile=0.3",))):
        trainer = RLTrainer(tiny_config(*common, *extra), tmp_path / name)

        def spy(out, mb, tokens=None, name=name, loss=trainer.estimator.loss):
            seen.setdefault(name, (out.entropy.detach(), mb))  # the first minibatch: the whole batch
            return loss(out, mb, tokens)
        trainer.estimator.loss = spy
        records[name] = trainer.train_step()
    (entropy, top), (_, every) = seen["top"], seen["every"]
    real = every.mask.bool()
    high = ops.high_entropy_mask(entropy, every.mask, 0.3)
    assert 0.25 <= high.sum() / real.sum() <= 0.35
    assert torch.equal(top.advantages, torch.where(high, every.advantages, 0.0))
    assert (every.advantages[real & ~high] != 0).any()  # something was zeroed
    assert records["top"]["entropy"] == pytest.approx(records["every"]["entropy"])
    assert records["top"]["reward"] == records["every"]["reward"]


@pytest.mark.parametrize("minibatch", [4, 8])
def test_a_batch_token_loss_divides_by_the_batchs_mean_tokens_per_minibatch(tmp_path, minibatch):
    # TRL's dapo: every minibatch's token sum over the same number, the batch's real tokens per optimizer step
    common = ("algo.name=rloo", "algo.samples_per_prompt=2", f"algo.minibatch_size={minibatch}", "algo.epochs=2")
    trainer = RLTrainer(tiny_config(*common, "algo.loss_aggregation=batch_token"), tmp_path)
    seen, loss = [], trainer.estimator.loss
    trainer.estimator.loss = lambda out, mb, step_tokens=None: (seen.append((float(mb.mask.sum()), step_tokens))
                                                                or loss(out, mb, step_tokens))
    trainer.train_step()
    tokens, divisors = zip(*seen)
    assert len(seen) == 2 * 8 // minibatch and len(set(divisors)) == 1
    assert divisors[0] == pytest.approx(sum(tokens) / len(seen)) and divisors[0] > 1


@pytest.mark.parametrize("ratio", ["token", "sequence"])
def test_a_ratio_on_a_batch_used_once_gives_the_plain_policy_gradient(tmp_path, ratio):
    # One optimizer step on the whole batch: the ratio is exactly 1 and its gradient is -A·∇log π, REINFORCE's.
    common = ("algo.name=rloo", "algo.samples_per_prompt=2", "algo.minibatch_size=8", "algo.epochs=1")
    plain = RLTrainer(tiny_config(*common, "algo.ratio=none"), tmp_path / "plain")
    clipped = RLTrainer(tiny_config(*common, f"algo.ratio={ratio}"), tmp_path / "clipped")
    plain.train_step()
    record = clipped.train_step()
    assert record["ratio_mean"] == 1.0 and record["clipfrac"] == 0.0
    after = trainable(plain)
    for name, value in trainable(clipped).items():
        torch.testing.assert_close(value, after[name], rtol=1e-5, atol=1e-6)


def test_reset_to_init_returns_the_policy_to_its_initial_weights_but_not_the_value_head(tmp_path):
    config = tiny_config("method.name=reset_to_init", "method.reset_every=3")
    trainer = RLTrainer(config, tmp_path)
    theta0 = trainable(trainer)
    head0 = {k: v.clone() for k, v in trainer.value_head.state_dict().items()}
    records = trainer.train()
    assert records[-1]["reset"]["index"] == 1 and "reset" not in records[0]
    for name, value in trainable(trainer).items():
        assert torch.equal(value, theta0[name]), name
    # The value head trained through the reset: the value function is never reset (paper §6, Appendix E.1).
    assert any(not torch.equal(v, head0[k]) for k, v in trainer.value_head.state_dict().items())
    assert not any("summary" in n for n in trainer.method.ema.names)


def test_elastic_reset_sets_policy_to_ema_and_ema_to_init(tmp_path):
    config = tiny_config("method.name=elastic_reset", "method.reset_every=3", "method.decay=0.5")
    trainer = RLTrainer(config, tmp_path)
    theta0 = trainable(trainer)
    ema = trainer.method.ema
    seen = {}
    original_step = ema.step

    def spy(update_ema=True):  # capture θ̄ just before the reset that happens in this call
        if update_ema:
            ema.update()
        seen["ema"] = [t.clone() for t in ema.ema]
        return original_step(update_ema=False)

    ema.step = spy
    trainer.train()
    assert ema.num_resets == 1
    for name, value, pre_reset_ema in zip(ema.names, ema.params, seen["ema"]):
        torch.testing.assert_close(value.detach(), pre_reset_ema, rtol=0, atol=0)
    for name, value in zip(ema.names, ema.ema):
        assert torch.equal(value, theta0[name]), name
    assert any(not torch.equal(p.detach(), theta0[n]) for n, p in zip(ema.names, ema.params))


@pytest.mark.parametrize("clock,updates", [("step", 3 * 2 * 2), ("epoch", 3 * 2), ("iteration", 3)])
def test_ema_update_clock(tmp_path, clock, updates):
    # 3 iterations × 2 epochs × (8 samples / minibatch 4 = 2 optimizer steps).
    config = tiny_config("method.name=ema_only", f"method.ema_update={clock}")
    trainer = RLTrainer(config, tmp_path)
    calls = []
    original = trainer.method.ema.update
    trainer.method.ema.update = lambda: (calls.append(1), original())[1]
    trainer.train()
    assert len(calls) == updates
    assert trainer.method.ema.num_resets == 0 and trainer.method.ema.num_steps == 3


def test_method_none_ignores_the_kl_penalty(tmp_path):
    records = RLTrainer(tiny_config("method.name=none"), tmp_path).train()
    assert all(r["kl_coef"] == 0.0 for r in records)


@pytest.mark.parametrize("algo", ["rloo", "ppo"])
def test_masked_truncated_completions_give_no_gradient_and_clipped_ratio_counts_them(tmp_path, algo):
    from elastic_reset.lm.rollout import Rollout

    # EOS suppressed until max_new_tokens: every response is cut off (clipped_ratio 1)
    cut = ("sampling.min_new_tokens=12", "sampling.max_new_tokens=12", f"algo.name={algo}", "algo.minibatch_size=8")
    masked = RLTrainer(tiny_config(*cut, "algo.mask_truncated_completions=true"), tmp_path / "masked")
    before = trainable(masked)
    record = masked.train_step()
    assert record["clipped_ratio"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in trainable(masked).items())  # Adam's first step on 0 grads
    plain = RLTrainer(tiny_config(*cut), tmp_path / "plain")
    before = trainable(plain)
    plain.train_step()
    assert any(not torch.equal(p, before[n]) for n, p in trainable(plain).items())

    eos = masked.tokenizer.eos_token_id
    ids = torch.tensor([[5, eos, 0], [5, 6, 7], [eos, 0, 0]])
    r = Rollout(query_ids=ids[:, :1], query_mask=torch.ones(3, 1), response_ids=ids,
                response_mask=torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0]]), logprobs=torch.zeros(3, 3))
    assert masked.policy.ended(r).tolist() == [True, False, True]


def test_the_lr_follows_transformers_schedule_once_an_iteration(tmp_path):
    config = tiny_config("steps=4", "algo.lr=0.01", "algo.lr_scheduler=linear", "algo.warmup_steps=2")
    records = RLTrainer(config, tmp_path / "linear").train()
    assert [r["lr"] for r in records] == pytest.approx([0.0, 0.005, 0.01, 0.005])  # warmup 0 -> 1, then down to 0
    constant = RLTrainer(tiny_config("steps=2", "algo.lr=0.01"), tmp_path / "constant").train()
    assert [r["lr"] for r in constant] == [0.01, 0.01]
    with pytest.raises(ConfigError, match=r"^algo\.warmup_steps: the constant schedule has no warmup"):
        tiny_config("algo.warmup_steps=2").validate()
    # a continued run may go further, but not stretch a schedule that spans its steps
    RLTrainer(tiny_config("steps=6", "algo.lr=0.01"), tmp_path / "constant", resume=True).close()
    with pytest.raises(ConfigError, match=r"^steps: differs from the run .*whose lr schedule \(linear\) spans its 4 "):
        RLTrainer(tiny_config("steps=6", "algo.lr=0.01", "algo.lr_scheduler=linear", "algo.warmup_steps=2"),
                  tmp_path / "linear", resume=True)


def test_a_schedule_takes_its_own_settings_and_refuses_ones_it_does_not_know(tmp_path):
    # cosine from 0.01 down to min_lr_rate 0.1 of it over 4 iterations: 0.01 x (0.1 + 0.9 x (1 + cos(pi t / 4)) / 2)
    config = tiny_config("steps=4", "algo.lr=0.01", "algo.lr_scheduler=cosine_with_min_lr",
                         "algo.lr_scheduler_kwargs={min_lr_rate: 0.1}")
    records = RLTrainer(config, tmp_path / "cosine").train()
    assert [r["lr"] for r in records] == pytest.approx([0.01 * (0.1 + 0.45 * (1 + math.cos(math.pi * t / 4)))
                                                        for t in range(4)])
    with pytest.raises(ConfigError, match=r"^algo\.lr_scheduler_kwargs: \{'min_lr': 1\} for warmup_stable_decay: "):
        RLTrainer(tiny_config("algo.lr_scheduler=warmup_stable_decay", "algo.lr_scheduler_kwargs={min_lr: 1}"),
                  tmp_path / "wsd")
    assert not (tmp_path / "wsd" / "config.yaml").exists()  # refused before the run began
    with pytest.raises(ConfigError, match=r"^algo\.lr_scheduler_kwargs: the constant schedule has no settings"):
        tiny_config("algo.lr_scheduler_kwargs={min_lr_rate: 0.1}")


def test_rewards_normalised_before_the_sum_need_a_task_of_several_weighted_rewards(tmp_path):
    config = tiny_config("algo.name=rloo", "algo.samples_per_prompt=2", "algo.reward_aggregation=normalize_then_sum")
    with pytest.raises(ConfigError, match=r"^algo\.reward_aggregation: normalize_then_sum aggregates a task's several "
                                          r"weighted rewards \(the prompts task's\); task 'letter_frequency' has one"):
        RLTrainer(config, tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_kl_reference_ema_uses_the_ema_weights(tmp_path):
    # β = 0: both runs take the same steps and only the reference of the logged KL differs. Before any update the
    # EMA is the policy (KL 0); after it the EMA lags the policy less than θ0 does; the reset at 3 sets the EMA to
    # θ0, so the KL of iteration 4 is the one against θ0.
    runs = {}
    for reference in ("init", "ema"):
        config = tiny_config("method.name=elastic_reset", "method.reset_every=3", "kl.coef=0", "kl.target=null",
                             "kl.log_every=1", f"kl.reference={reference}", "kl.estimator=k3", "steps=4")
        runs[reference] = RLTrainer(config, tmp_path / reference).train()
    init, ema = runs["init"], runs["ema"]
    assert [r["reward"] for r in ema] == [r["reward"] for r in init]  # the same trajectory
    assert ema[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert 0 < ema[1]["kl"] < 0.9 * init[1]["kl"] and 0 < ema[2]["kl"] < 0.9 * init[2]["kl"]
    assert ema[3]["kl"] == pytest.approx(init[3]["kl"], rel=1e-5)


def test_nlpo_mask_model_is_delayed_then_synced(tmp_path):
    config = tiny_config("method.name=nlpo", "method.nlpo_update_every=2", "method.nlpo_top_p=0.5",
                         "method.nlpo_min_tokens=5")
    trainer = RLTrainer(config, tmp_path)
    theta0 = trainable(trainer)
    mask_params = dict(trainer.method.mask_model.named_parameters())
    trainer.train_step()
    assert all(torch.equal(mask_params[n], theta0[n]) for n in theta0)  # still the initial policy
    record = trainer.train_step()
    assert record["nlpo/mask_update"] == 1
    assert all(torch.equal(mask_params[n], p) for n, p in trainable(trainer).items())


def test_lora_policy_trains_only_adapters(tmp_path):
    config = tiny_config(model={"lora": {"r": 4, "alpha": 8}}, method={"name": "elastic_reset", "reset_every": 2})
    trainer = RLTrainer(config, tmp_path)
    params = dict(trainer.model.named_parameters())
    base = {n: p.detach().clone() for n, p in params.items() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in params.items() if "lora_B" in n}
    assert base and adapters and not any(params[n].requires_grad for n in base)
    trainer.train()
    assert all("lora_" in n for n in trainer.method.ema.names)
    assert all(torch.equal(params[n], p) for n, p in base.items())
    assert any(not torch.equal(params[n], p) for n, p in adapters.items())  # the adapters did train


@pytest.mark.parametrize("extra", [("algo.name=ppo",), ("algo.name=rloo", "method.name=multitask"),
                                   ("model.lora={r: 4, alpha: 8}", "algo.name=rloo")])
def test_activation_checkpointing_recomputes_the_layers_and_changes_no_number(tmp_path, extra):
    # PPO (value head on the trunk), the multitask NLL (a second forward with grad) and LoRA (frozen base)
    runs = {}
    for on in (False, True):
        trainer = RLTrainer(tiny_config(*extra, f"model.activation_checkpointing={on}"), tmp_path / str(on))
        calls = []
        base = trainer.model.get_base_model() if trainer.is_lora else trainer.model
        assert not base.get_input_embeddings()._forward_hooks  # no hook of reentrant checkpointing in decoding
        for layer in base.model.layers:
            layer.self_attn.register_forward_hook(lambda *_: calls.append(1))
        records = without_times([trainer.train_step() for _ in range(2)])
        runs[on] = records, trainable(trainer), calls
    (plain, plain_weights, plain_calls), (recomputed, weights, calls) = runs[False], runs[True]
    assert recomputed == plain
    assert all(torch.equal(weights[n], w) for n, w in plain_weights.items())
    assert len(calls) > len(plain_calls)  # the backward passes ran the layers' attention again


def test_activation_checkpointing_refuses_a_model_whose_layers_drop_out_in_training():
    from transformers import MarianConfig, MarianMTModel

    from elastic_reset.lm.activation_checkpointing import enable_activation_checkpointing

    def marian(dropout):
        return MarianMTModel(MarianConfig(vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1,
                                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                          decoder_ffn_dim=32, dropout=dropout, pad_token_id=0,
                                          decoder_start_token_id=0)).eval()

    enable_activation_checkpointing(marian(0.0), "marian")  # its functional dropout at 0: nothing to refuse
    # GPT-2's dropout is in modules of its own, which stay in eval mode (a model built from a config starts training)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.3, attn_pdrop=0.3))
    enable_activation_checkpointing(gpt2, "gpt2")
    assert not any(m.training for m in gpt2.modules())
    with pytest.raises(ConfigError, match=r"^model\.activation_checkpointing: 'marian' \(MarianMTModel\) computes "
                                          r"other outputs when its layers are marked training"):
        enable_activation_checkpointing(marian(0.3), "marian")


def test_the_seed_alone_decides_lora_and_value_head_initialisation(tmp_path):
    # A model loaded with from_pretrained (SmolLM2's path too) does not seed itself, and torch seeds its global
    # generator at random in every process: the run's seed has to decide the adapters' and the value head's init.
    from elastic_reset.models import byte_tokenizer, tiny_causal_lm

    folder = tmp_path / "model"
    tiny_causal_lm().save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)

    def initial(seed: int, global_seed: int):
        torch.manual_seed(global_seed)  # what the process happened to start with
        config = tiny_config(f"seed={seed}", model={"name": str(folder), "lora": {"r": 4, "alpha": 8}})
        trainer = RLTrainer(config, tmp_path / f"run{seed}-{global_seed}")
        return {**trainable(trainer), **{f"v.{n}": p for n, p in trainer.value_head.named_parameters()}}

    first, again, other = initial(0, 1), initial(0, 2), initial(1, 1)
    assert first.keys() == again.keys() and any("lora_A" in n for n in first)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not torch.equal(first["v.summary.weight"], other["v.summary.weight"])
    assert not all(torch.equal(first[n], other[n]) for n in first if "lora_A" in n)


@pytest.mark.parametrize("lora", [True, False])
def test_frozen_weights_cast_once_for_the_run_change_no_number(tmp_path, monkeypatch, lora):
    sections = dict(model={"autocast": "bf16", **({"lora": {"r": 4, "alpha": 8}} if lora else {})},
                    method={"name": "kl"}, eval={"every": 3})
    fast = RLTrainer(tiny_config(**sections), tmp_path / "fast")
    frozen = [m.weight for m in fast.model.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]
    ref_weights = [] if lora else [m.weight for m in fast.reference._copy.modules() if isinstance(m, torch.nn.Linear)]
    assert frozen if lora else ref_weights and not frozen  # LoRA: the frozen base; full fine-tuning: the reference
    assert all(w.dtype == torch.bfloat16 for w in frozen + ref_weights)  # cast while the trainer is open
    fast_records = fast.train()
    frozen_after = [m.weight for m in fast.model.modules() if isinstance(m, torch.nn.Linear)
                    and not m.weight.requires_grad]
    assert all(w.dtype == torch.float32 for w in frozen_after)  # train() hands the fp32 weights back
    monkeypatch.setattr(RLTrainer, "_cast_frozen_weights", lambda self: None)
    slow_records = RLTrainer(tiny_config(**sections), tmp_path / "slow").train()
    assert without_times(fast_records) == without_times(slow_records)


# ----------------------------------------------------------------------------------------------- evaluation
def test_evaluation_reports_drift_and_never_changes_training(tmp_path):
    quiet = RLTrainer(tiny_config(), tmp_path / "a").train()
    evaluated = RLTrainer(tiny_config("eval.every=1"), tmp_path / "b").train()
    train_only = [r for r in evaluated if "reward" in r]
    assert without_times(train_only) == without_times(quiet)
    evals = [r for r in evaluated if "eval/reward" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert evals[0]["eval/kl_init"] == pytest.approx(0.0, abs=1e-6)  # step 0: the policy is the reference
    assert all(r["eval/perplexity"] > 1 for r in evals)
    assert all("eval_ema/perplexity" in r for r in evals)
    assert all(r["eval/response_length"] == 12 for r in evals)  # tiny.yaml: min_new_tokens = max_new_tokens = 12
    fixed = RLTrainer(tiny_config("steps=1", "eval.every=1", "sampling.min_new_tokens=5", "sampling.max_new_tokens=5",
                                  "algo.adam_beta2=0.98"), tmp_path / "c")
    assert fixed.optimizer.param_groups[0]["betas"] == (0.9, 0.98)  # SIL's Adam (fairseq's Transformer recipe)
    assert [r["eval/response_length"] for r in fixed.train() if "eval/reward" in r] == [5.0, 5.0]


def test_evaluation_samples_several_completions_per_prompt(tmp_path):
    seen = []

    def reward(prompts, completions):
        seen.append(list(prompts))
        return [0.5] * len(completions)

    config = tiny_config("eval.every=3", "eval.num_prompts=3", "eval.samples_per_prompt=4", "eval.batch_size=5",
                         "eval.ema=false")
    trainer = RLTrainer(config, tmp_path, task=_task(reward))
    trainer.evaluate()
    prompts = [p for chunk in seen for p in chunk]
    assert prompts == [p for p in trainer.task.eval_prompts[:3] for _ in range(4)]


@pytest.mark.parametrize("limit,scored", [(None, 6), (2, 2)])
def test_the_test_split_is_scored_once_at_the_end_on_its_first_prompts(tmp_path, limit, scored):
    seen = []

    def reward(prompts, completions):
        seen.append(list(prompts))
        return [0.5] * len(completions)

    test_prompts = [f"test prompt {i}" for i in range(6)]
    overrides = ["eval.every=3", "eval.num_prompts=1", "eval.ema=false"]
    config = tiny_config(*overrides, *([f"eval.num_test_prompts={limit}"] if limit else []))
    trainer = RLTrainer(config, tmp_path, task=_task(reward, test_prompts=test_prompts))
    records = trainer.train()
    assert [r["step"] for r in records if "test/reward" in r] == [3]
    assert [p for chunk in seen for p in chunk if p.startswith("test prompt")] == test_prompts[:scored]


def test_perplexity_on_initial_policy_samples_is_the_same_text_for_every_run(tmp_path):
    sets = ("eval.reference=initial_samples", "eval.num_texts=5", "eval.batch_size=2", "eval.every=3")
    a = RLTrainer(tiny_config(*sets, "method.name=kl"), tmp_path / "a")
    # (Same seed: the tiny model's initial weights depend on it; a pretrained model + LoRA does not.)
    b = RLTrainer(tiny_config(*sets, "method.name=elastic_reset"), tmp_path / "b")
    assert a.evaluator.texts == b.evaluator.texts and len(a.evaluator.texts) == 5
    eval_prompts = a.task.eval_prompts
    assert all(t.startswith(eval_prompts[i % len(eval_prompts)]) for i, t in enumerate(a.evaluator.texts))
    assert all(len(t) > len(eval_prompts[i % len(eval_prompts)]) for i, t in enumerate(a.evaluator.texts))
    saved = json.loads((tmp_path / "a" / "reference_texts.json").read_text())
    assert saved == a.evaluator.texts
    records = a.train()
    evals = [r for r in records if "eval/perplexity" in r]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == 3 and first["eval/perplexity"] != last["eval/perplexity"]
    # A resumed run reads the saved texts back; it never resamples them from trained weights.
    (tmp_path / "a" / "reference_texts.json").write_text(json.dumps(["x"] * 5))
    assert RLTrainer(tiny_config(*sets, "method.name=kl", "steps=4"), tmp_path / "a",
                     resume=True).evaluator.texts == ["x"] * 5


def test_win_rate_against_the_initial_policy_and_further_prompt_sets(tmp_path):
    judged = []

    def judge(prompts, completions):  # longer is better; records what it was asked to judge
        judged.append(list(completions))
        return [float(len(c)) for c in completions]

    sets = ("eval.every=3", "eval.num_prompts=3", "eval.samples_per_prompt=2", "eval.batch_size=4",
            "eval.num_test_prompts=2", "eval.ema=false")
    forget = [f"forget prompt {i}" for i in range(5)]
    task = _task(lambda p, c: [0.5] * len(c), eval_sets={"forget": forget}, judge_fn=judge,
                 test_prompts=["test a", "test b", "test c"])
    records = RLTrainer(tiny_config(*sets), tmp_path, task=task).train()
    saved = json.loads((tmp_path / "initial_completions.json").read_text())
    assert {k: len(v) for k, v in saved.items()} == {"eval": 6, "eval_forget": 6, "test": 4}
    evals = [r for r in records if "eval/reward" in r]
    first, last = evals[0], evals[-1]
    # Step 0 draws with the same noise from the same weights: every completion ties with the initial one.
    assert first["eval/win_rate"] == first["eval_forget/win_rate"] == 0.5
    assert "eval_forget/perplexity" not in first and "eval/perplexity" in first
    assert last["step"] == 3 and {"eval_forget/reward", "eval_forget/kl_init"} <= set(last)
    assert "test/win_rate" in records[-1]
    # A resumed run reads the initial completions back: now every completion loses to a very long one.
    saved = {k: ["x" * 10_000] * len(v) for k, v in saved.items()}
    (tmp_path / "initial_completions.json").write_text(json.dumps(saved))
    trainer = RLTrainer(tiny_config(*sets, "steps=6"), tmp_path, task=task, resume=True)
    record = trainer.evaluate()
    trainer.close()
    assert record["eval/win_rate"] == record["eval_forget/win_rate"] == 0.0
    saved["eval"] = saved["eval"][:1]
    (tmp_path / "initial_completions.json").write_text(json.dumps(saved))
    with pytest.raises(RunFileError, match="initial_completions.json"):
        RLTrainer(tiny_config(*sets, "steps=6"), tmp_path, task=task, resume=True)


def test_an_eval_set_with_its_own_texts_reports_its_own_perplexity(tmp_path):
    # Set A (eval) selects, set B (eval_report) reports: B's perplexity is on B's texts, not on A's.
    base = get_task("letter_frequency")
    other = [t[::-1] for t in base.reference_texts]
    task = _task(lambda p, c: [0.5] * len(c), eval_sets={"report": base.eval_prompts[1:]},
                 eval_set_texts={"report": other})
    trainer = RLTrainer(tiny_config("eval.num_texts=3"), tmp_path, task=task)
    record = trainer.evaluate()
    trainer.close()
    assert {"eval_report/reward", "eval_report/perplexity", "eval/perplexity"} <= set(record)
    assert record["eval_report/perplexity"] != record["eval/perplexity"]
    mirror = _task(lambda p, c: [0.5] * len(c), eval_sets={"report": base.eval_prompts[1:]},
                   eval_set_texts={"report": base.reference_texts})
    trainer = RLTrainer(tiny_config("eval.num_texts=3"), tmp_path / "b", task=mirror)
    again = trainer.evaluate()
    trainer.close()
    assert again["eval_report/perplexity"] == again["eval/perplexity"]


def test_a_task_refuses_an_empty_or_misnamed_prompt_set():
    with pytest.raises(DataFileError, match=r"eval_sets\['forget'\] is empty"):
        _task(lambda p, c: [0.0] * len(c), eval_sets={"forget": []})
    with pytest.raises(DataFileError, match="not an identifier"):
        _task(lambda p, c: [0.0] * len(c), eval_sets={"for get": ["p"]})
    with pytest.raises(DataFileError, match=r"eval_set_texts\['b'\] names no eval set"):
        _task(lambda p, c: [0.0] * len(c), eval_sets={"a": ["p"]}, eval_set_texts={"b": ["t"]})


# ----------------------------------------------------------------------------------------------- resume
def _cli(*args, env=None):
    return [sys.executable, "-m", "elastic_reset.cli", *map(str, args)]


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    # One thread each, so the uninterrupted run goes on beside the one that is killed (2 cores, not 2x the time).
    overrides = ["--set", "steps=6", "--set", "checkpoint_every=2", "--set", "eval.every=3", "--set", "threads=1"]
    full = tmp_path / "full"
    with open(tmp_path / "full.log", "w") as log:
        uninterrupted = subprocess.Popen(_cli("train", TINY, "--out", full, *overrides),
                                         stdout=subprocess.DEVNULL, stderr=log)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli("train", TINY, "--out", killed, *overrides),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sigkill_after_step(proc, killed / "metrics.jsonl", 3, timeout=120)
    assert uninterrupted.wait() == 0, (tmp_path / "full.log").read_text()
    subprocess.run(_cli("train", TINY, "--out", killed, "--resume", *overrides), check=True, capture_output=True)
    assert without_times(read_metrics(killed / "metrics.jsonl")) == without_times(read_metrics(full / "metrics.jsonl"))


def test_existing_run_dir_needs_resume_and_same_config(tmp_path):
    RLTrainer(tiny_config(), tmp_path).train()
    with pytest.raises(FileExistsError, match="--resume"):
        RLTrainer(tiny_config(), tmp_path)
    with pytest.raises(ConfigError, match="algo"):
        RLTrainer(tiny_config("algo.lr=0.1"), tmp_path, resume=True)
    trainer = RLTrainer(tiny_config("steps=4"), tmp_path, resume=True)  # extending a run is allowed
    assert trainer.step == 3 and [r["step"] for r in trainer.train()] == [4]


def test_resume_on_another_models_checkpoint_is_one_line_naming_file_and_tensor(tmp_path):
    RLTrainer(tiny_config("checkpoint_every=2", "steps=2"), tmp_path / "a").train()
    RLTrainer(tiny_config("checkpoint_every=2", "steps=2", "model.tiny_hidden=32"), tmp_path / "b").train()
    theirs = tmp_path / "b" / "checkpoints" / "step_0000002.pt"
    shutil.copyfile(theirs, tmp_path / "a" / "checkpoints" / "step_0000002.pt")
    with pytest.raises(RunFileError, match=r"step_0000002.pt: model.embed_tokens.weight has shape \(259, 32\) "
                                           r"there but \(259, 64\) in this model; it is not this run's"):
        RLTrainer(tiny_config("checkpoint_every=2", "steps=4"), tmp_path / "a", resume=True)


# ----------------------------------------------------------------------------------------------- bad input
def _task(reward_fn, **kw):
    base = get_task("letter_frequency")
    return Task(name="bad", train_prompts=base.train_prompts, eval_prompts=base.eval_prompts,
                reward_fn=reward_fn, reference_texts=base.reference_texts, **kw)


@pytest.mark.parametrize("reward_fn,match", [
    (lambda p, c: [float("nan")] * len(c), "non-finite"),
    (lambda p, c: [0.0] * (len(c) - 1), "returned 7 values for 8"),
    (lambda p, c: ["high"] * len(c), "did not return numbers"),
    (lambda p, c: None, "did not return numbers"),
])
def test_bad_rewards_stop_the_run(tmp_path, reward_fn, match):
    with pytest.raises(RewardError, match=match):
        RLTrainer(tiny_config(), tmp_path, task=_task(reward_fn)).train_step()


def test_bad_rewards_can_be_dropped_and_counted(tmp_path):
    def reward(prompts, completions):
        return [float("inf") if i == 0 else 0.5 for i in range(len(completions))]

    record = RLTrainer(tiny_config("bad_reward=drop"), tmp_path, task=_task(reward)).train_step()
    assert record["dropped"] == 1 and record["reward"] == 0.5


def test_rloo_drops_the_whole_group_of_a_dropped_sample_and_reinforce_only_it(tmp_path):
    keep = torch.tensor([True, False, True, True])
    rloo = RLTrainer(tiny_config("algo.name=rloo", "algo.samples_per_prompt=2"), tmp_path / "rloo")
    reinforce = RLTrainer(tiny_config("algo.name=reinforce", "algo.samples_per_prompt=2"), tmp_path / "reinforce")
    assert rloo.estimator.kept(keep).tolist() == [False, False, True, True]
    assert reinforce.estimator.kept(keep).tolist() == keep.tolist()
    rloo.close()
    reinforce.close()


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match=r"train_prompts\[1\] is empty"):
        Task(name="t", train_prompts=["a", " "], eval_prompts=["a"], reward_fn=lambda p, c: [0.0] * len(c),
             reference_texts=["x"])


def test_prompt_budget_beyond_the_context_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="exceeds the model's context length 512"):
        RLTrainer(tiny_config("model.max_prompt_tokens=600"), tmp_path)


def test_tokenizer_without_pad_token_is_refused(tmp_path, monkeypatch):
    from elastic_reset import models

    original = models.byte_tokenizer

    def no_pad():
        tok = original()
        tok.pad_token = None
        return tok

    monkeypatch.setattr(models, "byte_tokenizer", no_pad)
    with pytest.raises(ValueError, match="no pad token"):
        RLTrainer(tiny_config(), tmp_path)


# ----------------------------------------------------------------------------------------------- config
# The config's own rules are tested in test_config.py; this is the CLI refusing a bad file before any work.
def test_yaml_config_and_cli_errors(tmp_path):
    config = load_config(TINY, ["algo.lr=0.01", "model.lora={r: 2}"])
    assert config.algo.lr == 0.01 and config.model.lora.r == 2 and config.model.lora.alpha == 32
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  nam: ppo\n")
    result = subprocess.run(_cli("train", bad, "--out", tmp_path / "run"), capture_output=True, text=True)
    assert result.returncode == 2 and "algo.nam: unknown key" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


def test_metrics_are_json_lines_with_step(tmp_path):
    RLTrainer(tiny_config("eval.every=3"), tmp_path).train()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all("step" in r for r in records)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["method"]["name"] == "elastic_reset"
    assert json.loads((tmp_path / "task.json").read_text()) == {"name": "letter_frequency", "score": "reward",
                                                                  "drift": "perplexity"}
    assert os.path.exists(tmp_path / "checkpoints" / "latest")


@pytest.mark.parametrize("method,log_every,logged", [("none", 0, []), ("none", 2, [2, 4]), ("kl", 0, [1, 2, 3, 4])])
def test_a_kl_outside_the_reward_is_computed_only_when_logged(tmp_path, method, log_every, logged):
    trainer = RLTrainer(tiny_config(f"method.name={method}", f"kl.log_every={log_every}", "steps=4",
                                    "kl.target=null"), tmp_path)
    calls = []
    reference = trainer._reference_logprobs
    trainer._reference_logprobs = lambda rollout: calls.append(trainer.step + 1) or reference(rollout)
    records = trainer.train()
    assert calls == logged  # the reference forward runs only then (β > 0: always, it is in the reward)
    assert [r["step"] for r in records if "kl" in r] == logged


def test_an_adaptive_entropy_weight_is_logged_as_it_moves(tmp_path):
    # every token entropy of a byte-level model is far below 100 nats: the weight rises by its step each update
    config = tiny_config("steps=3", "algo.name=rloo", "algo.samples_per_prompt=2", "algo.epochs=1",
                         "algo.minibatch_size=8", "algo.entropy_target=100", "algo.entropy_coef_delta=0.01",
                         "algo.entropy_coef_max=0.025")
    records = [r for r in RLTrainer(config, tmp_path / "run").train() if "entropy_coef" in r]
    assert [r["entropy_coef"] for r in records] == pytest.approx([0.01, 0.02, 0.025])


def test_prompts_in_the_tasks_order_when_not_shuffled(tmp_path):
    # two iterations of 4 prompts: the first 8 training prompts, in order (a curriculum), then logged as sampled
    config = tiny_config("steps=2", "algo.shuffle_prompts=false", "log_completions=true")
    trainer = RLTrainer(config, tmp_path / "run")
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert list(dict.fromkeys(r["prompt"] for r in rows)) == trainer.task.train_prompts[:8]

