"""The gold of the gold-vs-proxy testbed (Gao et al. 2022, arXiv 2210.10760, §2): a fixed scorer that
stands in for human preference. It labels pairs of the initial policy's continuations with Bradley–Terry noise;
proxy reward models learn from those labels (``reward-model train --data PAIRS``); RL optimises a proxy, and the gold,
which RL never sees, shows when optimising the proxy stops improving the gold.

The gold here is the IMDB sentiment classifier: its score is log P(positive) − log P(negative) of prompt +
continuation, and P(a ≻ b) = σ((g_a − g_b) / T).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from elastic_reset.errors import ConfigError
from elastic_reset.io import MetricsLog, save_folder_atomically
from elastic_reset.lm.cpu_bf16 import packed_linears
from elastic_reset.lm.device import autocast_dtype, rng_state, set_rng_state
from elastic_reset.lm.scoring import autocast

PAIRS = "pairs.jsonl"
METRICS = "metrics.json"


def sigmoid(x: float) -> float:
    """σ(x) without overflow at either end."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x) / (1.0 + math.exp(x))


def pairwise_agreement(proxy: Sequence[float], gold: Sequence[float]) -> float:
    """The share of pairs of samples the gold orders (ties in the gold left out) that ``proxy`` orders the same way,
    a proxy tie counting half: the proxy's ranking accuracy on these samples (the "reward accuracy" that Ackermann
    et al. 2026 tie to the gradient norm). NaN with fewer than two gold-ordered samples."""
    agree = pairs = 0.0
    for i in range(len(gold)):
        for j in range(i + 1, len(gold)):
            if gold[i] == gold[j]:
                continue
            pairs += 1
            d = (proxy[i] - proxy[j]) * (gold[i] - gold[j])
            agree += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
    return agree / pairs if pairs else math.nan


def bradley_terry_labels(gold_a: Sequence[float], gold_b: Sequence[float], temperature: float,
                         seed: int) -> list[bool]:
    """For each pair, whether ``a`` is preferred, drawn with P(a ≻ b) = σ((g_a − g_b) / T): T → 0 is the gold's
    own order, a large T a coin toss."""
    rng = random.Random(seed)
    return [rng.random() < sigmoid((a - b) / temperature) for a, b in zip(gold_a, gold_b)]


@dataclass
class GoldPairsConfig:
    """One set of gold-labelled pairs."""

    n_pairs: int = 2000
    """Prompts (the IMDB task's first train prompts), one pair of continuations each."""
    temperature: float = 1.0
    """T of the Bradley–Terry noise, in gold log-odds."""
    max_new_tokens: int = 48
    """Tokens per continuation, exactly (as the RL runs sample: ``sampling.min_new_tokens``)."""
    max_prompt_tokens: int = 64
    """The end of each prompt the policy sees (``model.max_prompt_tokens``)."""
    batch_size: int = 16
    """Prompts per generation (two continuations each)."""
    seed: int = 0
    """Seeds the sampling and the labels."""

    def validate(self) -> None:
        for name in ("n_pairs", "max_new_tokens", "max_prompt_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise ConfigError(f"temperature: expected a finite number > 0, got {self.temperature!r}")


def _rng_text(device: torch.device) -> dict[str, str]:
    """The generators' state as text (a journal line is JSON)."""
    return {name: base64.b64encode(state.numpy().tobytes()).decode("ascii")
            for name, state in rng_state(device).items()}


def _set_rng_text(states: dict[str, str], device: torch.device) -> None:
    set_rng_state({name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
                   for name, text in states.items()}, device)


@torch.no_grad()
def sample_pairs(model, tokenizer, prompts: list[str], config: GoldPairsConfig, journal: MetricsLog | None = None,
                 done: Sequence[dict] = ()) -> list[tuple[str, str]]:
    """Two continuations of each prompt, sampled from the full distribution (temperature 1, no top-k or top-p, as
    the RL runs sample), ``config.max_new_tokens`` tokens each; under bf16 autocast with pre-packed weights where
    the device computes bf16 natively, as the engine's sampler (``model.autocast: auto``).

    ``journal``: each batch's pairs and the generators' state after it are appended there (``step`` = the batch's
    first prompt). ``done``: the batches an interrupted build journalled, not sampled again; the generators go on
    from the state after the last, so the build samples what an uninterrupted one would."""
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = autocast_dtype("auto", model.device)
    torch.manual_seed(config.seed)
    pairs = [(a, b) for record in done for a, b in record["pairs"]]
    if done:
        _set_rng_text(done[-1]["rng"], model.device)
    with autocast(model, dtype), packed_linears(model, dtype, batch_hint=2 * config.batch_size):
        for start in range(len(pairs), len(prompts), config.batch_size):
            enc = tokenizer(prompts[start:start + config.batch_size], return_tensors="pt", padding=True,
                            truncation=True, max_length=config.max_prompt_tokens).to(model.device)
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=2,
                                 max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
            batch = list(zip(texts[0::2], texts[1::2]))
            pairs.extend(batch)
            if journal:
                journal.write({"step": start, "pairs": batch, "rng": _rng_text(model.device)})
    return pairs


def label_pairs(prompts: list[str], pairs: list[tuple[str, str]], gold, config: GoldPairsConfig) -> list[dict]:
    """The pairs as ``reward-model train`` reads them (``prompt``, ``chosen``, ``rejected``), with the gold's scores
    of both (``gold_chosen``, ``gold_rejected``), chosen by Bradley–Terry-noisy labels. ``gold``: a
    :class:`~elastic_reset.rewards.classifier.SentimentReward`."""
    texts = gold.texts([p for p in prompts for _ in range(2)], [c for pair in pairs for c in pair])
    scores = gold.log_odds(texts)
    a_wins = bradley_terry_labels(scores[0::2], scores[1::2], config.temperature, config.seed)
    rows = []
    for prompt, (a, b), g_a, g_b, a_won in zip(prompts, pairs, scores[0::2], scores[1::2], a_wins):
        (chosen, g_chosen), (rejected, g_rejected) = ((a, g_a), (b, g_b)) if a_won else ((b, g_b), (a, g_a))
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "gold_chosen": g_chosen,
                     "gold_rejected": g_rejected})
    return rows


