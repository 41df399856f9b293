"""A TRL GRPOConfig or RLOOConfig carried over as this engine's config (rl/from_trl.py)."""

from __future__ import annotations

import pytest
import torch

from elastic_reset.errors import ConfigError
from elastic_reset.rl.from_trl import config_from_grpo, config_from_rloo

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")  # TRL's own default


def grpo(**settings):
    settings = {"output_dir": "out/my-policy", "bf16": False, "report_to": "none", "max_steps": 20, **settings}
    return trl.GRPOConfig(**settings)


def rloo(**settings):
    settings = {"output_dir": "out/my-policy", "bf16": False, "report_to": "none", "max_steps": 20, **settings}
    return trl.RLOOConfig(**settings)


def test_the_settings_a_grpo_user_has_carry_over():
    config = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, learning_rate=1e-5, beta=0.04,
                                   max_completion_length=32, temperature=0.9, top_p=0.95, min_p=0.05,
                                   repetition_penalty=1.1, save_steps=10, seed=3, mask_truncated_completions=True,
                                   log_completions=True, push_to_hub=True, run_name="r1", warmup_steps=0.1))
    a, s = config.algo, config.sampling
    assert (a.name, a.samples_per_prompt, a.prompts_per_step, a.minibatch_size, a.epochs) == ("rloo", 4, 2, 8, 1)
    assert (config.steps, config.checkpoint_every, config.eval.every, config.seed) == (20, 10, 0, 3)
    assert (a.lr, a.lr_scheduler, a.warmup_steps, a.clip_range, a.max_grad_norm) == (1e-5, "linear", 2, 0.2, 1.0)
    assert (a.baseline, a.scale_rewards, a.whiten_advantages, a.mask_truncated_completions) == (
        "group_mean", "group", False, True)  # GRPO's advantage, (r - group mean) / (group std + 1e-4)
    assert (config.kl.coef, config.kl.target, config.kl.estimator, config.method.name) == (0.04, None, "k3", "kl")
    assert (s.max_new_tokens, s.temperature, s.top_p, s.min_p, s.repetition_penalty) == (32, 0.9, 0.95, 0.05, 1.1)
    assert (config.model.autocast, config.log_completions, config.push_to_hub, config.run_name) == \
        ("none", True, "my-policy", "r1")
    assert config.model.max_prompt_tokens is None  # TRL cuts no prompt
    assert config.model.activation_checkpointing  # TRL's default gradient_checkpointing
    assert not config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, gradient_checkpointing=False,
                                     gradient_checkpointing_kwargs={"use_reentrant": False})
                                ).model.activation_checkpointing
    assert config.algo.shuffle_prompts and not config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8,
                                                                     shuffle_dataset=False)).algo.shuffle_prompts


def test_optimizer_steps_become_iterations_and_overrides_come_last():
    # a generation batch of 8 x 4 = 32 completions, 16 an optimizer step, twice over: 4 optimizer steps an iteration
    args = grpo(num_generations=8, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                steps_per_generation=4, num_iterations=2, max_steps=40, save_steps=8, eval_strategy="steps",
                eval_steps=4, beta=0.0, scale_rewards="batch")
    config = config_from_grpo(args, ["model.name=tiny-llama", "method.name=elastic_reset"])
    a = config.algo
    assert (a.prompts_per_step, a.samples_per_prompt, a.minibatch_size, a.epochs) == (4, 8, 16, 2)
    assert (config.steps, config.checkpoint_every, config.eval.every) == (10, 2, 1)
    assert (a.scale_rewards, a.whiten_advantages, config.kl.coef) == ("none", True, 0.0)
    assert (config.model.name, config.method.name) == ("tiny-llama", "elastic_reset")


@pytest.mark.parametrize("loss_type, aggregation", [
    ("dapo", "batch_token"), ("bnpo", "token"), ("grpo", "sequence"), ("dr_grpo", "constant"),
    ("cispo", "batch_token"), ("sapo", "sequence"), ("luspo", "sum"), ("vespo", "batch_token")])
def test_grpos_loss_carries_over_clipped_ratio_and_all(loss_type, aggregation):
    config = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, epsilon=0.2, epsilon_high=0.28,
                                   loss_type=loss_type, importance_sampling_level="sequence", delta=1.5))
    a = config.algo
    assert (a.ratio, a.clip_range, a.clip_range_high, a.ratio_max, a.loss_aggregation) == \
        ("sequence", 0.2, 0.28, 1.5, aggregation)
    assert a.surrogate == (loss_type if loss_type in ("cispo", "sapo", "vespo") else "clip")
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8)).algo  # TRL's defaults
    assert (a.ratio, a.clip_range_high, a.ratio_max, a.loss_aggregation) == ("token", None, None, "batch_token")


