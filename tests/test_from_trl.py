"""A TRL GRPOConfig carried over as this engine's config (rl/from_trl.py)."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("settings, pattern", [
    ({"max_steps": -1}, r"^GRPOConfig\.max_steps: set the number of optimizer steps"),
    ({"loss_type": "grpo"}, r"^GRPOConfig\.loss_type: 'grpo': only a token-level mean"),
    ({"reward_weights": [1.0, 2.0]}, r"^GRPOConfig\.reward_weights: .*give it to the prompts task"),
    ({"epsilon_high": 0.28}, r"^GRPOConfig\.epsilon_high: 0\.28: asymmetric clipping"),
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
