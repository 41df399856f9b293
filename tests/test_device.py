"""Where the engine runs: the device setting, autocast per device, generators on the model's
device, the EMA's placement, and a checkpoint's device. The CPU half runs everywhere; the CUDA half (marked
``cuda``) runs only where PyTorch sees a GPU, and is what a GPU session runs first:
``pytest -m cuda tests/test_device.py``."""

from __future__ import annotations

import pytest
import torch

from elastic_reset.core import ElasticReset
from elastic_reset.io import read_metrics
from elastic_reset.lm import device as lm_device
from elastic_reset.lm import scoring
from elastic_reset.lm.device import resolve_device
from elastic_reset.rewards import classifier
from elastic_reset.rl import trainer as trainer_module
from elastic_reset.rl.checkpoint import load_latest
from elastic_reset.rl.config import ConfigError
from elastic_reset.rl.trainer import RLTrainer
from helpers import tiny_config, trainable, without_times



# ------------------------------------------------------------------------------------------- on every machine
def test_auto_device_is_cuda_only_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")  # the reward classifier's default
    with pytest.raises(ConfigError, match="model.device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert scoring.resolve_device is resolve_device  # where the engine imports it from


def test_a_malformed_device_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="model.device"):
        tiny_config("model.device=gpu")


def test_auto_autocast_is_bf16_on_a_gpu_and_follows_the_cpu_flags_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert lm_device.autocast_dtype("auto", "cuda") is torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert lm_device.autocast_dtype("auto", "cpu") is None  # AVX2 only: bf16 is emulated, fp32 is faster
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert lm_device.autocast_dtype("auto", "cpu") is torch.bfloat16
    assert lm_device.autocast_dtype("none", "cuda") is None


def test_one_bf16_detection_decides_for_the_engine_and_the_reward_classifier(monkeypatch):
    for native in (False, True):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        assert lm_device.native_bf16("cpu") is native
        assert (lm_device.autocast_dtype("auto", "cpu") is torch.bfloat16) is native
        assert trainer_module.autocast_dtype is lm_device.autocast_dtype  # the engine asks the same function
        assert isinstance(classifier._autocast(torch.device("cpu"), True), torch.autocast) is native
        assert not isinstance(classifier._autocast(torch.device("cpu"), False), torch.autocast)