@pytest.mark.parametrize("settings, pattern", [
    ({"max_steps": -1}, r"^GRPOConfig\.max_steps: set the number of optimizer steps, or give the prompts"),
    ({"loss_type": "gpg"}, r"^GRPOConfig\.loss_type: 'gpg': one of dapo, bnpo, grpo, dr_grpo, cispo, sapo, luspo, "
                           r"vespo here"),
    ({"reward_weights": [1.0, 2.0]}, r"^GRPOConfig\.reward_weights: .*give it to the prompts task"),
    ({"multi_objective_aggregation": "sum_of_logs"}, r"^GRPOConfig\.multi_objective_aggregation: 'sum_of_logs': "),
    ({"save_strategy": "epoch"}, r"^GRPOConfig\.save_strategy: 'epoch': only steps"),
    ({"neftune_noise_alpha": 5.0}, r"^GRPOConfig\.neftune_noise_alpha: 5\.0: no NEFTune noise here"),
    ({"fsdp": "full_shard"}, r"^GRPOConfig\.fsdp: .*: several processes run under accelerate launch here"),
    ({"gradient_checkpointing_kwargs": {"preserve_rng_state": False}},
     r"^GRPOConfig\.gradient_checkpointing_kwargs: \{'preserve_rng_state': False\}: only use_reentrant here"),
    ({"num_iterations": 2, "save_steps": 3}, r"^GRPOConfig\.save_steps: 3 optimizer steps are not whole iterations "
                                             r"of 2$"),
])
def test_what_has_no_counterpart_is_refused_naming_the_setting(settings, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, **settings))


