"""A TRL GRPOConfig carried over as this engine's config (rl/from_trl.py)."""

from __future__ import annotations

import pytest
import torch

from elastic_reset.errors import ConfigError
from elastic_reset.rl.from_trl import config_from_grpo

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")  # TRL's own default


def grpo(**settings):
    settings = {"output_dir": "out/my-policy", "bf16": False, "report_to": "none", "max_steps": 20, **settings}
    return trl.GRPOConfig(**settings)


def test_the_settings_a_grpo_user_has_carry_over():
    config = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, learning_rate=1e-5, beta=0.04,
                                   max_completion_length=32, temperature=0.9, top_p=0.95, min_p=0.05,
                                   repetition_penalty=1.1, save_steps=10, seed=3, mask_truncated_completions=True,
                                   log_completions=True, push_to_hub=True, run_name="r1", warmup_steps=0.1))
    a, s = config.algo, config.sampling
    assert (a.name, a.samples_per_prompt, a.prompts_per_step, a.minibatch_size, a.epochs) == ("rloo", 4, 2, 8, 1)
    assert (config.steps, config.checkpoint_every, config.eval.every, config.seed) == (20, 10, 0, 3)
    assert (a.lr, a.lr_scheduler, a.warmup_steps, a.clip_range, a.max_grad_norm) == (1e-5, "linear", 2, 0.2, 1.0)
    assert (a.scale_rewards, a.whiten_advantages, a.mask_truncated_completions) == ("group", False, True)
    assert (config.kl.coef, config.kl.target, config.kl.estimator, config.method.name) == (0.04, None, "k3", "kl")
    assert (s.max_new_tokens, s.temperature, s.top_p, s.min_p, s.repetition_penalty) == (32, 0.9, 0.95, 0.05, 1.1)
    assert (config.model.autocast, config.log_completions, config.push_to_hub, config.run_name) == \
        ("none", True, "my-policy", "r1")


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


@pytest.mark.parametrize("loss_type, aggregation", [("dapo", "token"), ("bnpo", "token"), ("grpo", "sequence"),
                                                     ("dr_grpo", "constant"), ("cispo", "token")])
def test_grpos_loss_carries_over_clipped_ratio_and_all(loss_type, aggregation):
    config = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, epsilon=0.2, epsilon_high=0.28,
                                   loss_type=loss_type, importance_sampling_level="sequence", delta=1.5))
    a = config.algo
    assert (a.ratio, a.clip_range, a.clip_range_high, a.ratio_max, a.loss_aggregation) == \
        ("sequence", 0.2, 0.28, 1.5, aggregation)
    assert a.surrogate == ("cispo" if loss_type == "cispo" else "clip")
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8)).algo  # TRL's defaults
    assert (a.ratio, a.clip_range_high, a.ratio_max, a.loss_aggregation) == ("token", None, None, "token")


@pytest.mark.parametrize("settings, pattern", [
    ({"max_steps": -1}, r"^GRPOConfig\.max_steps: set the number of optimizer steps"),
    ({"loss_type": "sapo"}, r"^GRPOConfig\.loss_type: 'sapo': one of dapo, bnpo, grpo, dr_grpo, cispo here"),
    ({"reward_weights": [1.0, 2.0]}, r"^GRPOConfig\.reward_weights: .*give it to the prompts task"),
    ({"off_policy_mask_threshold": 0.5}, r"^GRPOConfig\.off_policy_mask_threshold: 0\.5: not built here"),
    ({"multi_objective_aggregation": "normalize_then_sum"}, r"^GRPOConfig\.multi_objective_aggregation: "),
    ({"use_adaptive_entropy": True}, r"^GRPOConfig\.use_adaptive_entropy: True: give a fixed entropy_coef"),
    ({"shuffle_dataset": False}, r"^GRPOConfig\.shuffle_dataset: False: prompts are always drawn"),
    ({"save_strategy": "epoch"}, r"^GRPOConfig\.save_strategy: 'epoch': only steps"),
    ({"num_iterations": 2, "save_steps": 3}, r"^GRPOConfig\.save_steps: 3 optimizer steps are not whole iterations "
                                             r"of 2$"),
])
def test_what_has_no_counterpart_is_refused_naming_the_setting(settings, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, **settings))


