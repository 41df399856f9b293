"""Taking a run's policy out: RUN/final/, `elastic-reset export`, and what plain transformers / peft
load from them."""

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download or upload

import pytest
import torch
import yaml
from helpers import TINY, run_config, step_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from elastic_reset.cli import main
from elastic_reset.errors import ConfigError
from elastic_reset.io import read_metrics
from elastic_reset.models import byte_tokenizer
from elastic_reset.rl.config import config_from_dict
from elastic_reset.rl.export import export_run, model_card
from elastic_reset.rl.policy import load_model_and_tokenizer
from elastic_reset.rl.trainer import RLTrainer

LORA = "model.lora={r: 2, alpha: 4}"
IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 35, 200, 3, 90]])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """Elastic Reset with LoRA, 4 iterations, checkpoints at 2 and 4."""
    out = tmp_path_factory.mktemp("lora") / "run"
    config = run_config(LORA)
    RLTrainer(config, out).train()
    return out, config


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The KL penalty (no EMA) on the whole tiny model, 4 iterations."""
    out = tmp_path_factory.mktemp("full") / "run"
    config = run_config("method={name: kl}")
    RLTrainer(config, out).train()
    return out, config


def _policy_at(config, run, step, ema=False):
    """The run's policy at ``step``, rebuilt by hand from its checkpoint (or its EMA)."""
    model, _ = load_model_and_tokenizer(config.model, seed=config.seed)
    state = torch.load(step_file(run, step), weights_only=True)
    saved = state["trainable"]
    if ema:
        saved = dict(zip(state["method"]["ema"]["names"], state["method"]["ema"]["copies"]["ema"]))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in saved.items():
            params[name].copy_(tensor)
    return model.eval()


def _base(config):
    """The base model of a LoRA run, as a user of the adapter builds it (the tiny models are built locally)."""
    data = yaml.safe_load(TINY.read_text())
    base, _ = load_model_and_tokenizer(config_from_dict(data).model, seed=config.seed)
    return base.eval()


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _assert_same_logits(loaded, expected):
    torch.testing.assert_close(_logits(loaded.eval()), _logits(expected), rtol=1e-5, atol=1e-5)


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_final_folder_is_the_adapter_of_the_last_step(lora_run):
    from peft import PeftModel

    run, config = lora_run
    final = run / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    loaded = PeftModel.from_pretrained(_base(config), final)
    _assert_same_logits(loaded, _policy_at(config, run, 4))
    card = (final / "README.md").read_text()
    assert "elastic-reset" in card and "elastic_reset" in card and "library_name: peft" in card
    assert "Held-out evaluation at step 4" in card and "| reward |" in card and "| perplexity |" in card
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_export_of_an_earlier_step_as_adapter_and_merged(lora_run, tmp_path, capsys):
    from peft import PeftModel

    run, config = lora_run
    expected = _policy_at(config, run, 2)
    assert main(["export", str(run), "--step", "2", "--out", str(tmp_path / "adapter")]) == 0
    assert "policy written to" in capsys.readouterr().out
    _assert_same_logits(PeftModel.from_pretrained(_base(config), tmp_path / "adapter"), expected)
    assert "elastic-reset export" in (tmp_path / "adapter" / "README.md").read_text()

    export_run(run, tmp_path / "merged", step=2, merge=True)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    _assert_same_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), expected)
    # The exported policy differs from the last one: the step chosen is the one exported.
    assert not torch.allclose(_logits(expected), _logits(_policy_at(config, run, 4)))


def test_ema_export_holds_the_ema_weights(lora_run, tmp_path):
    from peft import PeftModel

    run, config = lora_run
    export_run(run, tmp_path / "ema", ema=True)
    state = torch.load(step_file(run, 4), weights_only=True)["method"]["ema"]
    loaded = dict(PeftModel.from_pretrained(_base(config), tmp_path / "ema").named_parameters())
    assert len(state["names"]) == 8
    for name, tensor in zip(state["names"], state["copies"]["ema"]):
        assert torch.equal(loaded[name], tensor), name
    assert not all(torch.equal(loaded[n], p) for n, p in _policy_at(config, run, 4).named_parameters()
                   if n in state["names"])  # the EMA, not the policy
    assert "the EMA of the policy's weights" in (tmp_path / "ema" / "README.md").read_text()