def test_a_precision_or_resumption_a_trainer_argument_asks_for_is_refused_not_dropped():
    import types

    base = {"num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 20, "learning_rate": 1e-5}
    with pytest.raises(ConfigError, match=r"^GRPOConfig\.fp16: True: bf16 or full precision here"):
        config_from_grpo(types.SimpleNamespace(**base, fp16=True))  # (TrainingArguments refuses it on a CPU)
    with pytest.raises(ConfigError, match=r"^RLOOConfig\.resume_from_checkpoint: 'out/checkpoint-10': continue a "):
        config_from_rloo(rloo(num_generations=4, per_device_train_batch_size=8,
                              resume_from_checkpoint="out/checkpoint-10"))


def test_a_grpo_config_trains_here(tmp_path):
    from elastic_reset.rl.trainer import RLTrainer
    from elastic_reset.tasks import get_task

    def letters(prompts, completions, **kwargs):
        return [c.count("e") / max(len(c), 1) for c in completions]

    args = grpo(num_generations=2, per_device_train_batch_size=4, max_steps=4, max_completion_length=6,
                learning_rate=1e-3, save_steps=4, num_iterations=2, off_policy_mask_threshold=0.01)
    config = config_from_grpo(args, ["model.name=tiny-llama", "task.name=prompts", "progress=false"])
    task = get_task("prompts", dataset=[{"prompt": f"Prompt {i}:"} for i in range(8)], reward=[letters])
    records = RLTrainer(config, tmp_path / "run", task=task).train()
    train = [r for r in records if "reward" in r]
    assert [r["step"] for r in train] == [1, 2] and train[0]["lr"] == 1e-3
    # the second pass drops negative-advantage rows gone off policy: the carried-over threshold engages
    assert all(0 <= r["masked"] <= 0.5 for r in train) and any(r["masked"] > 0 for r in train)
    assert (tmp_path / "run" / "final" / "README.md").is_file()


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    from helpers import ROOT

    readme = (ROOT / "docs" / "trl.md").read_text()  # the README's "Coming from TRL", moved there
    block = readme.split("```python\nfrom trl import GRPOConfig", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)  # GRPOConfig's output_dir
    scope: dict = {}
    exec("from trl import GRPOConfig" + block, scope)
    config, rloo = scope["config"], scope["rloo"]
    assert (config.steps, config.algo.samples_per_prompt, config.kl.coef, config.method.name) == \
        (100, 4, 0.04, "elastic_reset")
    assert (rloo.steps, rloo.algo.ratio, rloo.kl.coef, rloo.kl.estimator) == (100, "sequence_sum", 0.05, "k1")


@pytest.mark.parametrize("loss_type, level, delta, rho, opsm", [
    ("dapo", "token", None, 1.0, None), ("bnpo", "sequence", None, 1.0, None), ("grpo", "token", 1.5, 1.0, None),
    ("grpo", "sequence", None, 0.4, None), ("dr_grpo", "token", None, 1.0, None), ("dapo", "token", None, 0.2, None),
    ("cispo", "token", None, 1.0, None), ("cispo", "sequence", None, 0.4, None), ("dapo", "token", None, 1.0, 0.02),
    ("grpo", "sequence", None, 0.4, 0.02), ("cispo", "token", None, 1.0, 0.02), ("sapo", "token", None, 1.0, None),
    ("sapo", "sequence", 1.5, 0.4, 0.02), ("luspo", "sequence", None, 1.0, None),
    ("luspo", "sequence", 1.5, 0.4, 0.02), ("vespo", "token", None, 1.0, None), ("vespo", "sequence", None, 0.4, 0.02)])
def test_our_policy_loss_is_the_one_grpo_trainer_computes(loss_type, level, delta, rho, opsm):
    # TRL's own _compute_loss on a stand-in trainer (its forward replaced by given log-probs), against ours with
    # the settings config_from_grpo carries over: the loss and its gradient agree. In training, on the first of
    # two optimizer steps of a generation batch, whose other minibatch has 9 real tokens (dapo's normaliser).
    import types
    from collections import defaultdict

    from elastic_reset.rl import ops

    args = grpo(num_generations=2, per_device_train_batch_size=4, steps_per_generation=2, epsilon=0.2,
                epsilon_high=0.28, loss_type=loss_type, importance_sampling_level=level, max_completion_length=5,
                delta=delta,
                top_entropy_quantile=rho, off_policy_mask_threshold=opsm, sapo_temperature_pos=0.8,
                sapo_temperature_neg=1.2, vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.0, vespo_lambda_neg=1.0)
    a = config_from_grpo(args).algo
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    old = -torch.rand(4, 5, generator=g) * 3
    logp = (old + 0.6 * torch.randn(4, 5, generator=g)).requires_grad_(True)  # ratios well outside the clip too
    adv = torch.tensor([1.0, -1.0, -0.5, 2.0])  # row 2: ratios above delta 1.5 with A < 0
    entropy = torch.rand(4, 5, generator=g) * 2
    gathered = types.SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                     reduce=lambda x, reduction: x, pad_across_processes=lambda x, **_: x)
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *_, **__: (logp, entropy, None), args=args,
        top_entropy_quantile=rho, off_policy_mask_threshold=opsm, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, use_vllm=False, model=types.SimpleNamespace(
            training=True), current_gradient_accumulation_steps=1, max_completion_length=5, accelerator=gathered,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)))
    inputs = {"prompt_ids": torch.zeros(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
              "completion_ids": torch.zeros(4, 5, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": mask.sum() + 9}
    trainer.get_high_entropy_mask = lambda *a: trl.GRPOTrainer.get_high_entropy_mask(trainer, *a)
    trainer.get_off_policy_mask = trl.GRPOTrainer.get_off_policy_mask
    trainer.get_gamma_weights = trl.GRPOTrainer.get_gamma_weights
    theirs = trl.GRPOTrainer._compute_loss(trainer, None, inputs)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    high = ops.high_entropy_mask(entropy, mask, a.top_entropy_quantile)  # as the trainer zeroes the rest
    ours, stats = ops.ppo_policy_loss(
        logp, old, torch.where(high, adv[:, None], 0.0), mask, a.clip_range, clip_range_high=a.clip_range_high,
        level=a.ratio, how=a.loss_aggregation, max_len=args.max_completion_length, step_tokens=(11 + 9) / 2,
        ratio_max=a.ratio_max, surrogate=a.surrogate, off_policy_mask=a.off_policy_mask,
        sapo_temperatures=(a.sapo_temperature_pos, a.sapo_temperature_neg),
        vespo=(a.vespo_k_pos, a.vespo_lambda_pos, a.vespo_k_neg, a.vespo_lambda_neg))
    (our_grad,) = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(our_grad, their_grad)
    assert float(stats.get("masked", 0.0)) == (0.25 if opsm else 0.0)  # row 1 (A < 0, mean log-ratio 0.05) dropped


@pytest.mark.parametrize("carry, make", [(config_from_grpo, grpo), (config_from_rloo, rloo)])
def test_every_setting_of_this_trl_is_read_or_known_to_make_no_difference(monkeypatch, carry, make):
    # so that the refusal of an unread setting below only ever meets a newer TRL's
    import dataclasses

    import transformers

    from elastic_reset.rl import from_trl

    seen = {}
    monkeypatch.setattr(from_trl, "_refuse_unread", lambda get: seen.update(read=get.read))
    args = make(num_generations=4, per_device_train_batch_size=8)
    carry(args)
    inherited = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    own = {f.name for f in dataclasses.fields(type(args))} - inherited
    assert own and not own - seen["read"] - from_trl.IGNORED


def test_a_setting_this_version_does_not_know_is_refused_unless_at_its_default():
    import dataclasses

    @dataclasses.dataclass
    class NewerGRPOConfig(trl.GRPOConfig):
        dynamic_sampling: bool = False

    settings = {"output_dir": "out/p", "bf16": False, "report_to": "none", "max_steps": 20, "num_generations": 4,
                "per_device_train_batch_size": 8}
    assert config_from_grpo(NewerGRPOConfig(**settings)).steps == 20
    with pytest.raises(ConfigError, match=r"^GRPOConfig\.dynamic_sampling: True: not known to this version"):
        config_from_grpo(NewerGRPOConfig(**settings, dynamic_sampling=True))


def test_trdpos_reference_sync_carries_over_as_the_anchor_method():
    config = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, beta=0.04, sync_ref_model=True,
                                   ref_model_mixup_alpha=0.9, ref_model_sync_steps=64, steps_per_generation=2))
    m = config.method  # 2 optimizer steps an iteration: a sync every 32 iterations
    assert (m.name, m.preset, m.alpha, m.every, config.kl.coef) == ("anchor", "ref_sync", 0.9, 32, 0.04)
    with pytest.raises(ConfigError, match=r"^GRPOConfig\.ref_model_sync_steps: 63 optimizer steps are not whole "):
        config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, beta=0.04, sync_ref_model=True,
                              ref_model_sync_steps=63, steps_per_generation=2))