def pairs_summary(rows: list[dict]) -> dict:
    """How noisy the labels are: the share of pairs whose label agrees with the gold's own order (a tie counts half),
    and the mean gap."""
    gaps = [r["gold_chosen"] - r["gold_rejected"] for r in rows]
    prob = [sigmoid(g) for r in rows for g in (r["gold_chosen"], r["gold_rejected"])]
    return {"pairs": len(rows), "label_agrees_with_gold": sum((g > 0) + 0.5 * (g == 0) for g in gaps) / len(rows),
            "mean_abs_gold_gap": sum(abs(g) for g in gaps) / len(rows),
            "gold_p_positive_mean": sum(prob) / len(prob)}


def journal_path(out: str | Path) -> Path:
    """Where a build of ``out`` keeps the batches sampled so far (a sibling file, removed once ``out`` is written)."""
    out = Path(out)
    return out.with_name(out.name + ".partial.jsonl")


def _open_journal(path: Path, settings: dict, resume: bool, force: bool) -> tuple[MetricsLog, list[dict]]:
    """The sampling journal at ``path``, started with ``settings`` (step −1), or an earlier one continued when
    ``resume`` and it was written with the same settings; with the batches it already holds."""
    journal = MetricsLog(path)
    if path.exists() and force:
        path.unlink()
    elif path.exists():
        if not resume:
            raise FileExistsError(f"{path}: the samples of an interrupted build; pass --resume to go on from them, "
                                  "or --force to start again")
        records = journal.records()
        before = records[0].get("settings") if records else None
        if before != settings:
            changed = sorted(k for k in settings if not isinstance(before, dict) or before.get(k) != settings[k])
            raise ConfigError(f"{path}: written by a build with other settings ({', '.join(changed) or 'header'}); "
                              "pass --force to start again")
        journal.truncate_after(max(r["step"] for r in records))  # a torn last line goes before appending
        return journal, [r for r in records if r["step"] >= 0]
    journal.write({"step": -1, "settings": settings})
    return journal, []


def build_gold_pairs(policy: str | Path, gold: str | Path, prompts: list[str], out: str | Path,
                     config: GoldPairsConfig, force: bool = False, resume: bool = False) -> tuple[Path, dict]:
    """Sample two continuations of each prompt from ``policy`` (a causal-LM folder), label them with the ``gold``
    classifier (a folder) and write ``out/pairs.jsonl`` and ``out/metrics.json`` in one atomic step. The samples
    are journalled batch by batch beside ``out`` (:func:`journal_path`); ``resume`` goes on from a journal an
    interrupted build left, ``force`` starts again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from elastic_reset.rewards.classifier import SentimentReward

    config.validate()
    out = Path(out)
    if (out / PAIRS).exists() and not force:
        raise FileExistsError(f"{out}: gold pairs already there; pass --force to replace them")
    if len(prompts) < config.n_pairs:
        raise ConfigError(f"n_pairs: {config.n_pairs} asked for, {len(prompts)} prompts available")
    prompts = prompts[:config.n_pairs]
    settings = {"config": asdict(config), "policy": str(policy),
                "prompts": hashlib.sha256("\n".join(prompts).encode("utf-8")).hexdigest()}
    out.parent.mkdir(parents=True, exist_ok=True)
    journal, done = _open_journal(journal_path(out), settings, resume, force)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    try:
        pairs = sample_pairs(model, AutoTokenizer.from_pretrained(policy), prompts, config, journal, done)
    finally:
        journal.close()
    sampled = time.perf_counter() - started
    rows = label_pairs(prompts, pairs, SentimentReward(gold), config)
    metrics = {**pairs_summary(rows), "config": asdict(config), "policy": str(policy), "gold": str(gold),
               "resumed_pairs": sum(len(r["pairs"]) for r in done), "sample_seconds": sampled,
               "seconds": time.perf_counter() - started}

    def write(tmp: Path) -> None:
        (tmp / PAIRS).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        (tmp / METRICS).write_text(json.dumps(metrics, indent=1) + "\n")

    save_folder_atomically(out, write)
    journal.path.unlink()
    return out, metrics
