"""ElasticResetCallback inside TRL's GRPOTrainer / RLOOTrainer and a plain HF Trainer: resets, logs, checkpoints,
resume.

The GRPO runs are checked against an independent reference: callbacks placed before and after ours record the
weights after each optimizer step (before the reset) and after our step end, and the EMA is recomputed by hand.
"""

import copy
import logging
import os
import re
import shutil
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download, nor send TRL's telemetry ping
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

from elastic_reset.integrations import trl as integration
from elastic_reset.integrations.trl import EMA_DIR, STATE_FILE, ElasticResetCallback, ReferenceSyncCallback
from elastic_reset.lm.lora import add_lora
from elastic_reset.models import byte_tokenizer, tiny_causal_lm

pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")


def _prompts(prompts):
    """TRL's trainers take a `datasets.Dataset` (trl requires datasets; the plain-Trainer tests below need neither)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompts})


DECAY = 0.9  # far from 1, so that a reset moves the weights well beyond float noise
RESET_EVERY = 2
STEPS = 5  # resets at steps 2 and 4
SAVE_STEPS = 3  # checkpoint-3 lies mid-period: its EMA is neither θ0 nor the policy


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run faster on one thread, and far faster when other processes hold the cores (2 threads
    contending for them made a GRPO run ~20x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


class Recorder(TrainerCallback):
    """Records the trainable weights when training begins and at each step end, plus the logs it is shown; with
    ``callback``, also that callback's EMA at each step end and its ElasticReset state when training begins."""

    def __init__(self, callback: ElasticResetCallback | None = None):
        self.callback = callback
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.ema: dict[int, dict[str, torch.Tensor]] = {}
        self.logs: list[dict] = []
        self.state_at_begin = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = _trainable(model)
        if self.callback is not None and self.callback.elastic_reset is not None:
            self.state_at_begin = copy.deepcopy(self.callback.elastic_reset.state_dict())

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = _trainable(model)
        if self.callback is not None:
            er = self.callback.elastic_reset
            self.ema[state.global_step] = {n: t.clone() for n, t in zip(er.names, er.ema)}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def _assert_weights(actual: dict, expected: dict, exact: bool = False) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        if exact:
            assert torch.equal(actual[name], expected[name]), name
        else:
            torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def _distance(a: dict, b: dict) -> float:
    return sum(float((a[n] - b[n]).double().pow(2).sum()) for n in a) ** 0.5


# ---------------------------------------------------------------------------------------------------------- GRPO
def _byte_mean_reward(completions, **kwargs):
    """Mean byte value: varies within every group, so GRPO's advantages (and gradients) are never zero."""
    return [sum(c.encode()) / (255.0 * max(len(c.encode()), 1)) for c in completions]


def _grpo(output_dir, callbacks):
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, seed=0, learning_rate=1e-2,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=8, max_steps=STEPS,
        logging_steps=1, save_steps=SAVE_STEPS, report_to="none", disable_tqdm=True, gradient_checkpointing=False,
    )
    dataset = _prompts(["hello", "abc", "xyz", "qq"] * 4)
    return trl.GRPOTrainer(model=tiny_causal_lm(hidden=64, layers=2), reward_funcs=_byte_mean_reward, args=args,
                           train_dataset=dataset, processing_class=byte_tokenizer(), callbacks=callbacks)


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    """One uninterrupted 5-step GRPO run with checkpoints, then a fresh trainer resumed from checkpoint-3."""
    out = tmp_path_factory.mktemp("grpo")
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    before, after = Recorder(), Recorder(callback)  # before: post-optimizer weights; after: post-reset ones
    trainer = _grpo(out, [before, callback, after])
    trainer.train()

    resumed_callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    probe = Recorder(resumed_callback)
    resumed = _grpo(out / "resumed", [resumed_callback, probe])
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{SAVE_STEPS}"))
    return SimpleNamespace(out=out, trainer=trainer, callback=callback, before=before, after=after,
                           resumed=resumed, resumed_callback=resumed_callback, probe=probe)


def _hand_computed(before: Recorder):
    """θ̄ and θ after each step from the recorded post-optimizer weights (paper §3, elastic mode)."""
    theta0 = before.weights[0]
    ema, expected_theta, expected_ema = dict(theta0), {}, {}
    for step in range(1, STEPS + 1):
        theta = before.weights[step]
        ema = {n: torch.lerp(ema[n], theta[n], 1 - DECAY) for n in ema}  # θ̄ ← (1−η)·θ + η·θ̄
        if step % RESET_EVERY == 0:
            theta, ema = ema, dict(theta0)  # θ ← θ̄, then θ̄ ← θ0
        expected_theta[step], expected_ema[step] = theta, ema
    return expected_theta, expected_ema