def test_a_schedule_with_its_settings_carries_over():
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, lr_scheduler_type="cosine_with_min_lr",
                              lr_scheduler_kwargs={"min_lr_rate": 0.1})).algo
    assert (a.lr_scheduler, a.lr_scheduler_kwargs) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})


def test_the_entropy_bonus_carries_over_fixed_or_adaptive():
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, entropy_coef=0.01)).algo
    assert (a.entropy_coef, a.entropy_target) == (0.01, None)
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, entropy_coef=0.01,
                              use_adaptive_entropy=True, entropy_target=0.5, entropy_coef_max=0.1)).algo
    assert (a.entropy_coef, a.entropy_target, a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max) == \
        (0.01, 0.5, 0.005, 0.0, 0.1)


def test_the_settings_an_rloo_user_has_carry_over():
    config = config_from_rloo(rloo(num_generations=4, per_device_train_batch_size=8, num_iterations=2, beta=0.03,
                                   normalize_advantages=True, reward_clip_range=(-1.0, 2.0), epsilon_high=0.28,
                                   learning_rate=1e-5, max_completion_length=32, save_steps=10))
    a = config.algo
    assert (a.name, a.samples_per_prompt, a.prompts_per_step, a.minibatch_size, a.epochs) == ("rloo", 4, 2, 8, 2)
    assert (a.ratio, a.loss_aggregation, a.clip_range, a.clip_range_high) == ("sequence_sum", "sequence", 0.2, 0.28)
    assert (a.baseline, a.whiten_advantages, a.scale_rewards, a.reward_clip_range) == (
        "leave_one_out", True, "none", [-1.0, 2.0])
    assert (config.kl.coef, config.kl.estimator, config.method.name) == (0.03, "k1", "kl")
    assert (config.steps, config.checkpoint_every, config.sampling.max_new_tokens) == (10, 5, 32)
    a = config_from_rloo(rloo(num_generations=4, per_device_train_batch_size=8)).algo  # TRL's defaults
    assert (a.whiten_advantages, a.reward_clip_range, a.epochs) == (False, None, 1)
    assert config_from_rloo(rloo(num_generations=4, per_device_train_batch_size=8)).kl.coef == 0.05