@pytest.mark.parametrize("device,where", [
    ("cpu", "cpu"), ("cpu", "model"),
    pytest.param("cuda", "model", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")])])
def test_ema_device_setting_places_the_ema(tmp_path, device, where):
    trainer = RLTrainer(tiny_config(f"model.device={device}", f"method.ema_device={where}"), tmp_path / "run")
    expected = device if where == "model" else "cpu"
    assert trainer.generator.device.type == device
    assert trainer.method.ema.device.type == expected
    assert all(t.device.type == expected for t in trainer.method.ema.ema)


def test_a_checkpoint_from_another_device_is_refused_with_the_fix(tmp_path):
    trainer = RLTrainer(tiny_config("model.device=cpu", "checkpoint_every=1", "steps=1"), tmp_path / "run")
    trainer.train()
    _, state = load_latest(tmp_path / "run")
    assert state["generator_device"] == "cpu"
    state["generator_device"] = "cuda"
    resumed = RLTrainer(tiny_config("model.device=cpu", "checkpoint_every=1", "steps=1"), tmp_path / "other")
    with pytest.raises(ConfigError, match="model.device=cuda"):
        resumed.load_state_dict(state)


def test_a_run_with_static_decoding_trains_as_the_default_run_does(tmp_path):
    """``sampling.cuda_graphs``: off a GPU the same static steps run eagerly; the run samples what the default does
    (its log-probs agree to rounding), so its records agree too."""
    from elastic_reset.lm.static_decoding import _STATES

    default = without_times(RLTrainer(tiny_config(), tmp_path / "a").train())
    trainer = RLTrainer(tiny_config("sampling.cuda_graphs=true"), tmp_path / "b")
    static = without_times(trainer.train())
    assert trainer.model in _STATES  # its rollouts went through the static steps
    assert [r.keys() for r in static] == [r.keys() for r in default]
    for a, b in zip(default, static):
        assert a["reward"] == b["reward"] and all(b[k] == pytest.approx(v, abs=1e-4) for k, v in a.items())


# ------------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_the_engine_trains_on_cuda_with_the_ema_pinned_on_the_cpu(tmp_path):
    trainer = RLTrainer(tiny_config("model.device=cuda", "steps=6", "method.reset_every=3"), tmp_path / "run")
    before = trainable(trainer)
    records = trainer.train()
    assert trainer.device.type == "cuda" and next(trainer.model.parameters()).is_cuda
    assert trainer.method.ema.device.type == "cpu" and trainer.method.ema.ema[0].is_pinned()
    assert [r["step"] for r in records if "reset" in r] == [3, 6]
    # The last reset set θ to the EMA of its iteration and the EMA to θ0.
    assert all(torch.equal(e.cpu(), before[n].cpu()) for n, e in trainer.method.ema.ema_state().items())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_the_engine_trains_on_cuda_through_captured_graphs(tmp_path):
    settings = ("model.device=cuda", "steps=4", "eval.every=2")
    records = RLTrainer(tiny_config(*settings), tmp_path / "a").train()
    assert all(r["memory/gpu_peak_gib"] > 0 for r in records if "reward" in r)  # what compare --jobs sizes by
    default = without_times(records)
    graphs = without_times(RLTrainer(tiny_config(*settings, "sampling.cuda_graphs=true"), tmp_path / "b").train())
    for a, b in zip(default, graphs):
        assert all(b[k] == pytest.approx(v, abs=1e-3) for k, v in a.items())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_activation_checkpointing_on_cuda_changes_no_number_with_graph_decoding(tmp_path):
    settings = ("model.device=cuda", "steps=3", "model.lora={r: 4, alpha: 8}", "sampling.cuda_graphs=true",
                "model.autocast=bf16")
    kept = without_times(RLTrainer(tiny_config(*settings), tmp_path / "kept").train())
    recomputed = RLTrainer(tiny_config(*settings, "model.activation_checkpointing=true"), tmp_path / "recomputed")
    assert without_times(recomputed.train()) == kept


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_resume_on_cuda_is_exact(tmp_path):
    RLTrainer(tiny_config("model.device=cuda", "steps=4", "checkpoint_every=2"), tmp_path / "full").train()
    RLTrainer(tiny_config("model.device=cuda", "steps=2", "checkpoint_every=2"), tmp_path / "cut").train()
    resumed = RLTrainer(tiny_config("model.device=cuda", "steps=4", "checkpoint_every=2"), tmp_path / "cut",
                        resume=True)
    resumed.train()
    assert (without_times(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
            == without_times(read_metrics(tmp_path / "full" / "metrics.jsonl")))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_pinned_ema_on_the_cpu_matches_an_ema_kept_on_the_gpu():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).cuda()
    on_cpu = ElasticReset(model, decay=0.9, reset_every=3, device="cpu")
    on_gpu = ElasticReset(model, decay=0.9, reset_every=3, device="cuda")
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        on_gpu.update()
        event = on_cpu.step()  # updates, then resets at step 3: θ ← θ̄ (copied from pinned memory)
    assert event is not None
    assert all(torch.allclose(a, b.cpu()) for a, b in zip(on_cpu.ema, on_gpu.init))  # θ̄ ← θ0 after the reset
    assert all(torch.allclose(p.cpu(), e.cpu()) for p, e in zip(model.parameters(), on_gpu.ema))


def test_a_run_records_the_instruction_set_its_kernels_use_and_the_caps_set_on_it(monkeypatch):
    for name in lm_device.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    machine = lm_device.describe_machine("cpu")
    assert machine["isa_caps"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