def test_grpo_reset_sets_the_policy_to_the_hand_computed_ema(grpo):
    expected_theta, expected_ema = _hand_computed(grpo.before)
    for step in range(1, STEPS + 1):
        _assert_weights(grpo.after.weights[step], expected_theta[step])
        _assert_weights(grpo.after.ema[step], expected_ema[step])
    # Steps without a reset leave the optimizer's weights alone; a reset moves them far beyond the tolerance.
    _assert_weights(grpo.after.weights[1], grpo.before.weights[1], exact=True)
    _assert_weights(grpo.after.weights[3], grpo.before.weights[3], exact=True)
    assert _distance(grpo.before.weights[2], grpo.after.weights[2]) > 0.1
    assert _distance(grpo.before.weights[1], grpo.before.weights[0]) > 0.1  # GRPO did train
    # After a reset the EMA restarts from θ0 (elastic mode).
    _assert_weights(grpo.after.ema[2], grpo.before.weights[0], exact=True)
    er = grpo.callback.elastic_reset
    assert (er.num_steps, er.num_resets) == (STEPS, 2) == (grpo.trainer.state.global_step, 2)
    assert [(e.step, e.index, e.mode) for e in grpo.callback.events] == [(2, 1, "elastic"), (4, 2, "elastic")]
    assert grpo.callback.events[0].distance == pytest.approx(
        _distance(grpo.before.weights[2], expected_theta[2]), rel=1e-4)


def test_grpo_logs_resets_and_distance(grpo):
    expected_theta, expected_ema = _hand_computed(grpo.before)
    step_logs = [h for h in grpo.trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in step_logs] == list(range(1, STEPS + 1))
    assert [h["elastic_reset/resets"] for h in step_logs] == [0, 1, 1, 2, 2]
    for h in step_logs:
        s = h["step"]
        assert h["elastic_reset/distance"] == pytest.approx(_distance(expected_theta[s], expected_ema[s]), rel=1e-4)
    # Callbacks after ours (console, progress bar, ...) see the metrics in `logs` too.
    seen = [log for log in grpo.after.logs if "loss" in log]
    assert [log["elastic_reset/resets"] for log in seen] == [0, 1, 1, 2, 2]
    assert all("elastic_reset/distance" in log for log in seen)


def test_grpo_resume_continues_the_saved_state_exactly(grpo):
    saved = torch.load(grpo.out / f"checkpoint-{SAVE_STEPS}" / STATE_FILE, weights_only=True)
    assert saved["global_step"] == SAVE_STEPS
    assert not list(grpo.out.glob(f"checkpoint-*/.{STATE_FILE}.*"))  # no temporary file left behind
    loaded, stored = grpo.probe.state_at_begin, saved["elastic_reset"]
    assert (loaded["num_steps"], loaded["num_pulls"]) == (stored["num_steps"], stored["num_pulls"]) == (3, 1)
    for key in ("ema", "init"):
        assert all(torch.equal(a, b) for a, b in zip(loaded["copies"][key], stored["copies"][key])), key
    # θ0 is the run's initial weights, not the weights the resumed model starts from.
    assert all(torch.equal(a, grpo.before.weights[0][n]) for n, a in zip(loaded["names"], loaded["copies"]["init"]))
    assert _distance(grpo.probe.weights[SAVE_STEPS], grpo.before.weights[0]) > 0.1
    # GRPO's sampling is restored with the RNG state, so the resumed run is bit-for-bit the uninterrupted one.
    _assert_weights(_trainable(grpo.resumed.model), _trainable(grpo.trainer.model), exact=True)
    er, er_resumed = grpo.callback.elastic_reset, grpo.resumed_callback.elastic_reset
    assert (er_resumed.num_steps, er_resumed.num_resets) == (er.num_steps, er.num_resets)
    assert all(torch.equal(a, b) for a, b in zip(er_resumed.ema, er.ema))
    assert grpo.resumed_callback.events == grpo.callback.events