@pytest.mark.parametrize("settings, pattern", [
    ({"max_steps": -1}, r"^RLOOConfig\.max_steps: set the number of optimizer steps"),
    ({"reward_weights": [1.0, 2.0]}, r"^RLOOConfig\.reward_weights: .*give it to the prompts task"),
    ({"reward_clip_range": (1.0, -1.0)}, r"^algo\.reward_clip_range: expected \[low, high\] with low < high"),
])
def test_what_an_rloo_config_cannot_have_here_is_refused_naming_it(settings, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_from_rloo(rloo(num_generations=4, per_device_train_batch_size=8, **settings))


@pytest.mark.parametrize("noise, epsilon_high", [(0.05, None), (0.3, None), (0.3, 0.28)])
def test_our_policy_loss_is_the_one_rloo_trainer_computes(noise, epsilon_high):
    # TRL's RLOOTrainer._compute_loss on a stand-in trainer: one clipped ratio of whole sequences per completion
    import types
    from collections import defaultdict

    from elastic_reset.rl import ops

    a = config_from_rloo(rloo(num_generations=2, per_device_train_batch_size=4, num_iterations=2,
                              epsilon_high=epsilon_high)).algo
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    old = -torch.rand(4, 5, generator=g) * 3
    logp = (old + noise * torch.randn(4, 5, generator=g)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])  # row 2: ratio 1.14 at noise 0.05, 2.2 at 0.3
    same = types.SimpleNamespace(gather=lambda x: x, reduce=lambda x, reduction: x)
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *_, **__: (logp, torch.zeros(4, 5), None), accelerator=same,
        epsilon_low=a.clip_range, epsilon_high=a.clip_range_high or a.clip_range, aux_loss_enabled=False,
        model=types.SimpleNamespace(training=False), _metrics=defaultdict(lambda: defaultdict(list)))
    inputs = {"prompt_ids": torch.zeros(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
              "completion_ids": torch.zeros(4, 5, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_logps": (old * mask).sum(1)}
    theirs = trl.RLOOTrainer._compute_loss(trainer, None, inputs)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    ours, stats = ops.ppo_policy_loss(logp, old, adv[:, None].expand(4, 5), mask, a.clip_range,
                                      clip_range_high=a.clip_range_high, level=a.ratio, how=a.loss_aggregation)
    (our_grad,) = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(our_grad, their_grad)
    assert (float(stats["clipfrac"]) > 0) == (noise > 0.1)  # the clip is reached, or not, as intended


def test_an_rloo_config_trains_here_its_reward_clipped_for_the_advantage_only(tmp_path):
    from elastic_reset.rl.trainer import RLTrainer
    from elastic_reset.tasks import get_task

    def length(prompts, completions, **kwargs):  # >= 1 and varying: every one clipped to 0 below
        return [1.0 + len(c) for c in completions]

    args = rloo(num_generations=2, per_device_train_batch_size=4, max_steps=2, max_completion_length=6,
                learning_rate=1e-3, beta=0.0, reward_clip_range=(-1.0, 0.0), normalize_advantages=True)
    config = config_from_rloo(args, ["model.name=tiny-llama", "task.name=prompts", "progress=false"])
    task = get_task("prompts", dataset=[{"prompt": f"Prompt {i}:"} for i in range(8)], reward=[length])
    train = [r for r in RLTrainer(config, tmp_path / "run", task=task).train() if "reward" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["reward"] >= 1.0 and r["reward_std"] > 0 for r in train)  # logged as the task gave it
    assert all(r["grad_norm"] == 0.0 for r in train)  # one clipped reward for all: no advantage, no gradient


# ---------------------------------------------------------------------------------- `trl grpo --config` recipes
RECIPE = """\
model_name_or_path: tiny-llama
dataset_name: {data}
reward_funcs: [my_rewards.letters, think_format_reward]
reward_model_name_or_path: {data}/../reward-model
reward_weights: [1.0, 0.5, 0.1]
use_peft: true
lora_r: 4
lora_alpha: 8
lora_target_modules: [q_proj, k_proj]
lora_dropout: 0.1
num_generations: 2
per_device_train_batch_size: 4
max_steps: 2
max_completion_length: 6
learning_rate: 1.0e-3
beta: 0.02
eval_strategy: steps
eval_steps: 1
report_to: none
env:
  ELASTIC_RESET_TEST_RECIPE: "read"
"""


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_dict({"prompt": [f"Prompt {i}:" for i in range(8)]}),
                 "test": Dataset.from_dict({"prompt": ["Held out one:", "Held out two:"]})}
                ).save_to_disk(str(tmp_path / "data"))
    (tmp_path / "my_rewards.py").write_text("def letters(prompts, completions, **kwargs):\n"
                                            "    return [c.count('e') / max(len(c), 1) for c in completions]\n")
    monkeypatch.chdir(tmp_path)  # TRL's scripts import a dotted reward from the working directory, as here
    monkeypatch.delenv("ELASTIC_RESET_TEST_RECIPE", raising=False)

    def write(text=RECIPE, **changes):
        body = text.format(data=tmp_path / "data")
        for key, value in changes.items():
            lines = [line for line in body.splitlines() if not line.startswith(f"{key}:")]
            body = "\n".join(lines + ([f"{key}: {value}"] if value is not None else [])) + "\n"
        (tmp_path / "recipe.yaml").write_text(body)
        return tmp_path / "recipe.yaml"
    return write


def test_a_trl_grpo_recipe_carries_over_whole(recipe):
    import os

    from elastic_reset.rl.from_trl import config_from_recipe

    config = config_from_recipe(recipe(), "grpo", ["method.name=elastic_reset"])
    o = config.task.options
    assert (config.model.name, config.model.lora.r, config.model.lora.alpha, config.model.lora.target_modules) == \
        ("tiny-llama", 4, 8, ["q_proj", "k_proj"])
    assert config.model.autocast == "auto"  # bf16 not stated: TRL's default is bf16, here where the hardware has it
    assert (config.task.name, o["path"].endswith("data"), o["split"], o["eval_split"]) == \
        ("prompts", True, "train", "test")  # a folder here; a datasets name (dataset: ...) online
    assert o["chat_template"] == "conversations"  # as TRL renders prompts: text as text, chat messages templated
    assert o["reward"][0].endswith("reward-model") and o["reward"][1:] == ["my_rewards:letters",
                                                                           "think_format_reward"]
    assert o["reward_weights"] == [1.0, 0.5, 0.1]
    assert (config.algo.samples_per_prompt, config.steps, config.eval.every, config.kl.coef) == (2, 2, 1, 0.02)
    assert (config.kl.estimator, config.method.name) == ("k3", "elastic_reset")  # overrides come last
    assert os.environ["ELASTIC_RESET_TEST_RECIPE"] == "read"
    rloo = config_from_recipe(recipe(eval_strategy=None, bf16="false"), "rloo")
    assert (rloo.algo.ratio, rloo.kl.estimator, rloo.model.autocast) == ("sequence_sum", "k1", "none")
    assert "eval_split" not in rloo.task.options  # TRL reads the test split only to evaluate: a held-out share here
    one = config_from_recipe(recipe(reward_funcs="my_rewards.letters", reward_model_name_or_path=None,
                                    reward_weights=None), "grpo")
    assert one.task.options["reward"] == ["my_rewards:letters"]  # a single name without a list
    overlong = config_from_recipe(recipe(reward_funcs="[get_soft_overlong_punishment]", reward_weights=None,
                                         reward_model_name_or_path=None), "grpo")
    assert overlong.task.options["reward"] == ["get_soft_overlong_punishment"]  # the scripts' registry name


@pytest.mark.parametrize("changes, pattern", [
    ({"foo": 1}, r"recipe\.yaml: Some keys are not used by the HfArgumentParser: \['foo'\]"),
    ({"load_in_4bit": "true"}, r"^ModelConfig\.load_in_4bit: True: quantised models are not built here"),
    ({"lora_r": "four"}, r"^ModelConfig\.lora_r: expected an integer, got 'four'"),
    ({"learning_rate": "fast"}, r"^GRPOConfig\.learning_rate: expected a number, got 'fast'"),
    ({"reward_funcs": "[letters]"}, r"^GRPOScriptArguments\.reward_funcs: 'letters': expected one of accuracy_"),
    ({"dataset_config": "plain_text"}, r"^GRPOScriptArguments\.dataset_config: 'plain_text': a dataset's config"),
    ({"datasets": "[{path: a}]"}, r"recipe\.yaml: datasets: TRL's dataset mixtures are not read here"),
    ({"dataset_name": "[a, b]"}, r"^GRPOScriptArguments\.dataset_name: expected a dataset's name or folder"),
    ({"lora_task_type": "SEQ_CLS"}, r"^ModelConfig\.lora_task_type: 'SEQ_CLS': causal LMs here"),
])
def test_what_a_recipe_cannot_have_here_is_refused_in_one_line_naming_it(recipe, changes, pattern):
    from elastic_reset.rl.from_trl import config_from_recipe

    with pytest.raises(ConfigError, match=pattern):
        config_from_recipe(recipe(**changes), "grpo")


def test_train_runs_a_trl_recipe_and_the_cli_flags_come_after_it(recipe, tmp_path):
    import argparse

    from elastic_reset.cli import _overrides, main
    from elastic_reset.io import read_metrics
    from elastic_reset.rl.from_trl import config_from_recipe

    path = recipe(reward_model_name_or_path=None, reward_weights=None, reward_funcs="[my_rewards.letters]")
    assert main(["train", str(path), "--trl", "grpo", "--out", str(tmp_path / "run"), "--set", "progress=false",
                 "--set", "method.name=elastic_reset", "--set", "method.reset_every=1"]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if "reward" in r]
    assert [r["step"] for r in train] == [1, 2] and "rewards/letters" in train[-1]
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 1, 2]  # on the dataset's test split
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()  # use_peft: a LoRA adapter out
    # --reward alone replaces the recipe's reward only; its dataset stays
    flags = argparse.Namespace(model=None, prompts=None, reward=["my_rewards:letters"], set=None)
    options = config_from_recipe(path, "grpo", _overrides(flags)).task.options
    assert options["reward"] == "my_rewards:letters" and options["path"].endswith("data")