def test_a_grpo_config_trains_here(tmp_path):
    from elastic_reset.rl.trainer import RLTrainer
    from elastic_reset.tasks import get_task

    def letters(prompts, completions, **kwargs):
        return [c.count("e") / max(len(c), 1) for c in completions]

    args = grpo(num_generations=2, per_device_train_batch_size=4, max_steps=2, max_completion_length=6,
                learning_rate=1e-3, save_steps=2)
    config = config_from_grpo(args, ["model.name=tiny-llama", "task.name=prompts", "progress=false"])
    task = get_task("prompts", dataset=[{"prompt": f"Prompt {i}:"} for i in range(8)], reward=[letters])
    records = RLTrainer(config, tmp_path / "run", task=task).train()
    train = [r for r in records if "reward" in r]
    assert [r["step"] for r in train] == [1, 2] and train[0]["lr"] == 1e-3
    assert (tmp_path / "run" / "final" / "README.md").is_file()


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    block = readme.split("```python\nfrom trl import GRPOConfig\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)  # GRPOConfig's output_dir
    scope: dict = {}
    exec("from trl import GRPOConfig\n" + block, scope)
    config = scope["config"]
    assert (config.steps, config.algo.samples_per_prompt, config.kl.coef, config.method.name) == \
        (100, 4, 0.04, "elastic_reset")


@pytest.mark.parametrize("loss_type, level, delta, rho", [
    ("dapo", "token", None, 1.0), ("bnpo", "sequence", None, 1.0), ("grpo", "token", 1.5, 1.0),
    ("grpo", "sequence", None, 0.4), ("dr_grpo", "token", None, 1.0), ("dapo", "token", None, 0.2),
    ("cispo", "token", None, 1.0), ("cispo", "sequence", None, 0.4)])
def test_our_policy_loss_is_the_one_grpo_trainer_computes(loss_type, level, delta, rho):
    # TRL's own _compute_loss on a stand-in trainer (its forward replaced by given log-probs), against ours with
    # the settings config_from_grpo carries over: the loss and its gradient agree.
    import types
    from collections import defaultdict

    from elastic_reset.rl import ops

    args = grpo(num_generations=2, per_device_train_batch_size=4, epsilon=0.2, epsilon_high=0.28,
                loss_type=loss_type, importance_sampling_level=level, max_completion_length=5, delta=delta,
                top_entropy_quantile=rho)
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
        top_entropy_quantile=rho, off_policy_mask_threshold=None, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, use_vllm=False, model=types.SimpleNamespace(
            training=False), max_completion_length=5, accelerator=gathered, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)))
    inputs = {"prompt_ids": torch.zeros(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
              "completion_ids": torch.zeros(4, 5, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    trainer.get_high_entropy_mask = lambda *a: trl.GRPOTrainer.get_high_entropy_mask(trainer, *a)
    theirs = trl.GRPOTrainer._compute_loss(trainer, None, inputs)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    high = ops.high_entropy_mask(entropy, mask, a.top_entropy_quantile)  # as the trainer zeroes the rest
    ours, _ = ops.ppo_policy_loss(logp, old, torch.where(high, adv[:, None], 0.0), mask, a.clip_range,
                                  a.clip_range_high, a.ratio, a.loss_aggregation, args.max_completion_length,
                                  a.ratio_max, a.surrogate)
    (our_grad,) = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(our_grad, their_grad)


def test_every_grpo_setting_of_this_trl_is_read_or_known_to_make_no_difference(monkeypatch):
    # so that the refusal of an unread setting below only ever meets a newer TRL's
    import dataclasses

    import transformers

    from elastic_reset.rl import from_trl

    seen = {}
    monkeypatch.setattr(from_trl, "_refuse_unread", lambda args, read: seen.update(read=read))
    config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8))
    inherited = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    own = {f.name for f in dataclasses.fields(trl.GRPOConfig)} - inherited
    assert not own - seen["read"] - from_trl.IGNORED


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


def test_a_schedule_with_its_settings_carries_over():
    a = config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, lr_scheduler_type="cosine_with_min_lr",
                              lr_scheduler_kwargs={"min_lr_rate": 0.1})).algo
    assert (a.lr_scheduler, a.lr_scheduler_kwargs) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})


def test_the_entropy_bonus_carries_over():
    assert config_from_grpo(grpo(num_generations=4, per_device_train_batch_size=8, entropy_coef=0.01)).algo \
        .entropy_coef == 0.01
