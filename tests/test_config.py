"""The run configuration: YAML and ``--set`` in, a validated TrainConfig out, and every refusal naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_reset.rl.config import (ALGOS, METHODS, ConfigError, TrainConfig, check_same_run, config_from_dict,
                                     config_to_dict, load_config)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def refused(*overrides: str, data: dict | None = None) -> str:
    """The message of the ConfigError that ``overrides`` on the defaults (or on ``data``) raise."""
    with pytest.raises(ConfigError) as err:
        config_from_dict(data or {}, list(overrides))
    return str(err.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------------- valid input
@pytest.mark.parametrize("name", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(name):
    assert isinstance(load_config(name), TrainConfig)


@pytest.mark.parametrize("method", METHODS)
def test_every_listed_method_is_accepted(method):
    assert config_from_dict({}, [f"method.name={method}"]).method.name == method


@pytest.mark.parametrize("algo", ALGOS)
def test_every_listed_algorithm_is_accepted(algo):
    assert config_from_dict({}, [f"algo.name={algo}", "algo.samples_per_prompt=2"]).algo.name == algo


def test_an_int_is_accepted_for_a_float():
    lr = config_from_dict({"algo": {"lr": 1}}).algo.lr
    assert lr == 1.0 and isinstance(lr, float)


def test_exponent_without_a_dot_in_yaml_reads_as_a_float(tmp_path):
    assert load_config(write(tmp_path, "algo:\n  lr: 3e-4\n")).algo.lr == 3e-4


def test_exponent_without_a_dot_in_set_reads_as_a_float():
    assert config_from_dict({}, ["algo.lr=3e-4"]).algo.lr == 3e-4


def test_set_with_an_empty_value_gives_null():
    assert config_from_dict({"kl": {"target": 1.0}}, ["kl.target="]).kl.target is None


def test_set_creates_an_optional_section():
    assert config_from_dict({}, ["model.lora.r=2"]).model.lora.r == 2


@pytest.mark.parametrize("key", ["algo.max_grad_norm", "algo.clip_range_value", "kl.target"])
def test_null_switches_off_an_optional_setting(key):
    section, name = key.split(".")
    assert getattr(getattr(config_from_dict({}, [f"{key}=null"]), section), name) is None


def test_a_valid_config_round_trips_through_a_dict_unchanged():
    config = load_config(CONFIGS / "demo.yaml", ["kl.target=0.5", "task.options={n: 3}"])
    assert config_from_dict(config_to_dict(config)) == config


def test_a_config_changed_in_code_is_validated():
    config = TrainConfig()
    config.algo.lr = -1.0
    with pytest.raises(ConfigError, match=r"^algo\.lr: "):
        config.validate()


# ----------------------------------------------------------------------------------------------- refused input
def test_unknown_key_is_named_with_its_dotted_path():
    assert refused("algo.lrr=1").startswith("algo.lrr: unknown key (known: adam_eps, baseline_decay, ")


def test_unknown_key_in_an_optional_section_is_named():
    assert refused("model.lora.rank=2").startswith("model.lora.rank: unknown key (known: alpha, dropout, r, ")


def test_unknown_key_in_a_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^algo\.nam: unknown key"):
        load_config(write(tmp_path, "algo:\n  nam: ppo\n"))


def test_wrong_type_is_named():
    assert refused(data={"algo": {"lr": "fast"}}) == "algo.lr: expected a number, got 'fast'"


def test_bool_is_refused_for_an_int():
    assert refused("steps=true") == "steps: expected an integer, got True"


def test_bool_is_refused_for_a_float():
    assert refused("algo.lr=true") == "algo.lr: expected a number, got True"


def test_int_is_refused_for_a_bool():
    assert refused("tensorboard=1") == "tensorboard: expected true or false, got 1"


def test_numeric_string_is_refused_for_an_int():
    assert refused(data={"steps": "5"}) == "steps: expected an integer, got '5'"


def test_wrong_list_item_is_named_with_its_index():
    assert refused("model.lora.target_modules=[q_proj, 3]").startswith("model.lora.target_modules[1]: ")


def test_section_that_is_not_a_mapping_is_named():
    assert refused("algo=3") == "algo: expected a mapping, got 3"


def test_set_inside_a_value_that_is_not_a_section_is_named():
    assert refused("steps.x=1", data={"steps": 3}) == "--set 'steps.x=1': steps is not a section"


def test_set_without_equals_sign_is_refused():
    assert refused("algo.lr").startswith("--set 'algo.lr': expected key=value")


def test_every_error_is_reported_one_per_line():
    assert refused("seed=-1", "algo.epochs=0").splitlines() == [
        "seed: expected an integer >= 0, got -1", "algo.epochs: expected an integer > 0, got 0"]


@pytest.mark.parametrize("override,message", [
    ("algo.lr=-1", "algo.lr: expected a number > 0, got -1"),
    ("method.name=magic", "method.name: expected one of 'none', 'kl', "),
    ("method.decay=1.0", "method.decay: expected a number < 1, got 1.0"),
    ("eval.reference=human", "eval.reference: expected one of 'task' or 'initial_samples', got 'human'"),
    ("eval.samples_per_prompt=0", "eval.samples_per_prompt: expected an integer > 0, got 0"),
    ("model.autocast=fp16", "model.autocast: expected one of 'auto', 'bf16' or 'none', got 'fp16'"),
    ("model.lora.r=0", "model.lora.r: expected an integer > 0, got 0"),
    ("kl.estimator=k2", "kl.estimator: expected one of 'k1' or 'k3', got 'k2'"),
    ("bad_reward=skip", "bad_reward: expected one of 'error' or 'drop', got 'skip'"),
    ("sampling.top_p=0", "sampling.top_p: expected in (0, 1]"),
])
def test_impossible_value_is_refused_naming_the_key(override, message):
    assert refused(override).startswith(message)


# Settings accepted before pydantic that make training meaningless.
@pytest.mark.parametrize("override,message", [
    ("algo.max_grad_norm=0", "algo.max_grad_norm: expected a number > 0, got 0"),
    ("algo.max_grad_norm=-1", "algo.max_grad_norm: expected a number > 0, got -1"),
    ("algo.clip_range_value=0", "algo.clip_range_value: expected a number > 0, got 0"),
    ("algo.adam_eps=0", "algo.adam_eps: expected a number > 0, got 0"),
    ("algo.weight_decay=-0.01", "algo.weight_decay: expected a number >= 0, got -0.01"),
    ("algo.vf_coef=-0.5", "algo.vf_coef: expected a number >= 0, got -0.5"),
    ("algo.entropy_coef=-0.01", "algo.entropy_coef: expected a number >= 0, got -0.01"),
    ("kl.coef=-0.1", "kl.coef: expected a number >= 0, got -0.1"),
    ("method.multitask_coef=-1", "method.multitask_coef: expected a number >= 0, got -1"),
    ("sampling.temperature=.inf", "sampling.temperature: expected a finite number, got inf"),
    ("sampling.temperature=.nan", "sampling.temperature: expected a finite number, got nan"),
    ("model.lora.dropout=1", "model.lora.dropout: expected a number < 1, got 1"),
    ("model.lora.target_modules=[]", "model.lora.target_modules: expected at least one item, got []"),
    ("model.tiny_hidden=0", "model.tiny_hidden: expected an integer > 0, got 0"),
    ("eval.max_text_tokens=0", "eval.max_text_tokens: expected an integer > 0, got 0"),
    ("threads=0", "threads: expected an integer > 0, got 0"),
    ("seed=-1", "seed: expected an integer >= 0, got -1"),
])
def test_meaningless_setting_is_refused_naming_the_key(override, message):
    assert refused(override) == message


@pytest.mark.parametrize("overrides,message", [
    (["algo.name=rloo"], "algo.samples_per_prompt: rloo needs >= 2 samples per prompt"),
    (["algo.minibatch_size=3"], "algo.minibatch_size: must divide the rollout batch"),
    (["sampling.min_new_tokens=99"], "sampling.min_new_tokens: expected 0 <= min_new_tokens <= max_new_tokens"),
    (["kl.reference=ema"], "kl.reference: 'ema' needs a method that keeps an EMA"),
])
def test_cross_field_rule_is_refused_naming_the_key(overrides, message):
    assert refused(*overrides).startswith(message)


# ----------------------------------------------------------------------------------------------- files and runs
def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.yaml: config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_invalid_yaml_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML"):
        load_config(write(tmp_path, "algo: [\n"))


def test_top_level_that_is_not_a_mapping_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.yaml: expected a mapping at the top level, got list"):
        load_config(write(tmp_path, "- 1\n"))


def _saved_run(tmp_path: Path) -> tuple[Path, TrainConfig]:
    """A run directory's ``config.yaml``, written as RLTrainer writes it, and the config it came from."""
    config = load_config(CONFIGS / "tiny.yaml")
    path = write(tmp_path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path, config


def test_continuing_a_run_with_a_changed_key_is_refused(tmp_path):
    saved, config = _saved_run(tmp_path)
    config.algo.lr = 0.1
    with pytest.raises(ConfigError, match=r"^algo: differs from the run"):
        check_same_run(saved, config)


def test_continuing_a_run_with_more_steps_is_accepted(tmp_path):
    saved, config = _saved_run(tmp_path)
    config.steps += 10
    check_same_run(saved, config)