def test_train_without_out_writes_where_the_recipe_says_as_trl_would(recipe, tmp_path, capsys):
    from elastic_reset.cli import main

    path = recipe(reward_model_name_or_path=None, reward_weights=None, reward_funcs="[my_rewards.letters]",
                  output_dir="runs/from-recipe")
    assert main(["train", str(path), "--trl", "grpo", "--set", "progress=false", "--set", "steps=1"]) == 0
    assert (tmp_path / "runs" / "from-recipe" / "metrics.jsonl").is_file()
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("prompts: as TRL's trainers render them")  # once, before training
    assert sum(line.startswith("prompts:") for line in said) == 1
    path = recipe(output_dir=None)
    assert main(["train", str(path), "--trl", "grpo"]) == 2
    assert "the recipe names no output_dir" in capsys.readouterr().err


def test_compare_runs_a_grid_from_a_trl_recipe_in_child_processes_too(recipe, tmp_path):
    import json

    import yaml

    from elastic_reset.cli import main

    path = recipe(reward_model_name_or_path=None, reward_weights=None, reward_funcs="[my_rewards.letters]",
                  max_steps=1)
    assert main(["compare", str(path), "--trl", "grpo", "--out", str(tmp_path / "grid"), "--methods", "none,kl",
                 "--seeds", "1", "--jobs", "2"]) == 0
    summary = json.loads((tmp_path / "grid" / "summary.json").read_text())
    assert summary["grid"]["trl"] == "grpo" and summary["argv"][3:5] == ["--out", str(tmp_path / "grid")]
    assert "--trl" in summary["argv"]  # rerunning the recorded command continues this grid
    for method in ("none", "kl"):
        saved = yaml.safe_load((tmp_path / "grid" / method / "seed0" / "config.yaml").read_text())
        assert (saved["method"]["name"], saved["model"]["lora"]["r"], saved["kl"]["coef"]) == (method, 4, 0.02)