def test_an_ema_checkpointed_in_the_older_format_still_exports(lora_run, tmp_path):
    from peft import PeftModel

    run, config = lora_run
    old = tmp_path / "old"
    shutil.copytree(run, old)
    checkpoint = torch.load(step_file(old, 4), weights_only=True)
    anchor = checkpoint["method"]["ema"]  # Elastic Reset's own format, before it was an anchor's preset
    checkpoint["method"]["ema"] = {"names": anchor["names"], "ema": anchor["copies"]["ema"],
                                   "init": anchor["copies"]["init"], "num_steps": anchor["num_steps"],
                                   "num_resets": anchor["num_pulls"], "decay": anchor["decay"],
                                   "mode": anchor["name"], "reset_every": anchor["trigger"]["n"]}
    torch.save(checkpoint, step_file(old, 4))
    export_run(old, tmp_path / "ema", ema=True)
    loaded = dict(PeftModel.from_pretrained(_base(config), tmp_path / "ema").named_parameters())
    assert all(torch.equal(loaded[n], t) for n, t in zip(anchor["names"], anchor["copies"]["ema"]))


def test_an_ema_exported_after_a_final_reset_is_said_to_be_the_initial_weights(lora_run, tmp_path):
    import warnings

    from elastic_reset.rl.export import EMAIsInitialWarning

    run, _ = lora_run
    with warnings.catch_warnings():
        warnings.simplefilter("error", EMAIsInitialWarning)  # step 4 is no reset step here: no warning
        export_run(run, tmp_path / "ema", ema=True)
    assert "initial weights" not in (tmp_path / "ema" / "README.md").read_text()
    ended_on_reset = tmp_path / "run"
    RLTrainer(run_config(LORA, "method.reset_every=2"), ended_on_reset).train()
    with pytest.warns(EMAIsInitialWarning, match="the policy itself: export it without --ema"):
        export_run(ended_on_reset, tmp_path / "theta0", ema=True)
    assert "This EMA equals the initial weights θ0 exactly" in (tmp_path / "theta0" / "README.md").read_text()
    saved = torch.load(step_file(ended_on_reset, 4), weights_only=True)["method"]["ema"]
    assert all(torch.equal(e, i) for e, i in zip(saved["copies"]["ema"], saved["copies"]["init"]))


def test_full_model_export_and_the_byte_tokenizer_round_trip(full_run, tmp_path):
    run, config = full_run
    expected = _policy_at(config, run, 4)
    export_run(run, tmp_path / "full", step=4)
    for folder in (run / "final", tmp_path / "full"):
        loaded = AutoModelForCausalLM.from_pretrained(folder)
        assert all(p.dtype == torch.float32 for p in loaded.parameters())
        _assert_same_logits(loaded, expected)
    tokenizer, original = AutoTokenizer.from_pretrained(tmp_path / "full"), byte_tokenizer()
    text = "Élastic reset: ça marche ✓ 🙂"
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
    assert tokenizer.decode(original(text)["input_ids"]) == text
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "padding_side"):
        assert getattr(tokenizer, key) == getattr(original, key), key


def test_a_step_never_saved_is_one_line_naming_the_saved_steps(lora_run, tmp_path, capsys):
    run, _ = lora_run
    _one_line_error(capsys, ["export", str(run), "--step", "3", "--out", str(tmp_path / "x")],
                    "--step 3", "steps saved are: 2, 4")
    assert not (tmp_path / "x").exists()


