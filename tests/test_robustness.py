"""Nothing lost, nothing silent: every run directory that is not a clean run either resumes from what is intact,
saying so, or stops with an error naming the file; set-up errors leave no run; a non-finite update stops the run;
CLI errors are one line. One test per case, on the tiny config (a few steps each)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from elastic_reset.cli import main
from elastic_reset.errors import ConfigError, NonFiniteError, ReportError, RunFileError, RunRecoveryWarning
from elastic_reset.io import read_metrics, write_pointer
from elastic_reset.rl import ops
from elastic_reset.rl.checkpoint import list_checkpoints, load_latest
from elastic_reset.rl.trainer import RLTrainer
from helpers import RUN_SETTINGS as SETTINGS
from helpers import REHEARSAL, TINY, step_file, without_times
from helpers import run_config as cfg

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4  # helpers.RUN_SETTINGS' steps




def resume(run: Path, *overrides: str) -> list[dict]:
    """Resume ``run`` to the end, returning its metrics; RunRecoveryWarnings are left to the caller."""
    RLTrainer(cfg(*overrides), run, resume=True).train()
    return read_metrics(run / "metrics.jsonl")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def cli(*args, env=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "elastic_reset.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env)


# ------------------------------------------------------------------------------------------ lost pointer
def test_resume_without_latest_pointer_continues_from_newest_checkpoint(finished, run):
    # A run killed after step 2's checkpoint whose pointer is gone: it continues from step_0000002.pt.
    step_file(run, 4).unlink()
    (run / "checkpoints" / "latest").unlink()
    with pytest.warns(RunRecoveryWarning, match="latest"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_resume_with_dangling_latest_pointer_continues_from_newest_checkpoint(finished, run):
    step_file(run, 4).unlink()  # `latest` still names it
    with pytest.warns(RunRecoveryWarning, match="latest"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_finished_run_without_latest_pointer_resumes_from_its_last_checkpoint(run):
    (run / "checkpoints" / "latest").unlink()
    with pytest.warns(RunRecoveryWarning, match="step_0000004.pt"):
        trainer = RLTrainer(cfg(), run, resume=True)
    assert trainer.step == STEPS


# ------------------------------------------------------------------------------------ damaged checkpoints
def test_garbage_newest_checkpoint_falls_back_to_the_older_one(run):
    step_file(run, 4).write_bytes(step_file(run, 4).read_bytes()[:100])  # torn
    with pytest.warns(RunRecoveryWarning, match="step_0000004.pt"):
        trainer = RLTrainer(cfg(), run, resume=True)
    assert trainer.step == 2


def test_metrics_after_falling_back_are_complete_and_consistent(finished, run):
    step_file(run, 4).write_bytes(b"garbage")
    with pytest.warns(RunRecoveryWarning):
        records = resume(run)
    train_steps = [r["step"] for r in records if "reward" in r]
    eval_steps = [r["step"] for r in records if "eval/reward" in r]
    assert (train_steps, eval_steps) == ([1, 2, 3, 4], [0, 2, 4])
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_all_checkpoints_garbage_is_an_error_naming_the_folder(run):
    for path in list_checkpoints(run):
        path.write_bytes(b"garbage")
    with pytest.warns(RunRecoveryWarning), pytest.raises(RunFileError, match=r"checkpoints: no checkpoint loads"):
        RLTrainer(cfg(), run, resume=True)


def test_all_checkpoints_garbage_leaves_metrics_untouched(run):
    before = (run / "metrics.jsonl").read_bytes()
    for path in list_checkpoints(run):
        path.write_bytes(b"garbage")
    with warnings.catch_warnings(), pytest.raises(RunFileError):
        warnings.simplefilter("ignore")
        RLTrainer(cfg(), run, resume=True)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_lost_checkpoints_folder_is_an_error_naming_it(run):
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(RunFileError, match=r"checkpoints: no checkpoint, but .*metrics\.jsonl has records"):
        RLTrainer(cfg(), run, resume=True)


def test_lost_checkpoints_folder_never_empties_metrics(run):
    before = (run / "metrics.jsonl").read_bytes()
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(RunFileError):
        RLTrainer(cfg(), run, resume=True)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_run_killed_before_its_first_checkpoint_restarts_saying_so(finished, run):
    # Killed during step 2 (before its checkpoint): only records of steps 0 and 1 and no checkpoint.
    shutil.rmtree(run / "checkpoints")
    kept = [line for line in (run / "metrics.jsonl").read_text().splitlines(keepends=True)
            if yaml.safe_load(line)["step"] < 2]
    (run / "metrics.jsonl").write_text("".join(kept))
    with pytest.warns(RunRecoveryWarning, match="before its first checkpoint"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


# ------------------------------------------------------------------------------------------ metrics.jsonl
def test_missing_metrics_is_an_error_naming_it(run):
    (run / "metrics.jsonl").unlink()
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: missing"):
        RLTrainer(cfg(), run, resume=True)


def test_missing_metrics_leaves_the_checkpoints_unchanged(run):
    before = snapshot(run / "checkpoints")
    (run / "metrics.jsonl").unlink()
    with pytest.raises(RunFileError):
        RLTrainer(cfg(), run, resume=True)
    assert snapshot(run / "checkpoints") == before


def test_damaged_metrics_line_is_an_error_naming_the_line(run):
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"step": 2, "rew\n'
    (run / "metrics.jsonl").write_text("".join(lines))
    with pytest.raises(RunFileError, match=r"metrics\.jsonl:3: "):
        RLTrainer(cfg(), run, resume=True)


def test_torn_last_metrics_line_is_tolerated_on_resume(finished, run):
    # Killed while writing step 4's record, after step 2's checkpoint (step 4's never written).
    step_file(run, 4).unlink()
    write_pointer(run / "checkpoints", step_file(run, 2).name)
    text = (run / "metrics.jsonl").read_text()
    cut = text.index('"step": 4')  # the first record of step 4 (its training record), torn in the middle
    (run / "metrics.jsonl").write_text(text[:cut])
    records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


# ------------------------------------------------------------------------------------------ config.yaml
def test_missing_config_refuses_resume_naming_it(run):
    (run / "config.yaml").unlink()
    with pytest.raises(RunFileError, match=r"config\.yaml: missing"):
        RLTrainer(cfg(), run, resume=True)


def test_missing_config_refuses_a_new_run_in_the_directory(run):
    (run / "config.yaml").unlink()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RLTrainer(cfg(), run)


@pytest.mark.parametrize("damage", [b"algo: [\n  lr: : :\n", b"\xff\xfe\x00\x80garbage", b"- 1\n"],
                         ids=["not-yaml", "binary", "not-a-mapping"])
def test_damaged_config_is_an_error_naming_it(run, damage):
    (run / "config.yaml").write_bytes(damage)
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        RLTrainer(cfg(), run, resume=True)


# ------------------------------------------------------------------------------------------ temp files
def test_stale_temp_files_are_removed_on_resume(run):
    stale = [run / "checkpoints" / ".step_0000006.pt.tmp-abc", run / ".metrics.jsonl.tmp-xyz"]
    for path in stale:
        path.write_bytes(b"half a save")
    with pytest.warns(RunRecoveryWarning, match="temporary file"):
        RLTrainer(cfg(), run, resume=True)
    assert not any(path.exists() for path in stale)


# ------------------------------------------------------------------------------------------ set-up errors
@pytest.mark.parametrize("override", ["task.name=no_such_task", "model.name={tmp}/no-such-model"])
def test_setup_error_leaves_no_run_behind(tmp_path, override):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        RLTrainer(cfg(override.format(tmp=tmp_path)), out)
    assert not out.exists()


def test_setup_error_in_an_empty_directory_leaves_it_empty(tmp_path):
    with pytest.raises(ConfigError, match="task.name"):
        RLTrainer(cfg("task.name=no_such_task"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_corrected_command_succeeds_after_a_setup_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        RLTrainer(cfg("task.name=no_such_task"), out)
    records = RLTrainer(cfg("steps=1"), out).train()  # no --resume needed: nothing was left behind
    assert [r["step"] for r in records if "reward" in r] == [1]


# ------------------------------------------------------------------------------------------ non-finite
def _nan_loss_at_step_3(monkeypatch, trainer):
    original = ops.ppo_policy_loss

    def loss(*args, **kwargs):
        value, stats = original(*args, **kwargs)
        return (value * float("nan") if trainer.step == 2 else value), stats

    monkeypatch.setattr(ops, "ppo_policy_loss", loss)


def test_nan_loss_stops_the_run_naming_the_step(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError, match=r"^step 3: the loss .* is nan"):
        trainer.train()


def test_nan_gradient_stops_the_run_naming_it(tmp_path):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    trainer.trainable_params[0].register_hook(lambda g: g * float("nan") if trainer.step == 2 else g)
    with pytest.raises(NonFiniteError, match=r"^step 3: the gradient norm .* is nan"):
        trainer.train()


def test_nan_loss_keeps_the_last_good_checkpoint_loadable_and_finite(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError):
        trainer.train()
    path, state = load_latest(tmp_path / "run")
    assert state["step"] == 2 and all(torch.isfinite(t).all() for t in state["trainable"].values())


def test_nan_loss_is_never_applied_to_the_weights(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.trainable_params)


# (algo.max_grad_norm=0 / -1 refused naming the key: tests/test_config.py, test_meaningless_setting_is_refused_...)


# ------------------------------------------------------------------------------------------ CLI
def test_pareto_refuses_to_write_over_metrics(run, capsys):
    before = (run / "metrics.jsonl").read_bytes()
    code = main(["pareto", str(run), "--out", str(run / "metrics.jsonl")])
    err = capsys.readouterr().err
    assert (code, err.count("\n"), err.startswith("elastic-reset: error: --out")) == (2, 1, True)
    assert (run / "metrics.jsonl").read_bytes() == before


def _bad_commands(tmp_path: Path) -> dict[str, tuple[list, str]]:
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {
        "task": (["train", TINY, "--out", tmp_path / "a", "--set", "task.name=no_such_task"], "task.name"),
        "model": (["train", TINY, "--out", tmp_path / "b", "--set", f"model.name={tmp_path}/no-model"],
                  "model.name"),
        "pareto": (["pareto", tmp_path / "empty", "--out", tmp_path / "fig.png"], "metrics.jsonl"),
    }


@pytest.mark.parametrize("case", ["task", "model", "pareto"])
def test_cli_error_is_one_line_naming_the_key_or_file(tmp_path, case):
    args, named = _bad_commands(tmp_path)[case]
    result = cli(*args)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("elastic-reset: error:") and named in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("case", ["task", "model", "pareto"])
def test_cli_debug_raises_the_error_itself(tmp_path, case):
    args, named = _bad_commands(tmp_path)[case]
    with pytest.raises((ConfigError, ReportError), match=named):
        main(["--debug", *map(str, args)])


def test_cli_debug_shows_the_traceback(tmp_path):
    args, _ = _bad_commands(tmp_path)["pareto"]
    result = cli("--debug", *args)
    assert result.returncode != 0 and "Traceback" in result.stderr


# ------------------------------------------------------------------------------------------ compare grid
def test_compare_cell_without_latest_pointer_is_resumed_not_retrained(tmp_path):
    from elastic_reset.compare import DONE, plan_grid, train_cell

    (cell,) = plan_grid(TINY, tmp_path, ["kl"], 1, SETTINGS)
    train_cell(cell, log=lambda line: None)
    # Killed after step 2's checkpoint, with the pointer lost.
    (cell.run_dir / DONE).unlink()
    step_file(cell.run_dir, 4).unlink()
    (cell.run_dir / "checkpoints" / "latest").unlink()
    before = [r for r in read_metrics(cell.run_dir / "metrics.jsonl") if r["step"] <= 2]
    with pytest.warns(RunRecoveryWarning):
        action = train_cell(cell, log=lambda line: None)
    after = [r for r in read_metrics(cell.run_dir / "metrics.jsonl") if r["step"] <= 2]
    assert action == "resumed" and after == before  # records up to step 2 kept, timings included: not retrained


# ------------------------------------------------------------------------------------------ refused inputs (CLI)
# A config or command that used to hang, load something else, or end in a traceback: one line naming the file or
# key, exit status 2, and no run directory.
import errno  # noqa: E402 (this section's own import, kept with it)

TINY_TEXT = TINY.read_text()
LINES = TINY_TEXT.splitlines()
TASK_LINE, END_LINE = LINES.index("task:") + 1, len(LINES) + 1  # where an option, and a line added, go
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))  # 9^9 strings
DEEP = "    x: " + "[" * 5000 + "]" * 5000 + "\n"
BAD_CONFIGS = {  # the file's text, --set items, what the one line says
    "alias-bomb": (TINY_TEXT + LAUGHS, [], f"config.yaml, line {END_LINE}: a: YAML anchors and aliases (&a) are not "
                   "allowed"),
    "deep-list": (TINY_TEXT.replace("task:\n", "task:\n  options:\n" + DEEP), [],
                  f"config.yaml, line {TASK_LINE + 2}: task.options: nested deeper than 32 levels"),
    "non-utf8": (TINY_TEXT.encode() + b"# caf\xe9\n", [],
                 f"config.yaml: not UTF-8 text (byte 0xe9 at line {END_LINE})"),
    "octal": (TINY_TEXT.replace("seed: 0\n", "seed: 010\n"), [],
              f"config.yaml, line {LINES.index('seed: 0') + 1}: seed: 010 has a leading zero"),
    "empty": ("# settings to come\n", [], "config.yaml: empty config; "),
    "duplicate": (TINY_TEXT + "steps: 2\n", [],
                  f"config.yaml, line {END_LINE}: steps: duplicate key (first at line {LINES.index('steps: 6') + 1})"),
    "seed": (TINY_TEXT.replace("seed: 0\n", f"seed: {2**63}\n"), [], "seed: expected an integer <= "),
    "tiny-width": (TINY_TEXT.replace("  name: tiny-llama\n", "  name: tiny-llama\n  tiny_hidden: 30\n"), [],
                   "model.tiny_hidden: tiny-llama has 4 attention heads of an even size (rotary embeddings), so it "
                   "must be a multiple of 8, got 30"),
    "lora-targets": (TINY_TEXT, ["model.lora.target_modules=[qproj]"], "model.lora.target_modules: ['qproj'] matches "
                     "no module of 'tiny-llama'; its layers include embed_tokens, q_proj, k_proj, v_proj, o_proj"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_refused_config_is_one_cli_line_naming_the_file_or_key(tmp_path, capsys, case):
    text, overrides, named = BAD_CONFIGS[case]
    config = tmp_path / "config.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "run"
    sets = [arg for item in [*SETTINGS[:1], *overrides] for arg in ("--set", item)]
    code = main(["train", str(config), "--out", str(out), *sets])
    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (2, 1), err
    assert err.startswith("elastic-reset: error: ") and named in err, err
    assert not out.exists()


def test_lora_targets_matching_nothing_are_refused_naming_the_key():
    from elastic_reset.rl.policy import load_model_and_tokenizer

    config = cfg("model.name=tiny-gpt2", "model.lora.target_modules=[q_proj, v_proj]")
    with pytest.raises(ConfigError) as err:
        load_model_and_tokenizer(config.model)
    assert str(err.value) == ("model.lora.target_modules: ['q_proj', 'v_proj'] matches no module of 'tiny-gpt2'; its "
                              "layers include wte, wpe, c_attn, c_proj, c_fc, lm_head")


def test_all_linear_puts_adapters_on_every_linear_layer_but_the_output_layer_as_peft_does():
    from elastic_reset.rl.policy import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(cfg("model.lora.target_modules=[all-linear]").model)
    wrapped = {name.split(".lora_A")[0].split(".")[-1] for name, _ in model.named_parameters() if "lora_A" in name}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ConfigError, match=r"^model\.lora\.target_modules: \['all-linear', 'q_proj'\]: 'all-linear' "):
        load_model_and_tokenizer(cfg("model.lora.target_modules=[all-linear, q_proj]").model)


def test_lora_targets_matching_some_modules_still_load():
    from elastic_reset.rl.policy import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(cfg("model.lora.target_modules=[v_proj, c_attn]").model)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".v_proj.lora_" in n for n in trained)  # as before: peft skips a target it cannot find


@pytest.mark.parametrize("rehearsal", [(), REHEARSAL])
def test_a_run_at_the_largest_seed_trains_and_evaluates(tmp_path, rehearsal):
    # every generator the trainer seeds from it (sampling per rank, evaluation, prompt order, rehearsal's answers)
    from elastic_reset.rl.config import MAX_SEED

    records = RLTrainer(cfg(f"seed={MAX_SEED}", "steps=1", "eval.every=1", *rehearsal), tmp_path / "run").train()
    assert [r["step"] for r in records if "reward" in r] == [1]
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 1]


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


# Where each command spends its time, replaced by a Ctrl-C.
INTERRUPTED = {
    "train": ("elastic_reset.rl.trainer.RLTrainer.train", lambda tmp: ["train", TINY, "--out", tmp / "run"]),
    "compare": ("elastic_reset.compare.run_grid",
                lambda tmp: ["compare", TINY, "--out", tmp / "grid", "--methods", "kl", "--seeds", "1"]),
    "pareto": ("elastic_reset.evaluation.runs.find_run_dirs", lambda tmp: ["pareto", tmp, "--out", tmp / "p.png"]),
}


@pytest.mark.parametrize("command", list(INTERRUPTED))
def test_ctrl_c_is_one_line_and_exit_status_130(tmp_path, monkeypatch, capsys, command):
    target, args = INTERRUPTED[command]
    monkeypatch.setattr(target, _raise(KeyboardInterrupt()))
    try:
        code = main([str(a) for a in args(tmp_path)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left main as a KeyboardInterrupt traceback")
    assert (code, capsys.readouterr().err) == (130, "elastic-reset: interrupted\n")


def test_ctrl_c_with_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr("elastic_reset.evaluation.runs.find_run_dirs", _raise(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        main(["--debug", "pareto", str(tmp_path), "--out", str(tmp_path / "p.png")])


def test_out_below_a_file_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "run"
    assert main(["train", str(TINY), "--out", str(out), "--set", "steps=1"]) == 2
    assert capsys.readouterr().err == f"elastic-reset: error: {out}: Not a directory\n"


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOSPC], ids=errno.errorcode.get)
def test_os_error_on_a_file_is_one_line_naming_it_and_the_reason(tmp_path, monkeypatch, capsys, code):
    target = tmp_path / "run" / "config.yaml"
    monkeypatch.setattr("elastic_reset.rl.trainer.RLTrainer", _raise(OSError(code, os.strerror(code), str(target))))
    assert main(["train", str(TINY), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"elastic-reset: error: {target}: {os.strerror(code)}\n"


def test_os_error_with_debug_shows_the_traceback(tmp_path, monkeypatch):
    error = OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "run"))
    monkeypatch.setattr("elastic_reset.rl.trainer.RLTrainer", _raise(error))
    with pytest.raises(OSError) as caught:
        main(["--debug", "train", str(TINY), "--out", str(tmp_path / "run")])
    assert caught.value is error


def test_version_is_the_installed_package_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"elastic-reset {version('elastic-reset')}"


def test_a_librarys_error_is_cut_to_its_first_line_or_named_by_its_type():
    from elastic_reset.errors import first_line

    assert first_line(OSError("  not found\nsee the docs\n")) == "not found"
    assert first_line(OSError()) == "OSError"  # an empty message must not become an IndexError