def test_every_model_and_script_setting_of_this_trl_is_read_or_known_to_make_no_difference(recipe, monkeypatch):
    import dataclasses

    import transformers

    from elastic_reset.rl import from_trl

    seen = []
    monkeypatch.setattr(from_trl, "_refuse_unread", lambda get, ignored=from_trl.IGNORED: seen.append((get, ignored)))
    from_trl.config_from_recipe(recipe(), "grpo")
    inherited = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert {get.kind for get, _ in seen} == {"ModelConfig", "GRPOScriptArguments", "GRPOConfig"}
    for get, ignored in seen:
        assert not {f.name for f in dataclasses.fields(get.args)} - inherited - get.read - ignored, get.kind


def test_gdpos_reward_is_the_one_grpo_trainer_computes():
    from trl.trainer.utils import nanstd

    from elastic_reset.rl import ops

    nan, k, weights = float("nan"), 3, [1.0, 0.3]
    parts = torch.tensor([[1.0, 5.0], [0.0, nan], [2.0, 7.0],     # the second reward missing once
                          [0.5, 4.0], [0.5, nan], [0.5, nan],     # the first constant, the second given once
                          [nan, nan], [3.0, 1.0], [1.0, 2.0]])    # a sample with no reward at all
    # GRPOTrainer's normalize_then_sum branch, line for line (it is inline in _generate_and_score_completions)
    grouped = parts.view(-1, k, 2)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)).view(-1, 2)
    theirs = (reward_k * torch.tensor(weights)).nansum(dim=1)
    theirs[torch.isnan(parts).all(dim=1)] = nan
    torch.testing.assert_close(ops.group_normalized_sum(parts, weights, k), theirs, equal_nan=True)
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8,
                              multi_objective_aggregation="normalize_then_sum")).algo
    assert (a.reward_aggregation, a.scale_rewards, a.whiten_advantages) == ("normalize_then_sum", "none", True)


