"""Elastic Reset inside TRL's ``GRPOTrainer`` / ``RLOOTrainer`` and any Hugging Face ``Trainer``, as a callback.

Elastic Reset paper §3 (Noukhovitch et al., NeurIPS 2023): keep an EMA θ̄ of the policy's weights, updated after
every optimizer step, and every n steps reset the policy to it (θ ← θ̄) and the EMA to the initial weights
(θ̄ ← θ0). The trainers need no change for that, only four of their callback hooks, so this module depends on
``transformers`` alone; ``trl`` is never imported here. Where each hook fires, in transformers 5.23 ``trainer.py``:

- ``on_train_begin`` (``_inner_training_loop``): after the model, optimizer, scheduler and ``trainer_state.json``
  of a resumed checkpoint are loaded, before the first step. The EMA and θ0 are taken here, or loaded on resume.
- ``on_step_end`` (``_run_epoch``): once per optimizer step, after gradient accumulation, ``optimizer.step()``,
  the scheduler step, ``zero_grad`` and ``global_step += 1``, and before that step's logging and checkpointing.
- ``on_log`` (``Trainer.log``): *after* a copy of ``logs`` was appended to ``state.log_history``, and for each
  callback in list order, reporting integrations (W&B, TensorBoard, ...) before the callbacks the user passed.
- ``on_save`` (``_maybe_log_save_evaluate``): after ``checkpoint-{global_step}`` is fully written.
- ``on_train_end`` (``_inner_training_loop``): after the last step (and the best model's reload, if asked for).
  The final EMA is saved here, as TRL's ``BEMACallback`` saves its average to ``output_dir/bema``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from elastic_reset.core import AnchorEvent, ElasticReset, ResetEvent
from elastic_reset.io import atomic_write, save_folder_atomically

logger = logging.getLogger(__name__)

STATE_FILE = "elastic_reset.pt"
"""The file this callback adds to each ``checkpoint-{global_step}`` folder."""

EMA_DIR = "ema"
"""The folder, in ``output_dir``, that gets the final EMA model when training ends (``save_ema``)."""


def state_file(sharded: bool, rank: int) -> str:
    """``elastic_reset.pt``, or under FSDP2 one file per rank (``elastic_reset.rank<r>.pt``: its shards)."""
    return f"elastic_reset.rank{rank}.pt" if sharded else STATE_FILE


class _AnchorCallback(TrainerCallback):
    """What the callbacks here share: their metrics in every log, the ``report_to`` trackers' included, and a state
    file in each checkpoint, read back on resume.

    transformers runs reporting integrations before the callbacks a user passes (``Trainer.__init__``:
    ``DEFAULT_CALLBACKS + reporting callbacks + callbacks``), so when training begins a small callback is put first
    that adds :meth:`metrics` to each log (the trainer is found on the call stack: transformers passes callbacks no
    trainer), and W&B, TensorBoard, ... log them with a plain ``callbacks=[callback]``. :meth:`attach` instead moves
    the callback itself first (its step end then also precedes other callbacks')."""

    _logs_first = False  # a _LogsFirst callback adds this one's metrics to the logs

    def metrics(self) -> dict[str, float]:
        """The entries this callback adds to each log; none before training begins."""
        return {}

    def attach(self, trainer: Any):
        """Add this callback to ``trainer`` (or move it) in first place, so that its metrics are in ``logs``
        before any reporting integration reads them, and its step end comes before other callbacks'."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def _put_metrics_first(self) -> None:
        """At train begin: unless this callback is first, a small one placed first adds its metrics to the logs
        the reporting integrations read, without moving this one (its step-end order is the user's)."""
        trainer = _training_trainer()
        callbacks = [] if trainer is None else trainer.callback_handler.callbacks
        self._logs_first = trainer is not None and callbacks[0] is not self
        if self._logs_first and not any(isinstance(c, _LogsFirst) and c.owner is self for c in callbacks):
            callbacks.insert(0, _LogsFirst(self))
        elif trainer is None:
            logger.warning("%s: the trainer could not be found to run this callback first; call "
                           "callback.attach(trainer) so that report_to trackers log its metrics", type(self).__name__)

    def add_metrics(self, state, logs) -> None:
        """Put :meth:`metrics` into ``logs`` and the last history entry."""
        metrics = self.metrics()
        if metrics and logs is not None:
            _add_to_logs(state, logs, metrics)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._logs_first:
            self.add_metrics(state, logs)

    def _write_state(self, args, state, file: str, payload: dict[str, Any]) -> None:
        """``payload`` with the step into ``file`` of the checkpoint the trainer has just written."""
        folder = _checkpoint_folder(args, state)
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"{folder}: the trainer saved a checkpoint, but not in this folder, so {type(self).__name__} cannot "
                f"add its {file} to it (hyperparameter search writes per-trial folders; it is not supported)")
        payload = {"format": 1, "global_step": state.global_step, **payload}
        # A crash mid-write never leaves a truncated state file (temporary sibling, fsync, rename).
        atomic_write(os.path.join(folder, file), lambda f: torch.save(payload, f))

    def _read_state(self, args, state, file: str, missing: str, folder: str | None = None) -> tuple[str, dict]:
        """(path, content) of ``file`` in the checkpoint the trainer resumed from (``folder`` if given), refused
        with ``missing`` when absent, or when written at another step."""
        folder = folder or _resumed_checkpoint() or _checkpoint_folder(args, state)
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: {missing}")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved["global_step"] != state.global_step:
            raise ValueError(f"{path}: saved at step {saved['global_step']}, but training resumes at step "
                             f"{state.global_step}: it belongs to another checkpoint")
        return path, saved


class ElasticResetCallback(_AnchorCallback):
    """Applies Elastic Reset (paper §3) to the model a ``Trainer`` trains: GRPO, RLOO, or any other.

    >>> callback = ElasticResetCallback(decay=0.995, reset_every=260)
    >>> trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=..., callbacks=[callback])
    >>> trainer.train()          # or trainer.train(resume_from_checkpoint=True): the EMA, θ0 and schedule continue
    >>> callback.elastic_reset   # the ElasticReset: ema_weights() to evaluate the EMA, num_resets, ...

    The arguments are :class:`~elastic_reset.ElasticReset`'s. It covers the parameters of the trainer's model
    that have ``requires_grad`` (with a peft model, the adapters only), minus ``exclude``; θ0 and the EMA are
    taken when training begins. The schedule counts optimizer steps: with gradient accumulation, one step is one
    ``optimizer.step()``, not one micro-batch. TRL's reference model (``beta > 0``) is a separate model and is
    untouched; with peft, the reference is the base model with adapters disabled, also untouched. TRL generates
    with the reset weights from the next step on (it syncs vLLM whenever ``global_step`` moved); completions
    buffered before a reset (``steps_per_generation`` > gradient accumulation, or ``num_iterations`` > 1) are
    trained on with the importance ratio against their old log-probs, as any off-policy step.

    Logs: every log gets ``elastic_reset/resets`` (resets so far) and ``elastic_reset/distance`` (‖θ − θ̄‖ now),
    both in ``trainer.state.log_history`` and in the ``logs`` seen by the callbacks after this one (the console
    and progress printers). transformers runs reporting integrations before the callbacks the user passes
    (``Trainer.__init__``: ``DEFAULT_CALLBACKS + reporting callbacks + callbacks``), so when training begins this
    callback puts a small one first that adds the two metrics to each log (it finds the trainer on the call stack),
    and W&B, TensorBoard, ... log them with a plain ``callbacks=[callback]``. :meth:`attach` instead moves this
    callback itself first (its reset then also precedes other callbacks' step ends). A reset is logged at WARNING level,
    visible by default. :attr:`events` lists every reset.

    Checkpoints: each ``checkpoint-{global_step}`` folder gets ``elastic_reset.pt`` (EMA, θ0, counters, events),
    and a resumed run loads it back, so θ0 is the run's true initial weights, not the resumed ones. transformers
    does not tell callbacks which folder ``train(resume_from_checkpoint=...)`` loaded: the callback reads it from
    the trainer's call stack (see :func:`_resumed_checkpoint`), else looks in ``{output_dir}/checkpoint-{step}``;
    ``resume_from`` overrides both. It refuses a state file whose step or weights do not match the resumed model.
    Single process or DDP: the saving rank writes the file (``args.should_save``). FSDP2 (``fully_shard``, e.g.
    accelerate's ``fsdp_version: 2``): each rank keeps the EMA and θ0 of its own shards and writes them to
    ``elastic_reset.rank<r>.pt`` beside the sharded checkpoint; resume on as many ranks. DeepSpeed ZeRO (accelerate's
    ``deepspeed_config``): the EMA and resets follow the optimizer's fp32 masters; ZeRO-3 keeps and saves each rank's
    partitions as FSDP2 its shards, ZeRO-1/2 whole copies (one file). FSDP1 is refused when training begins (its
    flattened parameters would give a silently wrong EMA). Not for hyperparameter search (its checkpoints live in
    per-trial folders).

    Args:
        decay, reset_every, mode, device, schedule, exclude, reset_optimizer_state: as in
            :class:`~elastic_reset.ElasticReset` (the optimizer is the trainer's).
        resume_from: checkpoint folder to read ``elastic_reset.pt`` from on resume, instead of the one the
            trainer resumes from.
        save_ema: when training ends, write the EMA weights with ``save_pretrained`` (with peft, the adapter) and
            the trainer's tokenizer into ``{output_dir}/ema``, as TRL's ``BEMACallback`` writes ``bema``; the
            model keeps the policy's weights. Not under FSDP2 (a warning says so). False: no folder.
    """

    def __init__(
        self,
        decay: float = 0.995,
        reset_every: int | None = None,
        mode: str = "elastic",
        device: str | torch.device = "cpu",
        schedule: Callable[[int], bool] | None = None,
        exclude: Callable[[str], bool] | str | Sequence[str] | None = None,
        reset_optimizer_state: bool = False,
        resume_from: str | os.PathLike | None = None,
        save_ema: bool = True,
    ) -> None:
        self.options = dict(decay=decay, reset_every=reset_every, mode=mode, device=torch.device(device),
                            schedule=schedule, exclude=exclude, reset_optimizer_state=reset_optimizer_state)
        self.resume_from = resume_from
        self.save_ema = save_ema
        self.elastic_reset: ElasticReset | None = None
        """Built when training begins; None before."""
        self.events: list[ResetEvent] = []
        """Every reset of the run, resumed ones included."""
        # Fail now, not when training begins, on bad arguments: build one over a throwaway parameter.
        probe = torch.nn.Parameter(torch.zeros(1))
        self._build([("probe", probe)], torch.optim.SGD([probe], lr=0.0), device="cpu", exclude=None)

    def _build(self, params: Any, optimizer: torch.optim.Optimizer | None, **override: Any) -> ElasticReset:
        options = {**self.options, **override}
        if not options["reset_optimizer_state"]:
            optimizer = None
        elif optimizer is None:
            raise ValueError("reset_optimizer_state=True, but the trainer passed no optimizer to the callback")
        return ElasticReset(params, optimizer=optimizer, **options)

    # ----------------------------------------------------------------------------------------------- hooks
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            raise ValueError("ElasticResetCallback: the trainer passed no model to on_train_begin")
        self.elastic_reset = self._build(model, optimizer)
        self.events = []
        self._put_metrics_first()
        # Resuming is the only way a run begins past step 0 (Trainer._init_training_state), and by now the model,
        # optimizer and trainer state are the checkpoint's: the EMA and θ0 must be too.
        if state.global_step > 0:
            self._load(args, state)

    def on_step_end(self, args, state, control, **kwargs):
        event = self.elastic_reset.step()
        if event is not None:
            self.events.append(event)
            logger.warning("Elastic Reset #%d (%s) at step %d: the policy was %.4g from its EMA",
                        event.index, event.mode, state.global_step, event.distance)

    def metrics(self) -> dict[str, float]:
        """``elastic_reset/resets`` and ``elastic_reset/distance``."""
        if self.elastic_reset is None:
            return {}
        return {"elastic_reset/resets": self.elastic_reset.num_resets,
                "elastic_reset/distance": self.elastic_reset.distance()}

    def on_save(self, args, state, control, **kwargs):
        if self.elastic_reset is None:
            return
        er = self.elastic_reset
        if not (args.should_save or er.collective):
            return
        distance = er.distance()  # a fingerprint of the weights it belongs with; where collective, every rank's
        if not (args.should_save or er.is_sharded):  # sharded: every rank saves its shards
            return
        self._write_state(args, state, state_file(er.is_sharded, args.process_index), {
            "elastic_reset": er.state_dict(), "events": [dataclasses.asdict(e) for e in self.events],
            "distance": distance})

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.save_ema or self.elastic_reset is None or model is None:
            return
        if self.elastic_reset.is_sharded:  # save_pretrained would need the whole parameters gathered
            logger.warning("ElasticResetCallback: the EMA of a sharded model (FSDP2, ZeRO-3) is not saved to %s/%s; "
                           "its shards are in each checkpoint's elastic_reset.rank<r>.pt", args.output_dir, EMA_DIR)
            return
        writes = state.is_world_process_zero
        if not (writes or self.elastic_reset.collective):  # ZeRO-1/2: every rank swaps the EMA in and out
            return
        folder = os.path.join(args.output_dir, EMA_DIR)
        # A run that ends on a reset step leaves θ0 in the EMA: the pre-reset average is the policy itself.
        initial = self.elastic_reset.num_steps > 0 and self.elastic_reset.ema_is_initial()
        if initial:
            logger.warning("ElasticResetCallback: %s/%s equals the initial weights: training ended on a reset, "
                           "which moved the EMA into the policy (the model in %s is that average) and set the EMA "
                           "to θ0", args.output_dir, EMA_DIR, args.output_dir)

        def write(tmp) -> None:
            model.save_pretrained(tmp)
            if processing_class is not None and hasattr(processing_class, "save_pretrained"):
                processing_class.save_pretrained(tmp)
            if initial:
                with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:  # inside the atomic save
                    f.write(f"# The Elastic Reset EMA at step {state.global_step}: the initial weights\n\n"
                            "Training ended on a reset step: a reset sets the policy to the EMA and then the EMA "
                            "to the initial weights θ0 (Elastic Reset, paper §3), so this folder holds θ0. The "
                            "average of the weights before that reset is the trained policy, saved by the "
                            "trainer in output_dir.\n")

        with self.elastic_reset.ema_weights():  # the policy's own weights are back after the block
            if writes:
                save_folder_atomically(folder, write)
        if writes:
            logger.info("Saved the Elastic Reset EMA model to %s", folder)

    # ----------------------------------------------------------------------------------------------- resume
    def _load(self, args, state) -> None:
        path, saved = self._read_state(
            args, state, state_file(self.elastic_reset.is_sharded, args.process_index),
            f"no Elastic Reset state to resume from. Training resumes at step {state.global_step}, and without this "
            "file the EMA, θ0 and reset schedule cannot continue (a checkpoint saved without ElasticResetCallback "
            "cannot be resumed with it). If the trainer resumed from another folder, pass "
            "ElasticResetCallback(resume_from=<that folder>).", folder=self.resume_from)
        er = self.elastic_reset
        mine = (er.decay, er.mode, er.reset_every)
        try:
            er.load_state_dict(saved["elastic_reset"])
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error
        if (er.decay, er.mode, er.reset_every) != mine:
            logger.warning("%s: continuing with the saved decay/mode/reset_every %s, not the given %s",
                           path, (er.decay, er.mode, er.reset_every), mine)
        distance = er.distance()
        if not math.isclose(distance, saved["distance"], rel_tol=1e-4):
            raise ValueError(
                f"{path}: the resumed model is {distance:.6g} from the saved EMA, but was {saved['distance']:.6g} "
                f"when this file was saved: it does not belong with the weights the trainer resumed from")
        self.events = [AnchorEvent.from_dict(e) for e in saved["events"]]


def _add_to_logs(state, logs: dict, metrics: dict) -> None:
    """``metrics`` into ``logs`` and into the history entry made of them. Trainer.log appended {**logs, "step":
    global_step} to log_history *before* calling on_log, so updating ``logs`` in place reaches the later callbacks
    but not the history: its last entry is updated too."""
    history = state.log_history
    if history and history[-1].get("step") == state.global_step and set(logs) <= set(history[-1]):
        history[-1].update(metrics)
    logs.update(metrics)


class _LogsFirst(TrainerCallback):
    """Runs first among the trainer's callbacks and adds ``owner``'s metrics to each log, so that the reporting
    integrations, which run before the user's callbacks, log them too."""

    def __init__(self, owner: _AnchorCallback):
        self.owner = owner

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.owner.add_metrics(state, logs)


def _checkpoint_folder(args, state) -> str:
    """``{output_dir}/checkpoint-{global_step}``: the folder the trainer saves into at this step."""
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def _resumed_checkpoint() -> str | None:
    """The folder ``Trainer.train(resume_from_checkpoint=...)`` is resuming from, or None if it cannot be found.

    transformers passes callbacks neither that folder nor the trainer, and the folder may lie outside
    ``output_dir``. ``on_train_begin`` is called from ``Trainer._inner_training_loop``, whose argument
    ``resume_from_checkpoint`` is that folder (``True`` already resolved to the last checkpoint by ``train``), so it
    is read from that frame of the call stack. Best effort: the caller falls back to
    ``{output_dir}/checkpoint-{global_step}``, and checks that the state file found matches the resumed model.
    """
    frame = _training_frame()
    folder = None if frame is None else frame.f_locals.get("resume_from_checkpoint")
    return os.fspath(folder) if isinstance(folder, (str, os.PathLike)) else None


def _training_trainer() -> Any | None:
    """The ``Trainer`` whose training loop called this callback (see :func:`_resumed_checkpoint`), or None."""
    frame = _training_frame()
    return None if frame is None else frame.f_locals["self"]


def _training_frame() -> Any | None:
    """The frame of ``Trainer._inner_training_loop`` on the call stack, or None."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_inner_training_loop" and isinstance(frame.f_locals.get("self"), Trainer):
            return frame
        frame = frame.f_back
    return None


ANCHOR_FILE = "anchor.pt"
"""The file :class:`ReferenceSyncCallback` adds to each ``checkpoint-{global_step}`` folder."""


class ReferenceSyncCallback(_AnchorCallback):
    """TR-DPO's reference sync (``preset="ref_sync"``: ref ← α·θ + (1 − α)·ref every ``every`` optimizer steps)
    or ProRL's reference reset (``"ref_reset"``: ref ← θ, the optimizer's state dropped) in TRL's GRPO and RLOO
    trainers, LoRA included: the case TRL's own ``sync_ref_model`` refuses (TRL issue #3108).

    Where the reference is, as TRL 1.16 computes its log-probs (``GRPOTrainer`` and ``RLOOTrainer``: the trainer's
    ``ref_model`` if it has one, else the peft model under ``use_adapter(model, "ref" if "ref" in
    model.peft_config else None)``):

    - a peft model: the ``ref`` adapter. TRL adds one (a frozen copy of ``default``) when given a ``PeftModel``
      with ``beta > 0``; with a fresh adapter (``peft_config=``) there is none and the reference is the base model,
      so this callback adds it when training begins, a frozen copy of ``default`` (the base itself while LoRA's B
      is zero). A hard update (α = 1, ``ref_reset``) makes the reference exactly the policy; a soft one mixes A and
      B separately, which is not the mix of the products B·A (the exact mix has rank 2r): an approximation, said
      here rather than hidden.
    - a full model: ``trainer.ref_model``'s parameters, matched by name. With ``beta = 0`` there is no reference,
      and the callback refuses to start.

    Checkpoints get ``anchor.pt`` (the reference tensors, counters and events); a resumed run loads it back, since TRL
    rebuilds its ``ref`` adapter from the resumed ``default``, which is not the reference the run had.
    Logs ``anchor/pulls`` (the ``report_to`` trackers too, as :class:`ElasticResetCallback`'s metrics); each pull is
    logged at WARNING level and kept in :attr:`events`.
    """

    def __init__(self, preset: str = "ref_sync", every: int = 512, alpha: float = 0.6, trigger=None):
        if preset not in ("ref_sync", "ref_reset"):
            raise ValueError(f"preset: expected 'ref_sync' or 'ref_reset', got {preset!r}")
        self.preset = preset
        self.settings = {"trigger": trigger} if trigger is not None else {"every": every}
        if preset == "ref_sync":
            self.settings["alpha"] = alpha
        probe = torch.nn.Parameter(torch.zeros(1))  # bad settings fail now, not when training begins
        self._build([("probe", probe)], [probe.detach().clone()], torch.optim.SGD([probe], lr=0.0))
        self.anchor = None
        self.events: list = []

    def _build(self, covered, reference, optimizer):
        from elastic_reset.core import Anchor

        extra = {"optimizer": optimizer} if self.preset == "ref_reset" else {}
        return Anchor.preset(self.preset, covered, reference=reference, **self.settings, **extra)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            raise ValueError("ReferenceSyncCallback: the trainer passed no model to on_train_begin")
        covered, reference = _policy_and_reference(model, _training_trainer())
        self.anchor = self._build(covered, reference, optimizer)
        self.events = []
        self._put_metrics_first()
        if state.global_step > 0:
            _, saved = self._read_state(args, state, ANCHOR_FILE, "no reference state to resume from (the checkpoint "
                                        "was saved without ReferenceSyncCallback)")
            self.anchor.load_state_dict(saved["anchor"])
            self.events = [AnchorEvent.from_dict(e) for e in saved["events"]]

    def on_step_end(self, args, state, control, **kwargs):
        event = self.anchor.step()
        if event is not None:
            self.events.append(event)
            logger.warning("%s #%d at step %d (%s): the reference moved %.4g", self.preset, event.index,
                           state.global_step, event.cause, event.distance)

    def metrics(self) -> dict[str, float]:
        """``anchor/pulls``."""
        return {} if self.anchor is None else {"anchor/pulls": self.anchor.num_pulls}

    def on_save(self, args, state, control, **kwargs):
        if self.anchor is None or not args.should_save:
            return
        self._write_state(args, state, ANCHOR_FILE, {"anchor": self.anchor.state_dict(),
                                                     "events": [dataclasses.asdict(e) for e in self.events]})


def _policy_and_reference(model, trainer) -> tuple[list, list]:
    """(the policy's trainable ``(name, tensor)`` pairs, the reference tensors that match them): the ``ref``
    adapter of a peft model (added, as a frozen copy of ``default``, if TRL did not), else the trainer's
    ``ref_model``."""
    if hasattr(model, "peft_config"):
        if "ref" not in model.peft_config:
            model.add_adapter("ref", model.peft_config["default"])
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if ".default." in name:
                        model.get_parameter(name.replace(".default.", ".ref.")).copy_(param)
        covered = [(n, p) for n, p in model.named_parameters() if ".default." in n and p.requires_grad]
        reference = [model.get_parameter(n.replace(".default.", ".ref.")) for n, _ in covered]
        for r in reference:
            r.requires_grad_(False)
        return covered, reference
    ref_model = getattr(trainer, "ref_model", None)
    if ref_model is None:
        raise ValueError("ReferenceSyncCallback: the trainer has no reference model (beta = 0?): there is nothing "
                         "to sync")
    ref = dict(ref_model.named_parameters())
    covered = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, _ in covered if n not in ref]
    if missing:
        raise ValueError(f"ReferenceSyncCallback: the reference model has no parameter {missing[0]!r}")
    return covered, [ref[n] for n, _ in covered]