def test_rloo_with_lora_resets_the_adapters_only(tmp_path):
    trl = pytest.importorskip("trl")
    peft = pytest.importorskip("peft")
    model = add_lora(tiny_causal_lm(hidden=64, layers=2), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    args = trl.RLOOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, seed=0, learning_rate=1e-2, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=8, max_steps=3, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, gradient_checkpointing=False,
        beta=0.0,  # with beta > 0, RLOOTrainer reloads a reference model from config._name_or_path: none here
    )
    trainer = trl.RLOOTrainer(model=model, reward_funcs=_byte_mean_reward, args=args, processing_class=byte_tokenizer(),
                              train_dataset=_prompts(["hello", "abc"] * 4), callbacks=[callback])
    trainer.train()
    er = callback.elastic_reset
    assert len(er.names) == 8 and all(".lora_A." in n or ".lora_B." in n for n in er.names)
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if n in frozen)
    assert [(e.step, e.index) for e in callback.events] == [(2, 1)]
    step_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["elastic_reset/resets"] for h in step_logs] == [0, 1, 1]
    # The final EMA of the adapters, as a peft adapter folder beside the tokenizer.
    saved = peft.PeftModel.from_pretrained(tiny_causal_lm(hidden=64, layers=2), tmp_path / EMA_DIR)
    params = dict(saved.named_parameters())
    assert all(torch.equal(params[n], e) for n, e in zip(er.names, er.ema))
    assert AutoTokenizer.from_pretrained(tmp_path / EMA_DIR).eos_token_id == byte_tokenizer().eos_token_id


def _lora_grpo(output_dir, callbacks, steps=4, model=None, save_steps=None, report_to="none"):
    trl = pytest.importorskip("trl")
    peft = pytest.importorskip("peft")
    model = model or add_lora(tiny_causal_lm(hidden=64, layers=2), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    args = trl.GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, seed=0, learning_rate=1e-2,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=8, max_steps=steps,
        logging_steps=1, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        report_to=report_to, disable_tqdm=True, gradient_checkpointing=False,
        beta=0.1,  # a KL reference to sync: with a PeftModel TRL keeps it as a frozen "ref" adapter
    )
    return trl.GRPOTrainer(model=model, reward_funcs=_byte_mean_reward, args=args, processing_class=byte_tokenizer(),
                           train_dataset=_prompts(["hello", "abc", "xyz", "qq"] * 4),
                           callbacks=callbacks)


def test_grpo_with_lora_syncs_its_reference_adapter_by_the_tr_dpo_rule(tmp_path):
    recorder = Recorder()  # before the callback: the adapters after each optimizer step
    callback = ReferenceSyncCallback("ref_sync", every=2, alpha=0.5)
    trainer = _lora_grpo(tmp_path, [recorder, callback])
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".default." in n}
    trainer.train()
    ref = {n: start[n] for n in start}
    for step in (2, 4):  # ref <- alpha * theta + (1 - alpha) * ref, every 2 steps
        ref = {n: 0.5 * recorder.weights[step][n] + 0.5 * ref[n] for n in ref}
    model = trainer.model
    got = {n: model.get_parameter(n.replace(".default.", ".ref.")).detach() for n in ref}
    _assert_weights(got, ref)
    assert [e.step for e in callback.events] == [2, 4] and len(callback.anchor.names) == 8
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".ref." in n)
    assert [h["anchor/pulls"] for h in trainer.state.log_history if "loss" in h] == [0, 1, 1, 2]


def test_a_hard_reference_reset_every_step_zeroes_the_kl_trl_logs(tmp_path):
    reset = _lora_grpo(tmp_path / "reset", [ReferenceSyncCallback("ref_reset", every=1)], steps=3)
    reset.train()
    plain = _lora_grpo(tmp_path / "plain", [], steps=3)
    plain.train()
    kl = [[h["kl"] for h in t.state.log_history if "kl" in h] for t in (reset, plain)]
    # Step 1's reference is the starting adapter either way; from step 2 on, the reset one is the policy itself.
    assert all(abs(k) < 1e-6 for k in kl[0][1:]) and all(abs(k) > 1e-6 for k in kl[1][1:])


def test_reference_sync_pulls_reach_the_report_to_trackers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = ReferenceSyncCallback("ref_sync", every=2, alpha=0.5)
    trainer = _lora_grpo(tmp_path, [callback], report_to="tensorboard")  # a plain callbacks=[...]
    trainer.train()
    assert trainer.callback_handler.callbacks[0].owner is callback
    events = [EventAccumulator(str(f.parent)).Reload() for f in tmp_path.rglob("events.out.tfevents.*")]
    pulls = {s.step: s.value for ea in events if "train/anchor/pulls" in ea.Tags()["scalars"]
             for s in ea.Scalars("train/anchor/pulls")}
    assert {step: pulls[step] for step in (1, 2, 3)} == {1: 0.0, 2: 1.0, 3: 1.0}