def test_print_config_shows_what_a_recipe_would_train_with_and_writes_nothing(recipe, tmp_path, capsys):
    import yaml

    from elastic_reset.cli import main

    path = recipe()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", str(path), "--trl", "rloo", "--print-config", "--set", "method.name=elastic_reset"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert (shown["method"]["name"], shown["model"]["lora"]["r"], shown["algo"]["ratio"], shown["kl"]["coef"]) == \
        ("elastic_reset", 4, "sequence_sum", 0.02)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert main(["train", str(path), "--trl", "rloo"]) == 2
    assert "--out: the run directory is required" in capsys.readouterr().err


def test_all_linear_in_a_recipe_is_peft_s_all_linear(recipe):
    from elastic_reset.rl.from_trl import config_from_recipe

    assert config_from_recipe(recipe(lora_target_modules="all-linear"), "grpo").model.lora.target_modules == \
        ["all-linear"]


def test_every_refusal_of_a_recipe_comes_in_one_message(recipe):
    from elastic_reset.rl.from_trl import config_from_recipe

    with pytest.raises(ConfigError) as err:
        config_from_recipe(recipe(load_in_4bit="true", use_dora="true", learning_rate="fast",
                                  reward_funcs="[letters]"), "grpo")
    said = str(err.value)
    assert "\n" not in said and said.count("; ") == 3, said
    for part in ("ModelConfig.load_in_4bit: True: quantised", "ModelConfig.use_dora: True: plain LoRA",
                 "GRPOConfig.learning_rate: expected a number, got 'fast'", "reward_funcs: 'letters': expected"):
        assert part in said, said


def test_launcher_settings_in_a_recipe_are_accelerate_launchs_said_once_and_a_typo_is_still_refused(recipe):
    from elastic_reset.rl.from_trl import LauncherSettingsWarning, config_from_recipe

    with pytest.warns(LauncherSettingsWarning, match=r"num_processes, accelerate_config: settings of `accelerate "):
        config = config_from_recipe(recipe(num_processes=2, accelerate_config="zero2"), "grpo")
    assert config.task.name == "prompts"
    with pytest.raises(ConfigError, match=r"Some keys are not used by the HfArgumentParser: \['num_proceses'\]"):
        config_from_recipe(recipe(num_proceses=2), "grpo")


def test_prompts_on_a_recipe_replace_its_dataset_and_keep_its_rewards_as_trl_s_dataset_name_flag(recipe, tmp_path,
                                                                                                   capsys):
    import yaml

    from elastic_reset.cli import main

    (tmp_path / "other.jsonl").write_text('{"prompt": "Another:"}\n' * 4)
    path = recipe(reward_model_name_or_path=None, reward_weights=None, reward_funcs="[my_rewards.letters]")
    assert main(["train", str(path), "--trl", "grpo", "--prompts", str(tmp_path / "other.jsonl"),
                 "--print-config"]) == 0
    options = yaml.safe_load(capsys.readouterr().out)["task"]["options"]
    assert options["path"] == str(tmp_path / "other.jsonl") and "dataset" not in options
    assert options["reward"] == ["my_rewards:letters"] and options["chat_template"] == "conversations"


def test_a_recipe_without_max_steps_runs_num_train_epochs_over_its_dataset_as_transformers_counts_them(recipe):
    from elastic_reset.rl.from_trl import config_from_recipe

    # 8 training prompts, 2 a generation batch (4 completions of 2): 4 iterations an epoch
    assert config_from_recipe(recipe(max_steps=None, num_train_epochs=2), "grpo").steps == 8
    assert config_from_recipe(recipe(max_steps=None), "grpo").steps == 12  # TrainingArguments' default: 3 epochs
    # one prompt a batch (4 completions of 4), two optimizer steps an iteration: 8 iterations an epoch
    assert config_from_recipe(recipe(max_steps=None, num_generations=4, num_iterations=2, eval_steps=2),
                              "rloo").steps == 24
