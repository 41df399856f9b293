"""The run configuration: YAML and ``--set`` in, a validated TrainConfig out, and every refusal naming its key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from elastic_reset.rl.config import (ALGOS, MAX_SEED, METHODS, ConfigError, TrainConfig, check_same_run,
                                     config_from_dict, config_to_dict, load_config)

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
    assert refused("algo.lrr=1").startswith(
        "algo.lrr: unknown key (known: adam_beta2, adam_eps, baseline, baseline_decay, ")


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


def test_set_without_equals_sign_or_key_is_refused_naming_set():
    assert refused("algo.lr").startswith("--set 'algo.lr': expected key=value")
    assert refused("=5").startswith("--set '=5': expected key=value with a dotted key")
    assert refused("algo..lr=5").startswith("--set 'algo..lr=5': expected key=value with a dotted key")


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
    (["algo.ratio=none"], "algo.ratio: ppo's advantages are per token: its ratio is 'token', got 'none'"),
    (["algo.name=reinforce", "algo.surrogate=cispo"],
     "algo.surrogate: 'cispo' weighs the policy gradient by the ratio"),
    (["algo.name=reinforce", "algo.epochs=2", "algo.ratio=none"],
     "algo.epochs: 2 passes over a batch need an importance ratio (algo.ratio: token, sequence or sequence_sum)"),
    (["algo.reward_aggregation=normalize_then_sum"],
     "algo.reward_aggregation: 'normalize_then_sum' normalises each reward within a prompt's group"),
    (["algo.name=rloo", "algo.samples_per_prompt=2", "algo.off_policy_mask=0.5"],
     "algo.off_policy_mask: compares the policy with the one that sampled a response of one advantage: algo.ratio "
     "not none"),
    (["algo.reward_clip_range=[1, 0]"], "algo.reward_clip_range: expected [low, high] with low < high, got [1.0, 0.0]"),
])
def test_cross_field_rule_is_refused_naming_the_key(overrides, message):
    assert refused(*overrides).startswith(message)


@pytest.mark.parametrize("overrides,epochs,ratio", [
    ([], 4, "token"),
    (["algo.name=reinforce"], 1, "none"),
    (["algo.name=rloo", "algo.samples_per_prompt=2", "algo.epochs=2"], 2, "token"),
    (["algo.name=rloo", "algo.samples_per_prompt=2", "algo.ratio=sequence"], 1, "sequence"),
])
def test_epochs_and_ratio_default_by_algorithm_and_are_saved_as_they_ran(overrides, epochs, ratio):
    # a batch used twice needs the ratio; the saved config holds the settled values, not None
    algo = config_from_dict({}, overrides).algo
    assert (algo.epochs, algo.ratio) == (epochs, ratio)
    assert {k: config_to_dict(config_from_dict({}, overrides))["algo"][k] for k in ("epochs", "ratio")} == \
        {"epochs": epochs, "ratio": ratio}


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


# ----------------------------------------------------------------------------- YAML that loads something else
def nine_fold(names: str, leaf: str = "lol") -> list[str]:
    """Lines of a "billion laughs" document: each anchor holds nine aliases of the one before (9^len(names))."""
    lines = [f"{names[0]}: &{names[0]} [{', '.join([leaf] * 9)}]"]
    lines += [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(names, names[1:])]
    return lines


def test_alias_bomb_is_refused_at_its_first_anchor(tmp_path):
    # Under task.options (any value is valid there) it used to load: 9^9 strings behind 1 KB of text.
    text = "task:\n  options:\n" + "".join(f"    {line}\n" for line in nine_fold("abcdefghi"))
    assert len(text) < 1024
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}, line 3: task.options.a: YAML anchors and aliases (&a) are not allowed in a "
                              "config; write the value out")


def test_alias_is_refused_in_set():
    assert refused("task.options={a: &x [1], b: *x}") == (
        "--set 'task.options={a: &x [1], b: *x}': task.options.a: YAML anchors and aliases (&x) are not allowed in a "
        "config; write the value out")


def test_a_huge_bad_value_is_shown_short():
    bomb = ["lol"] * 9
    for _ in range(5):  # 9^6 strings: the full repr is 3.7 MB
        bomb = [bomb] * 9
    message = refused(data={"seed": bomb, "algo": {"lr": "x" * 100_000}})
    assert [len(line) <= 120 for line in message.splitlines()] == [True, True], message
    assert message.startswith("seed: expected an integer, got [[[[...], [...], ")


def test_a_huge_unknown_key_is_shown_short():
    message = refused(data={"x" * 10_000: 1})  # the key cut, the known keys listed
    assert message.startswith("x" * 77 + "...: unknown key (known: algo, ") and len(message) < 400


def test_a_long_list_of_bad_items_is_reported_in_ten_lines():
    lines = refused(data={"model": {"lora": {"target_modules": list(range(1000))}}}).splitlines()
    assert lines[0] == "model.lora.target_modules[0]: expected a string, got 0"
    assert (len(lines), lines[-1]) == (11, "... and 990 more")


def test_deeply_nested_list_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path, "task:\n  options:\n    x: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}, line 3: task.options: nested deeper than 32 levels"


def test_deeply_nested_set_value_is_refused():
    assert refused("task.options=" + "[" * 5000 + "]" * 5000).endswith(": task.options[0][0]: nested deeper than 32 "
                                                                        "levels")


@pytest.mark.parametrize("content,where", [(b"seed: 1\nalgo:\n  lr: 1e-3 \xff\n", "byte 0xff at line 3"),
                                           (b"\x89PNG\r\n\x1a\n\x00\x00", "byte 0x89 at line 1"),
                                           (b"seed: 1\n\x00\n", "byte 0x00 at line 2")],
                         ids=["one-bad-byte", "binary", "nul-byte"])
def test_file_that_is_not_utf8_text_is_named(tmp_path, content, where):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: not UTF-8 text ({where}); save it as UTF-8"


@pytest.mark.parametrize("text,message", [
    ("seed: 010\n", "seed: 010 has a leading zero, which YAML reads as octal (8); drop the zero (or quote it for "
                    "text)"),
    ("seed: 0o10\n", "seed: 0o10 is an octal number (8), which YAML 1.1 reads as text; write it in decimal (or quote "
                     "it for text)"),
    ("algo: {epochs: -07}\n", "algo.epochs: -07 has a leading zero, which YAML reads as octal (-7); drop the zero "
                               "(or quote it for text)"),
    ("seed: 1:30\n", "seed: 1:30 is a base-60 number to YAML 1.1 (90); write it in decimal (or quote it for text)"),
])
def test_octal_looking_integer_in_a_file_is_refused_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, "steps: 5\n" + text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}, line 2: {message}"


@pytest.mark.parametrize("item", ["seed=010", "seed=0o10", "task.name=007"])
def test_octal_looking_integer_in_set_is_refused_naming_the_key(item):
    key, value = item.split("=")
    assert refused(item).startswith(f"--set '{item}': {key}: {value} ")


@pytest.mark.parametrize("text,key,value", [
    ("seed: 0\n", "seed", 0), ("seed: 10\n", "seed", 10), ("algo:\n  lr: 0.5\n", "algo.lr", 0.5),
    ("algo:\n  lr: 1e-3\n", "algo.lr", 1e-3), ("algo:\n  lr: 3e-4\n", "algo.lr", 3e-4),
    ("algo:\n  lr: 0.0003\n", "algo.lr", 3e-4), ("task:\n  name: '010'\n", "task.name", "010"),
    ("task:\n  options: {code: '0o10', time: '1:30'}\n", "task.options", {"code": "0o10", "time": "1:30"}),
])
def test_numbers_without_a_leading_zero_and_quoted_text_still_load(tmp_path, text, key, value):
    node = load_config(write(tmp_path, text))
    for part in key.split("."):
        node = getattr(node, part)
    assert node == value and type(node) is type(value)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n# a comment after a marker\n"],
                         ids=["empty", "blank", "comment", "marker"])
def test_empty_config_file_is_refused(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: empty config; ")


def test_empty_dict_from_code_still_gives_the_defaults():
    assert config_from_dict({}) == TrainConfig()


def test_duplicated_key_is_refused_naming_it_and_the_line(tmp_path):
    path = write(tmp_path, "seed: 1\nalgo:\n  lr: 0.1\n  epochs: 2\n  lr: 0.2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}, line 5: algo.lr: duplicate key (first at line 3); keep one"


def test_duplicated_top_level_section_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r", line 3: algo: duplicate key \(first at line 1\)"):
        load_config(write(tmp_path, "algo:\n  lr: 0.1\nalgo:\n  epochs: 2\n"))


def test_a_run_saved_with_octal_text_continues(tmp_path):
    # yaml.safe_dump writes the text "0o10" unquoted; the run's own config.yaml must still load on --resume.
    config = config_from_dict({"task": {"options": {"code": "0o10"}}})
    saved = write(tmp_path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    assert "code: 0o10" in saved.read_text()
    check_same_run(saved, config)


# ----------------------------------------------------------------------------------------------- bounds
def test_seed_beyond_64_bits_is_refused_naming_the_key():
    assert refused(f"seed={2**63}") == f"seed: expected an integer <= {2**63 - 1}, got {2**63}"


def test_largest_seed_is_accepted():
    # that every generator the trainer seeds takes it: test_robustness.py, a run at this seed
    assert config_from_dict({}, [f"seed={MAX_SEED}"]).seed == MAX_SEED


@pytest.mark.parametrize("overrides,multiple", [(["model.tiny_hidden=30"], 8), (["model.tiny_hidden=12"], 8),
                                                (["model.name=tiny-gpt2", "model.tiny_hidden=30"], 4)])
def test_tiny_model_width_that_does_not_split_into_heads_is_refused(overrides, multiple):
    name = "tiny-gpt2" if "model.name=tiny-gpt2" in overrides else "tiny-llama"
    message = refused(*overrides)
    assert message.startswith(f"model.tiny_hidden: {name} has 4 attention heads")
    assert message.endswith(f"so it must be a multiple of {multiple}, got {overrides[-1].split('=')[1]}")


def test_a_tiny_model_too_large_to_train_here_is_refused_before_it_is_built():
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert refused("model.tiny_hidden=200000").endswith(f"GiB to train, more than this machine's {memory:.0f} GiB "
                                                        "of memory")
    assert refused("model.tiny_layers=100000", "model.tiny_hidden=512").startswith(
        "model.tiny_hidden: tiny-llama at width 512 and 100000 layer(s)")


@pytest.mark.parametrize("overrides", [["model.tiny_hidden=16"], ["model.name=tiny-gpt2", "model.tiny_hidden=12"],
                                       ["model.name=smollm2", "model.tiny_hidden=30"]])
def test_tiny_model_width_that_splits_into_heads_is_accepted(overrides):
    config_from_dict({}, overrides)


def test_tiny_model_built_from_code_refuses_a_width_naming_the_setting():
    from elastic_reset.models import tiny_causal_lm

    with pytest.raises(ConfigError, match=r"^model\.tiny_hidden: tiny-gpt2 has 4 attention heads, so it must be a "
                                          r"multiple of 4, got 30$"):
        tiny_causal_lm("gpt2", hidden=30)


# ------------------------------------------------------------------------------------ each method's own config
@pytest.mark.parametrize("method, keys", [
    ("kl", {"name"}),
    ("elastic_reset", {"name", "decay", "reset_every", "ema_update", "ema_device", "reset_optimizer"}),
    ("nlpo", {"name", "nlpo_top_p", "nlpo_min_tokens", "nlpo_update_every"}),
    ("multitask", {"name", "multitask_coef", "multitask_batch"}),
])
def test_a_method_section_holds_its_own_settings_only(method, keys):
    config = config_from_dict({}, [f"method.name={method}"])
    assert set(config_to_dict(config)["method"]) == keys


def test_another_methods_setting_serves_a_grid_and_does_not_apply(tmp_path):
    # One base config for `compare --methods kl,elastic_reset`: the EMA settings apply to the EMA methods only.
    base = {"method": {"name": "kl", "decay": 0.9, "reset_every": 3}}
    assert config_to_dict(config_from_dict(base))["method"] == {"name": "kl"}
    er = config_from_dict(base, ["method.name=elastic_reset"]).method
    assert (er.decay, er.reset_every) == (0.9, 3)


def test_another_methods_setting_is_still_checked_by_its_rules():
    assert refused("method.reset_every=0") == "method.reset_every: expected an integer > 0, got 0"
    assert refused("method.name=none", "method.ema_update=weekly").startswith(
        "method.ema_update: expected one of 'step', 'epoch' or 'iteration', got 'weekly'")


def test_a_setting_no_method_has_is_refused_naming_what_the_method_knows():
    assert refused("method.name=nlpo", "method.nlpo_topp=0.5") == (
        "method.nlpo_topp: unknown key (method 'nlpo' knows: name, nlpo_min_tokens, nlpo_top_p, nlpo_update_every; "
        "other methods': alpha, cooldown, decay, ema_device, ema_update, eps, eta, every, g1_clip, g2_clip, "
        "kl_budget, multitask_batch, multitask_coef, plateau, preset, reset_every, reset_optimizer, strength)")


def test_an_unknown_method_name_lists_the_methods():
    assert refused("method.name=magic") == f"method.name: expected one of {', '.join(map(repr, METHODS))}, " \
                                           "got 'magic'"


def test_a_run_saved_with_every_method_setting_continues(tmp_path):
    # Runs written before each method had its own config saved every method's settings in one flat section.
    config = config_from_dict({}, ["method.name=nlpo", "method.nlpo_top_p=0.5"])
    saved = config_to_dict(config)
    saved["method"] = {"name": "nlpo", "decay": 0.995, "reset_every": 17, "ema_update": "step", "ema_device": "cpu",
                       "reset_optimizer": False, "nlpo_top_p": 0.5, "nlpo_min_tokens": 100, "nlpo_update_every": 50,
                       "multitask_coef": 1.0, "multitask_batch": 4}
    path = write(tmp_path, yaml.safe_dump(saved))
    check_same_run(path, config)
    with pytest.raises(ConfigError, match="^method: differs"):
        check_same_run(path, config_from_dict({}, ["method.name=nlpo", "method.nlpo_top_p=0.6"]))


def test_kl_reference_ema_follows_the_methods_flag():
    from elastic_reset.rl.methods import METHOD_CLASSES

    for name, cls in METHOD_CLASSES.items():
        overrides = [f"method.name={name}", "kl.reference=ema"]
        if cls.keeps_ema:
            assert config_from_dict({}, overrides).kl.reference == "ema"
        else:
            assert refused(*overrides).startswith("kl.reference: 'ema' needs a method that keeps an EMA")


def test_a_missing_config_points_to_the_shipped_one_of_that_name(tmp_path):
    with pytest.raises(ConfigError, match=r"tiny\.yaml: config file not found; a shipped config of that name is "
                                          r".*elastic_reset/configs/tiny\.yaml$"):
        load_config(tmp_path / "configs" / "tiny.yaml")


def test_every_setting_is_listed_once_with_its_type_default_and_docstring():
    from elastic_reset.rl.config import describe_fields
    from elastic_reset.rl.methods import method_keys

    rows = {key: (kind, default, doc) for key, kind, default, doc in describe_fields()}
    assert len(rows) == len(describe_fields())
    undocumented = [key for key, (_, _, doc) in rows.items() if not doc.strip("[] ")]
    assert not undocumented

    def dotted(data, prefix=""):
        for key, value in data.items():
            if isinstance(value, dict) and key != "options":
                yield from dotted(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    with_lora = config_from_dict({}, ["model.lora={r: 4}"])
    assert set(dotted(config_to_dict(with_lora))) | {"model.lora"} <= set(rows)
    assert {f"method.{k}" for keys in method_keys().values() for k in keys} <= set(rows)
    assert rows["algo.lr"] == ("float", "1e-05", "Adam learning rate (RL4LMs IMDB: 1e-6 with full fine-tuning; "
                                                 "LoRA wants more).")
    assert rows["kl.estimator"][0] == "'k1' | 'k3'" and rows["model.lora.r"][:2] == ("int", "16")


def test_the_config_command_prints_each_setting_with_its_meaning(capsys):
    from elastic_reset.cli import main

    assert main(["config", "algo.l"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algo.lr  (float, default 1e-05)\n    Adam learning rate") and "algo.lam" in out
    assert main(["config", "nope"]) == 2 and "config nope: no setting starts with it" in capsys.readouterr().err