def test_reference_sync_resumes_with_the_reference_it_had(tmp_path):
    def ref(trainer):
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".ref." in n}

    full_callback, resumed_callback = (ReferenceSyncCallback("ref_sync", every=2, alpha=0.5) for _ in range(2))
    full = _lora_grpo(tmp_path, [full_callback], save_steps=2)
    full.train()
    assert (tmp_path / "checkpoint-2" / integration.ANCHOR_FILE).is_file()
    resumed = _lora_grpo(tmp_path / "resumed", [resumed_callback])
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    # The pull at step 4 mixed into the reference of before the interruption (after step 2's pull), not a copy of
    # the resumed adapter; the resumed run's events include the pull made before it.
    _assert_weights(ref(resumed), ref(full))
    assert [e.step for e in resumed_callback.events] == [2, 4] and resumed_callback.events == full_callback.events
    (tmp_path / "checkpoint-2" / integration.ANCHOR_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="no reference state to resume from"):
        _lora_grpo(tmp_path / "again", [ReferenceSyncCallback("ref_sync", every=3)]).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_reference_sync_refuses_a_trainer_without_a_reference(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        ReferenceSyncCallback("elastic_reset")
    with pytest.raises(ValueError, match=r"weight \(α, η\)"):
        ReferenceSyncCallback("ref_sync", alpha=2.0)
    with pytest.raises(ValueError, match="no reference model"):
        integration._policy_and_reference(tiny_causal_lm(hidden=64, layers=2), SimpleNamespace(ref_model=None))


# ---------------------------------------------------------------------------------------------- plain HF Trainer
def _lm_trainer(output_dir, callbacks, max_steps=4, report_to="none"):
    """A tiny causal LM on fixed byte sequences: 2 micro-batches per optimizer step, checkpoints every 2 steps."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 259, (16, 12), generator=gen).tolist()
    args = TrainingArguments(
        output_dir=str(output_dir), use_cpu=True, seed=0, learning_rate=1e-2, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=max_steps, logging_steps=1, save_steps=2, report_to=report_to,
        disable_tqdm=True,
    )
    return Trainer(model=tiny_causal_lm(hidden=64, layers=2), args=args, callbacks=callbacks,
                   train_dataset=[{"input_ids": x, "labels": x} for x in ids])  # no `datasets` needed


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    callback, spy = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY), Recorder()
    trainer = _lm_trainer(out, [spy, callback])
    callback.attach(trainer)  # now first: `spy`, passed before it, sees its metrics, as reporting integrations do
    trainer.train()
    return SimpleNamespace(out=out, trainer=trainer, callback=callback, spy=spy)


def test_trainer_steps_once_per_optimizer_step_and_attach_reaches_earlier_callbacks(lm_run):
    er = lm_run.callback.elastic_reset
    assert lm_run.trainer.state.global_step == 4
    assert (er.num_steps, er.num_resets) == (4, 2)  # 8 micro-batches, 4 optimizer steps
    assert lm_run.trainer.callback_handler.callbacks[0] is lm_run.callback
    seen = [log for log in lm_run.spy.logs if "loss" in log]
    assert [log["elastic_reset/resets"] for log in seen] == [0, 1, 1, 2]
    assert all("elastic_reset/distance" in h for h in lm_run.trainer.state.log_history if "loss" in h)


def test_the_final_ema_is_saved_with_save_pretrained(lm_run):
    er = lm_run.callback.elastic_reset
    saved = dict(AutoModelForCausalLM.from_pretrained(lm_run.out / EMA_DIR).named_parameters())
    assert set(er.names) <= set(saved)
    assert all(torch.equal(saved[n], e) for n, e in zip(er.names, er.ema))
    # The trainer's model keeps the policy's own weights, which differ from the EMA after step 4's reset.
    assert er.distance() > 0.1
    assert not [p for p in lm_run.out.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    # Step 4 was a reset: the EMA is θ0, and the folder says so and where the pre-reset average went.
    assert er.ema_is_initial() and "the initial weights" in (lm_run.out / EMA_DIR / "README.md").read_text()


def test_an_ema_saved_between_resets_has_no_such_note(tmp_path):
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    _lm_trainer(tmp_path, [callback], max_steps=3).train()
    assert not callback.elastic_reset.ema_is_initial() and not (tmp_path / EMA_DIR / "README.md").exists()


def test_save_ema_false_writes_no_folder(tmp_path):
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY, save_ema=False)
    _lm_trainer(tmp_path, [callback], max_steps=1).train()
    assert callback.elastic_reset.num_steps == 1
    assert not (tmp_path / EMA_DIR).exists()


def test_resume_from_a_folder_outside_output_dir(lm_run, tmp_path):
    # transformers does not pass callbacks the folder train() resumes from; the callback still finds it.
    elsewhere = tmp_path / "elsewhere" / "checkpoint-2"
    shutil.copytree(lm_run.out / "checkpoint-2", elsewhere)
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    trainer = _lm_trainer(tmp_path / "fresh", [callback])
    trainer.train(resume_from_checkpoint=str(elsewhere))
    # A deterministic task: the resumed run is bit-for-bit the uninterrupted one.
    _assert_weights(_trainable(trainer.model), _trainable(lm_run.trainer.model), exact=True)
    er, er_full = callback.elastic_reset, lm_run.callback.elastic_reset
    assert (er.num_steps, er.num_resets) == (er_full.num_steps, er_full.num_resets) == (4, 2)
    assert all(torch.equal(a, b) for a, b in zip(er.ema, er_full.ema))
    assert all(torch.equal(a, b) for a, b in zip(er.init, er_full.init))
    assert callback.events == lm_run.callback.events
    assert (tmp_path / "fresh" / "checkpoint-4" / STATE_FILE).is_file()


def test_resume_true_without_the_call_stack_looks_in_output_dir(lm_run, tmp_path, monkeypatch):
    shutil.copytree(lm_run.out, tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "checkpoint-4")  # so that resume_from_checkpoint=True picks checkpoint-2
    monkeypatch.setattr(integration, "_resumed_checkpoint", lambda: None)  # as if transformers' internals moved
    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY)
    trainer = _lm_trainer(tmp_path, [callback])
    trainer.train(resume_from_checkpoint=True)
    _assert_weights(_trainable(trainer.model), _trainable(lm_run.trainer.model), exact=True)
    assert callback.events == lm_run.callback.events


def test_resume_without_or_with_a_wrong_state_file_fails_clearly(lm_run, tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(lm_run.out / "checkpoint-2", checkpoint)

    def resume(**kwargs):
        _lm_trainer(tmp_path / "out", [ElasticResetCallback(reset_every=RESET_EVERY, **kwargs)]).train(
            resume_from_checkpoint=str(checkpoint))

    # The state file of another checkpoint: refused by its step...
    with pytest.raises(ValueError, match="saved at step 4, but training resumes at step 2"):
        resume(resume_from=lm_run.out / "checkpoint-4")
    # ... or, at the same step, by the weights it was saved with.
    state = torch.load(checkpoint / STATE_FILE, weights_only=True)
    state["elastic_reset"]["copies"]["ema"][0] += 0.5
    torch.save(state, checkpoint / STATE_FILE)
    with pytest.raises(ValueError, match="does not belong with the weights the trainer resumed from"):
        resume()
    # No file: the error names it.
    (checkpoint / STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{checkpoint / STATE_FILE}: no Elastic Reset state")):
        resume()


def test_constructor_validates_like_elastic_reset():
    with pytest.raises(ValueError, match="reset_every"):
        ElasticResetCallback(mode="elastic")
    with pytest.raises(ValueError, match="decay"):
        ElasticResetCallback(decay=1.0, reset_every=2)


def test_plain_callbacks_reach_the_report_to_trackers_and_resets_are_visible(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = ElasticResetCallback(decay=DECAY, reset_every=RESET_EVERY, save_ema=False)
    trainer = _lm_trainer(tmp_path, [callback], report_to="tensorboard")  # no attach()
    with caplog.at_level(logging.WARNING):  # the default level
        trainer.train()
    first = trainer.callback_handler.callbacks[0]
    assert first is not callback and first.owner is callback  # the metrics go first; the callback stays where it was
    events = [EventAccumulator(str(f.parent)).Reload() for f in tmp_path.rglob("events.out.tfevents.*")]
    resets = [s for ea in events if "train/elastic_reset/resets" in ea.Tags()["scalars"]
              for s in ea.Scalars("train/elastic_reset/resets")]
    assert {s.step: s.value for s in resets} == {1: 0.0, 2: 1.0, 3: 1.0, 4: 2.0}  # step 4 twice: the run summary
    assert sum("Elastic Reset #" in r.getMessage() for r in caplog.records) == 2