def test_a_damaged_or_planted_step_is_one_line_and_nothing_runs(lora_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(lora_run[0], run)
    step_file(run, 2).write_bytes(b"torn")
    _one_line_error(capsys, ["export", str(run), "--step", "2", "--out", str(tmp_path / "x")],
                    "step_0000002.pt: does not load")
    marker = tmp_path / "ran"
    torch.save({"step": 4, "x": _Planted(str(marker))}, step_file(run, 4))
    _one_line_error(capsys, ["export", str(run), "--step", "4", "--out", str(tmp_path / "x")],
                    "step_0000004.pt: does not load")
    assert not marker.exists() and not (tmp_path / "x").exists()


class _Planted:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_ema_of_a_method_without_one_is_one_line(full_run, tmp_path, capsys):
    run, _ = full_run
    _one_line_error(capsys, ["export", str(run), "--ema", "--out", str(tmp_path / "x")], "--ema", "'kl'",
                    "keeps no EMA")
    assert not (tmp_path / "x").exists()


def test_not_a_run_directory_is_one_line(tmp_path, capsys):
    _one_line_error(capsys, ["export", str(tmp_path), "--out", str(tmp_path / "x")], "config.yaml")


def test_push_to_hub_without_a_token_is_refused_before_any_work(lora_run, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ConfigError, match="no Hugging Face token"):
        export_run(lora_run[0], tmp_path / "x", push_to_hub="someone/model")
    assert not (tmp_path / "x").exists()


class FakeHub:
    """huggingface_hub.HfApi as the push uses it, recording the calls; ``fail`` makes the upload raise."""

    calls: list = []
    fail = False

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, exist_ok=False):
        FakeHub.calls.append(("create_repo", repo_id, self.token))

    def upload_folder(self, repo_id, folder_path, commit_message):
        if FakeHub.fail:
            raise ConnectionError("no route to host\nmore")
        FakeHub.calls.append(("upload_folder", repo_id, sorted(os.listdir(folder_path))))


def test_a_run_pushes_its_final_policy_at_the_end_and_a_failed_push_loses_nothing(tmp_path, monkeypatch):
    import huggingface_hub

    from elastic_reset.errors import ElasticResetError

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ConfigError, match=r"^push_to_hub: no Hugging Face token found"):
        RLTrainer(run_config("steps=1", "push_to_hub=me/policy"), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()  # refused before any work

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "tok")
    FakeHub.calls, FakeHub.fail = [], False
    RLTrainer(run_config("steps=1", "push_to_hub=me/policy"), tmp_path / "run").train()
    final = sorted(os.listdir(tmp_path / "run" / "final"))
    assert FakeHub.calls == [("create_repo", "me/policy", "tok"), ("upload_folder", "me/policy", final)]
    assert "README.md" in final

    FakeHub.fail = True
    with pytest.raises(ElasticResetError, match=r"^push_to_hub: the upload to me/policy failed \(no route to host\);"
                                                r" the run is complete and its policy is in .*final"):
        RLTrainer(run_config("steps=1", "push_to_hub=me/policy"), tmp_path / "offline").train()
    assert (tmp_path / "offline" / "final" / "README.md").is_file()
    assert [r["step"] for r in read_metrics(tmp_path / "offline" / "metrics.jsonl") if "reward" in r] == [1]


def test_the_card_names_the_base_model_on_the_hub():
    config = config_from_dict(yaml.safe_load(TINY.read_text()), ["model.name=smollm2", LORA])
    card = model_card(None, config, 10)
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert "No evaluation was logged" in card and "decay" in card


def test_a_run_that_stops_early_writes_no_final_folder(tmp_path):
    trainer = RLTrainer(run_config(), tmp_path / "run")
    step = trainer.train_step

    def interrupted():
        if trainer.step == 2:
            raise KeyboardInterrupt
        return step()

    trainer.train_step = interrupted
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert not (tmp_path / "run" / "final").exists() and (tmp_path / "run" / "checkpoints").is_dir()


def test_a_smollm2_card_names_the_dequantised_wheel_weights_it_trained_from():
    from elastic_reset.rl.export import model_card

    adapter = model_card(None, run_config("model.name=smollm2", LORA), 4)
    assert "`SmolLM2-135M-Instruct.Q4_1.gguf` dequantised to fp32" in adapter and "export with `--merge`" in adapter
    merged = model_card(None, run_config("model.name=smollm2", LORA), 4, merge=True)
    assert "Q4_1.gguf" in merged and "--merge" not in merged.split("## Method")[0]
    assert "Q4_1" not in model_card(None, run_config(), 4)
