"""The training loop: rollout → reward → KL-penalised advantages → policy update, with a drift-control method.

One *iteration* (the ``step`` of ``metrics.jsonl``) samples ``prompts_per_step × samples_per_prompt``
completions, scores them, and runs ``epochs`` passes of minibatch updates over them (PPO; REINFORCE and RLOO
make one on-policy pass). Read :meth:`RLTrainer.train_step` top to bottom for the whole algorithm.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import yaml

from elastic_reset.errors import (
    NonFiniteError,
    RewardError,
    RunFileError,
    RunRecoveryWarning,
)
from elastic_reset.evaluation.drift import perplexity, token_nll
from elastic_reset.evaluation.runs import TASK_FILE
from elastic_reset.io import MetricsLog, atomic_write_text, remove_stale_temps
from elastic_reset.lm.cpu_bf16 import (
    precast_weights,
    release_packed_linears,
    use_fp32_attention,
)
from elastic_reset.lm.scoring import contiguous_head_input, forward_response, resolve_device, seq2seq_nll
from elastic_reset.rewards.learned import LearnedReward
from elastic_reset.rl import ops
from elastic_reset.rl.checkpoint import (
    checkpoint_dir,
    list_checkpoints,
    load_latest,
    save_checkpoint,
)
from elastic_reset.rl.config import (
    ConfigError,
    TrainConfig,
    check_same_run,
    config_to_dict,
)
from elastic_reset.rl.distributed import DataParallel, mean_record
from elastic_reset.rl.methods import PolicyHandle, build_method
from elastic_reset.rl.policy import (
    Reference,
    ValueHead,
    autocast_dtype,
    context_length,
    load_model_and_tokenizer,
    trainable_named_parameters,
)
from elastic_reset.rl.sampling import Rollout, sample
from elastic_reset.tasks import Task, get_task


class RLTrainer:
    """Runs one training run into ``out_dir`` (config, ``metrics.jsonl``, checkpoints).

    Args:
        config: a validated :class:`TrainConfig`.
        out_dir: the run directory. It must not hold a run already unless ``resume=True``.
        task: the task; by default ``config.task`` is looked up in the task registry.
        resume: continue from the latest checkpoint in ``out_dir`` (from scratch if it has none yet).

    Nothing is written to ``out_dir`` until the set-up has succeeded, so a set-up error leaves no run behind.
    """

    def __init__(self, config: TrainConfig, out_dir: str | Path, *, task: Task | None = None,
                 resume: bool = False):
        config.validate()
        self.config = config
        self.out_dir = Path(out_dir)
        # Under `accelerate launch`: one rank of several (rl/distributed.py); otherwise the identity.
        self.dp = DataParallel.from_environment(resolve_device(config.model.device).type)
        self._prepare_run_dir(resume)
        self.dp.barrier()  # every rank has checked the run directory before rank 0 writes to it
        if config.threads:
            torch.set_num_threads(config.threads)
        self.task = task or get_task(config.task.name, config.task.data_dir, **config.task.options)
        self.learned_reward = self.task.reward_fn if isinstance(self.task.reward_fn, LearnedReward) else None

        self.model, self.tokenizer = load_model_and_tokenizer(config.model, seed=config.seed)
        self.device = self.dp.device(resolve_device(config.model.device))
        self.model.to(self.device)  # before any copy of it (reference, NLPO mask model, EMA)
        contiguous_head_input(self.model)
        self.is_lora = config.model.lora is not None
        self.autocast_dtype = autocast_dtype(config.model.autocast, self.device)
        if self.learned_reward is not None:
            self.learned_reward.to(self.device)
        use_fp32_attention(self.model, self.autocast_dtype)  # before any copy of the model (reference, NLPO mask)
        self._check_task_inputs()

        self.reference = Reference(self.model, self.is_lora)
        self.reference_lm = self._load_reference_lm() if config.kl.reference == "lm" else None
        self._frozen_casts: ExitStack | None = None
        self._cast_frozen_weights()
        self.trainable_params = [p for _, p in trainable_named_parameters(self.model)]
        self.value_head = (ValueHead(self.model.config.hidden_size).to(self.device) if config.algo.name == "ppo"
                           else None)
        params = self.trainable_params + (list(self.value_head.parameters()) if self.value_head else [])
        self.optimizer = torch.optim.AdamW(params, lr=config.algo.lr, eps=config.algo.adam_eps,
                                           weight_decay=config.algo.weight_decay)
        self.kl_ctl = (ops.AdaptiveKLController(config.kl.coef, config.kl.target, config.kl.horizon)
                       if config.kl.target is not None else ops.FixedKLController(config.kl.coef))
        self.baseline = ops.MovingAverageBaseline(config.algo.baseline_decay)
        self.method = build_method(config.method)
        self.method.setup(PolicyHandle(self.model, self.optimizer, list(self.task.pretrain_texts), self.lm_loss))
        # Before any resume: the model still holds the initial weights here. Rank 0 alone evaluates.
        self.reference_texts = self._reference_texts() if self.dp.is_main else []

        # On the model's device: sampling draws its noise there (a CPU generator cannot feed CUDA's rand). Each
        # data-parallel rank draws its own samples; rank 0's stream is the single-process one.
        self.generator = torch.Generator(self.device).manual_seed(config.seed + 1_000_033 * self.dp.rank)
        self.step = 0
        self.data_epoch, self.data_index = 0, 0
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl")
        self._tb = None
        if resume:
            self._resume()
        self._write_config()

    def _cast_frozen_weights(self) -> None:
        """Under bf16 autocast, cast the weights that never change (a LoRA base, the reference copy) to bf16 once,
        instead of at every forward: autocast caches its casts only for weights that require grad. Same numbers
        (autocast computes with the same bf16 values); measured 2.22 -> 1.88 s for a SmolLM2 + LoRA forward +
        backward on 16 x 52 tokens. The sampler casts the trainable weights itself, once per rollout. Costs memory:
        the fp32 originals stay, so the frozen weights take 1.5x their fp32 size. Until :meth:`close` (``train()``
        calls it at the end) puts the fp32 weights back, ``trainer.model`` needs autocast to run."""
        if self._frozen_casts is not None or self.autocast_dtype is None:
            return
        self._frozen_casts = ExitStack()
        self._frozen_casts.enter_context(precast_weights(self.model, self.autocast_dtype, trainable=False))
        if not self.is_lora:
            with self.reference.model() as ref:
                self._frozen_casts.enter_context(precast_weights(ref, self.autocast_dtype, trainable=False))

    def close(self) -> None:
        """Give the model its fp32 frozen weights back (see :meth:`_cast_frozen_weights`) and drop the sampler's
        packs of them. Idempotent."""
        if self._frozen_casts is not None:
            self._frozen_casts.close()
            self._frozen_casts = None
        release_packed_linears(self.model)

    # ------------------------------------------------------------------------------------------ set-up checks
    def _prepare_run_dir(self, resume: bool) -> None:
        """Refuse what would overwrite or mix runs; write nothing (``_write_config`` does, once set up)."""
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise FileExistsError(f"{self.out_dir}: exists and is not a directory; choose another --out")
        config_path = self.out_dir / "config.yaml"
        holds_run = config_path.exists() or (self.out_dir / "metrics.jsonl").exists() \
            or bool(list_checkpoints(self.out_dir))
        if holds_run and not resume:
            raise FileExistsError(f"{self.out_dir}: already holds a run; pass --resume to continue it, "
                                  "or choose another --out")
        if not holds_run:
            return
        if not config_path.is_file():
            raise RunFileError(f"{config_path}: missing, but {self.out_dir} holds a run (metrics.jsonl or "
                               "checkpoints), so it cannot be checked that --resume continues the same run; "
                               "restore the file, or start again in another --out")
        check_same_run(config_path, self.config)

    def _write_config(self) -> None:
        if not self.dp.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out_dir / "config.yaml",
                          yaml.safe_dump(config_to_dict(self.config), sort_keys=False))
        # Reports read a run's own task score and drift metric from here (BLEU for the Translation Game), so
        # `elastic-reset pareto` needs no --score/--drift for a task that is not scored by reward and perplexity.
        atomic_write_text(self.out_dir / TASK_FILE, json.dumps(
            {"name": self.task.name, "score": self.task.score_key, "drift": self.task.drift_key}) + "\n")

    def _check_task_inputs(self) -> None:
        ctx = context_length(self.model)
        needed = self.config.model.max_prompt_tokens + self.config.sampling.max_new_tokens
        if ctx is not None and not self.model.config.is_encoder_decoder and needed > ctx:
            raise ConfigError(
                f"model.max_prompt_tokens + sampling.max_new_tokens = {needed} exceeds the model's context "
                f"length {ctx}")
        n = self.config.algo.prompts_per_step
        if len(self.task.train_prompts) < n:
            raise ConfigError(f"algo.prompts_per_step: {n} exceeds the task's {len(self.task.train_prompts)} "
                              "training prompts")
        if self.dp.enabled:
            self.dp.check_divides("algo.prompts_per_step", n)
            self.dp.check_divides("algo.minibatch_size", self.config.algo.minibatch_size)
            if self.learned_reward is not None:
                raise ConfigError(f"task.name: task {self.task.name!r} has a reward that learns (its listener), "
                                  "which data-parallel training does not keep in sync across processes yet; run it "
                                  "in one process")
        if self.model.config.is_encoder_decoder and self.task.drift_key == "perplexity":
            raise ConfigError(f"task.name: task {self.task.name!r} measures drift by perplexity on held-out text, "
                              "which is defined here for decoder-only models, and model.name is an encoder-decoder")

    def _load_reference_lm(self) -> torch.nn.Module:
        """The task's LM for ``kl.reference: lm``: frozen, in eval mode, on the policy's vocabulary."""
        from transformers import AutoModelForCausalLM

        path = self.task.reference_lm
        if path is None:
            raise ConfigError(f"kl.reference: 'lm' needs a task with a reference LM, and task {self.task.name!r} "
                              "has none")
        try:
            lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except (OSError, ValueError) as err:
            raise ConfigError(f"kl.reference: cannot load the task's reference LM {path} "
                              f"({str(err).splitlines()[0]})") from None
        if lm.config.vocab_size != self.model.config.vocab_size:
            raise ConfigError(f"kl.reference: the task's reference LM {path} has a vocabulary of "
                              f"{lm.config.vocab_size} tokens, the policy {self.model.config.vocab_size}")
        if self.tokenizer.bos_token_id is None:
            raise ConfigError("kl.reference: 'lm' needs a tokenizer with a BOS token to condition the LM on")
        lm.requires_grad_(False)
        return lm.eval().to(self.device)

    # ------------------------------------------------------------------------------------------------- data
    def _next_prompts(self) -> list[str]:
        """The next ``prompts_per_step`` prompts of a seeded per-epoch shuffle (resumable from two integers)."""
        prompts = self.task.train_prompts
        out = []
        while len(out) < self.config.algo.prompts_per_step:
            order = list(range(len(prompts)))
            random.Random(self.config.seed * 1_000_003 + self.data_epoch).shuffle(order)
            out.append(prompts[order[self.data_index]])
            self.data_index += 1
            if self.data_index == len(prompts):
                self.data_epoch, self.data_index = self.data_epoch + 1, 0
        return out

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        # Decoder-only: left padding, and truncation keeps the END of a long prompt (the part being continued).
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left" if not self.model.config.is_encoder_decoder else "right"
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, truncation=True,
                             max_length=self.config.model.max_prompt_tokens)
        self.tokenizer.truncation_side = side
        return enc.input_ids.to(self.device), enc.attention_mask.to(self.device)

    def _decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """The texts of ``ids`` where ``mask`` is set (a rollout's responses, or its prompts as the model saw them)."""
        return self.tokenizer.batch_decode(ids.masked_fill(mask == 0, self.tokenizer.pad_token_id),
                                           skip_special_tokens=True)

    def _sample_eval(self, prompts: list[str], generator: torch.Generator) -> Rollout:
        """One response per prompt with the training sampling settings (greedy with ``eval.greedy``), from
        ``generator`` (evaluation's draws)."""
        query_ids, query_mask = self._encode(prompts)
        settings = self.config.sampling
        if self.config.eval.greedy:  # top-1 of the same distribution; the recorded log-probs stay at temperature T
            settings = dataclasses.replace(settings, top_k=1, top_p=1.0)
        return sample(self.model, query_ids, query_mask, settings,
                      pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
                      generator=generator, autocast_dtype=self.autocast_dtype)

    def _score(self, prompts: list[str], completions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores as a float tensor, and which samples are kept. Bad rewards stop the run (or are dropped)."""
        try:
            raw = self.task.reward_fn(prompts, completions)
            values = [float(v) for v in raw]
        except (TypeError, ValueError) as err:
            raise RewardError(f"reward function of task {self.task.name!r} did not return numbers: {err}") from None
        if len(values) != len(completions):
            raise RewardError(f"reward function of task {self.task.name!r} returned {len(values)} values for "
                              f"{len(completions)} completions")
        scores = torch.tensor(values, dtype=torch.float32, device=self.device)
        keep = torch.isfinite(scores)
        if not keep.all():
            bad = (~keep).nonzero().flatten().tolist()
            if self.config.bad_reward == "error":
                raise RewardError(f"reward function of task {self.task.name!r} returned non-finite values "
                                  f"{[values[i] for i in bad[:3]]} (samples {bad[:3]}); set bad_reward: drop to "
                                  "drop such samples instead")
            scores = torch.where(keep, scores, torch.zeros_like(scores))
        return scores, keep

    def _reference_texts(self) -> list[str]:
        """The texts perplexity is measured on (``eval.reference``). Initial-policy samples are drawn once, with
        a fixed seed (not the run's: every run of a comparison scores the same texts), and kept in the run
        directory, so a resumed run reads them back instead of drawing them from trained weights."""
        e = self.config.eval
        if self.model.config.is_encoder_decoder:
            return []  # no perplexity (see _check_task_inputs): the task's own metrics measure drift
        if e.reference == "task":
            return list(self.task.reference_texts[:e.num_texts])
        if e.every == 0:
            return []  # never evaluated: nothing to draw
        path = self.out_dir / "reference_texts.json"
        if path.is_file():
            texts = json.loads(path.read_text())
            if not (isinstance(texts, list) and len(texts) == e.num_texts and all(isinstance(t, str) for t in texts)):
                raise ValueError(f"{path}: expected a JSON list of {e.num_texts} strings (eval.num_texts); delete "
                                 "it only if the run restarts from scratch")
            return texts
        prompts = list(self.task.eval_prompts)
        prompts = [prompts[i % len(prompts)] for i in range(e.num_texts)]
        generator = torch.Generator(self.device).manual_seed(20_231_210)
        texts = []
        with torch.no_grad():
            for start in range(0, len(prompts), e.batch_size):
                r = self._sample_eval(prompts[start:start + e.batch_size], generator)
                # The prompt as the model saw it (truncated to max_prompt_tokens), then what it wrote.
                texts.extend(p + c for p, c in zip(self._decode(r.query_ids, r.query_mask),
                                                   self._decode(r.response_ids, r.response_mask)))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(texts, indent=1, ensure_ascii=False) + "\n")
        return texts

    # -------------------------------------------------------------------------------------------- the model
    @contextmanager
    def _kl_reference(self) -> Iterator[torch.nn.Module]:
        """π_ref for the KL penalty: the initial model, or the EMA weights (the authors' IMDB code)."""
        if self.config.kl.reference == "ema":
            with self.method.ema.ema_weights():
                yield self.model
        else:
            with self.reference.model() as ref:
                yield ref

    def _reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """log π_ref of each response token. The reference is the unmasked model: NLPO's mask restricts sampling,
        not what drift is measured against. ``kl.reference: lm`` scores the response alone, after the LM's BOS (a
        language model of the output language knows nothing of the prompt)."""
        if self.reference_lm is not None:
            start = torch.full_like(rollout.response_ids[:, :1], self.tokenizer.bos_token_id)
            alone = dataclasses.replace(rollout, query_ids=start, query_mask=torch.ones_like(start),
                                        action_mask=None)
            return self._forward(self.reference_lm, alone, masked=False).logprobs
        with self._kl_reference() as ref:
            return self._forward(ref, rollout, masked=False).logprobs

    def _forward(self, model, rollout: Rollout, *, hidden: bool = False, masked: bool = True,
                 entropy: bool = False, entropy_grad: bool = False):
        return forward_response(
            model, rollout, temperature=self.config.sampling.temperature, autocast_dtype=self.autocast_dtype,
            return_hidden=hidden, action_mask=rollout.action_mask if masked else None, entropy_grad=entropy_grad,
            compute_entropy=entropy or entropy_grad,
        )

    def lm_loss(self, texts: list) -> torch.Tensor:
        """Mean token NLL of the policy on ``texts`` (the multitask / S2P loss), scored as perplexity is; for an
        encoder-decoder policy, of each (source, target) pair's target given its source."""
        if self.model.config.is_encoder_decoder:
            if not all(isinstance(t, (tuple, list)) and len(t) == 2 for t in texts):
                raise ConfigError(f"method.name: multitask on an encoder-decoder policy needs (source, target) "
                                  f"pairs as task {self.task.name!r}'s pretrain_texts")
            nll, scored = seq2seq_nll(self.model, self.tokenizer, [s for s, _ in texts], [t for _, t in texts],
                                      max_tokens=self.config.eval.max_text_tokens, autocast_dtype=self.autocast_dtype)
        else:
            nll, scored = token_nll(self.model, self.tokenizer, texts, max_tokens=self.config.eval.max_text_tokens,
                                    autocast_dtype=self.autocast_dtype)
        return nll.sum() / scored.sum().clamp(min=1)

    # ---------------------------------------------------------------------------------------- one iteration
    def train_step(self) -> dict[str, Any]:
        c = self.config
        k = c.algo.samples_per_prompt
        times: dict[str, float] = {}
        t = time.perf_counter()

        # 1. Rollout: sample k completions per prompt (NLPO: only inside the mask model's top-p set).
        prompts = [p for p in self.dp.shard(self._next_prompts()) for _ in range(k)]
        query_ids, query_mask = self._encode(prompts)
        rollout = sample(self.model, query_ids, query_mask, self.config.sampling,
                         pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
                         generator=self.generator, mask_model=self.method.sampling_mask_model(),
                         mask_top_p=c.method.nlpo_top_p, min_tokens_to_keep=c.method.nlpo_min_tokens,
                         autocast_dtype=self.autocast_dtype)
        times["sample"], t = time.perf_counter() - t, time.perf_counter()

        # 2. Reward.
        completions = self._decode(rollout.response_ids, rollout.response_mask)
        scores, keep = self._score(prompts, completions)
        if c.algo.name == "rloo":  # a dropped sample would poison its group's leave-one-out baseline
            keep = keep.view(-1, k).all(dim=1, keepdim=True).expand(-1, k).reshape(-1)
        if not keep.any():
            raise RewardError("every sample of this batch had an invalid reward (bad_reward: drop)")
        mask = rollout.response_mask.float() * keep[:, None].float()
        times["reward"], t = time.perf_counter() - t, time.perf_counter()

        # 3. Log-probs of the sampling policy, and of the KL reference. When the update is a single optimizer step
        # on the whole batch (REINFORCE and RLOO with one minibatch; PPO with one epoch of one minibatch), the
        # policy the update differentiates IS the sampling policy, so the update's own forward (step 5) gives the
        # old log-probs and values, detached: one forward saved, and PPO's ratio is exactly 1 (as in TRL's GRPO with
        # one iteration). Otherwise PPO recomputes them with the teacher-forced forward its update compares
        # against. REINFORCE/RLOO with several minibatches: in fp32 the sampler's log-probs equal the teacher-forced
        # ones (to ~2e-5 on SmolLM2) and are reused; under bf16 the KV-cache path differs by ~0.04 nats per token,
        # which would put noise (and a non-zero KL at step 0) into the penalty, so they are recomputed.
        n = len(rollout)
        beta = self.kl_ctl.value if self.method.uses_kl else 0.0
        # A KL outside the reward is only logged: its reference forward is skipped between logged iterations.
        every = c.kl.log_every
        track_kl = beta != 0 or (every > 0 and (self.step + 1) % every == 0)
        minibatch = c.algo.minibatch_size // self.dp.world_size  # this rank's share of each minibatch
        updates = self.method.updates_policy
        fused = updates and minibatch >= n and (c.algo.name != "ppo" or c.algo.epochs == 1)
        old_logp = old_values = None
        with torch.no_grad():
            if not fused and self.value_head is not None:
                old = self._forward(self.model, rollout, hidden=True)
                old_logp, old_values = old.logprobs, self.value_head(old.hidden)
            elif not fused:
                old_logp = (self._forward(self.model, rollout).logprobs if self.autocast_dtype is not None
                            else rollout.logprobs)
            ref_logp = self._reference_logprobs(rollout) if track_kl else None
        times["ref"], t = time.perf_counter() - t, time.perf_counter()
        out = None
        if fused:
            out = self._forward(self.model, rollout, hidden=self.value_head is not None, entropy=True,
                                entropy_grad=bool(c.algo.entropy_coef))
            old_logp = out.logprobs.detach()
            if self.value_head is not None:
                old_values = self.value_head(out.hidden).detach()

        # 4. KL-penalised reward and advantages (paper eq. 1: R = r − β·log π/π_ref).
        if track_kl:
            kl_tok = torch.where(mask > 0, ops.kl_estimate(old_logp, ref_logp, c.kl.estimator), 0.0)
        else:
            kl_tok = torch.zeros_like(mask)
        seq_kl = kl_tok.sum(dim=1)
        advantages, returns = self._advantages(rollout, scores, keep, mask, kl_tok, seq_kl, beta, old_values)

        # 5. Policy (and value) update: epochs × minibatches.
        stats: dict[str, list[float]] = {}
        if not updates:
            pass  # method `frozen`
        elif fused:
            self._update(rollout, mask, advantages, old_logp, old_values, returns, stats, out=out)
            self.method.on_epoch_end()
        else:
            for _ in range(c.algo.epochs if c.algo.name == "ppo" else 1):
                order = torch.randperm(n, generator=self.generator, device=self.generator.device)
                for start in range(0, n, minibatch):
                    idx = order[start:start + minibatch]
                    self._update(rollout.select(idx), mask[idx], advantages[idx], old_logp[idx],
                                 None if old_values is None else old_values[idx],
                                 None if returns is None else returns[idx], stats)
                self.method.on_epoch_end()
        times["update"], t = time.perf_counter() - t, time.perf_counter()

        # 5b. A learning reward learns from the same batch (the Translation Game's listener, paper §4).
        learned: dict[str, float] = {}
        if self.learned_reward is not None:
            kept = keep.nonzero().flatten().tolist()
            learned = self.learned_reward.learn([prompts[i] for i in kept], [completions[i] for i in kept])
            times["reward_learn"] = time.perf_counter() - t

        # 6. Bookkeeping: KL controller, the method's end-of-iteration work (resets), metrics.
        if track_kl:  # of the whole batch: the controller moves alike on every rank
            mean_kl = self.dp.mean_of(seq_kl[keep])
            self.kl_ctl.update(mean_kl, n * self.dp.world_size)
        self.step += 1
        record: dict[str, Any] = {
            "step": self.step,
            "reward": float(scores[keep].mean()),
            "reward_std": float(scores[keep].std()) if int(keep.sum()) > 1 else 0.0,
            **({"kl": mean_kl} if track_kl else {}),
            "kl_coef": beta,
            "response_length": float(rollout.response_mask.sum(1).float().mean()),
            "dropped": int((~keep).sum()),
        }
        record.update({key: sum(v) / len(v) for key, v in stats.items()})
        record.update({f"reward_model/{key}": float(value) for key, value in learned.items()})
        record.update(self.method.on_iteration_end(self.step))
        record.update({f"time/{key}": round(value, 4) for key, value in times.items()})
        return mean_record(self.dp.gather_object(record)) if self.dp.enabled else record

    def _advantages(self, rollout: Rollout, scores, keep, mask, kl_tok, seq_kl, beta: float, old_values):
        """Advantages (and PPO's value targets) from the scores and the per-token KL penalty."""
        c = self.config.algo
        returns = None
        if c.name == "ppo":
            # Over every response (a dropped one has score 0 here); `mask` then keeps dropped ones out of the loss.
            full = rollout.response_mask.float()
            rewards = ops.token_rewards(scores, beta * kl_tok, full)
            advantages, returns = ops.gae(rewards, old_values, full, c.gamma, c.lam)
        else:
            seq_return = scores - beta * seq_kl
            if c.name == "rloo":
                seq_adv = ops.rloo_advantages(seq_return, c.samples_per_prompt)
            else:
                # The baseline is used before it sees this batch; the first batch is centred on its own mean.
                batch_mean = self.dp.mean_of(seq_return[keep])
                base = self.baseline.value
                seq_adv = seq_return - (batch_mean if base is None else base)
                self.baseline.update(batch_mean)
            advantages = seq_adv[:, None].expand_as(mask).clone()
        if c.whiten_advantages:
            advantages = self.dp.whiten(advantages, mask)
        return torch.where(mask > 0, advantages, 0.0), returns

    def _update(self, mb: Rollout, mask, advantages, old_logp, old_values, returns, stats, out=None) -> None:
        """One optimizer step on a minibatch (``out``: its forward, when the caller already ran it)."""
        c = self.config.algo
        if out is None:
            out = self._forward(self.model, mb, hidden=self.value_head is not None, entropy=True,
                                entropy_grad=bool(c.entropy_coef))
        if c.name == "ppo":
            loss, st = ops.ppo_policy_loss(out.logprobs, old_logp, advantages, mask, c.clip_range)
            vloss, vst = ops.value_loss(self.value_head(out.hidden), old_values, returns, mask, c.clip_range_value)
            st = {**st, **vst, "policy_loss": float(loss.detach()), "value_loss": float(vloss.detach())}
            loss = loss + c.vf_coef * vloss
        else:
            loss = -ops.masked_mean(out.logprobs * advantages, mask)
            st = {"policy_loss": float(loss.detach())}
        entropy = ops.masked_mean(out.entropy, mask)
        st["entropy"] = float(entropy.detach())
        if c.entropy_coef:
            loss = loss - c.entropy_coef * entropy
        extra = self.method.extra_loss()
        if extra is not None:
            loss = loss + extra[0]
            st.update(extra[1])
        self.optimizer.zero_grad(set_to_none=True)
        self._check_finite("loss", loss)
        loss.backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.dp.average_gradients(params)
        if c.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        self._check_finite("gradient norm", grad_norm)
        st["grad_norm"] = float(grad_norm)
        self.optimizer.step()
        self.method.on_optimizer_step()
        for key, value in st.items():
            stats.setdefault(key, []).append(float(value))

    def _check_finite(self, what: str, value: torch.Tensor) -> None:
        """Stop before a NaN/inf reaches the weights: the last checkpoint on disk stays the last good state."""
        if torch.isfinite(value).all():
            return
        self.optimizer.zero_grad(set_to_none=True)
        saved = list_checkpoints(self.out_dir)
        raise NonFiniteError(
            f"step {self.step + 1}: the {what} of the policy update is {value.item()}; the run stopped without "
            "applying it. " + (f"Its last good state is {saved[-1]}." if saved else "No checkpoint was written yet.")
            + " Lower algo.lr (or set algo.max_grad_norm) and start again in another --out")

    # ------------------------------------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, Any]:
        """Validation reward, drift (perplexity on held-out text, KL to the initial model on fresh samples), task
        metrics; the same for the EMA weights where the method keeps one. Uses its own RNG, so evaluating never
        changes the training stream."""
        record = self._evaluate_current("eval")
        if self.method.ema is not None and self.config.eval.ema:
            with self.method.ema.ema_weights():
                record.update(self._evaluate_current("eval_ema"))
        return record

    @torch.no_grad()
    def _evaluate_current(self, prefix: str, prompts: list[str] | None = None) -> dict[str, Any]:
        e = self.config.eval
        if prompts is None:
            prompts = self.task.eval_prompts[:e.num_prompts]
        prompts = [p for p in prompts for _ in range(e.samples_per_prompt)]
        # The same noise at every evaluation: differences between steps come from the weights, not the draw.
        generator = torch.Generator(self.device).manual_seed(self.config.seed + 1_000_003)
        scores, completions, kls = [], [], []
        for start in range(0, len(prompts), e.batch_size):
            chunk = prompts[start:start + e.batch_size]
            rollout = self._sample_eval(chunk, generator)
            texts = self._decode(rollout.response_ids, rollout.response_mask)
            chunk_scores, keep = self._score(chunk, texts)
            logp = self._forward(self.model, rollout).logprobs
            with self.reference.model() as ref:
                ref_logp = self._forward(ref, rollout).logprobs
            mask = rollout.response_mask.float()
            kls.append(torch.where(mask > 0, logp - ref_logp, 0.0).sum(1))
            scores.append(chunk_scores[keep])
            completions.extend(texts)
        record = {
            f"{prefix}/reward": float(torch.cat(scores).mean()),
            f"{prefix}/kl_init": float(torch.cat(kls).mean()),
        }
        if self.reference_texts:
            record[f"{prefix}/perplexity"] = perplexity(self.model, self.tokenizer, self.reference_texts,
                                                        max_tokens=e.max_text_tokens, batch_size=e.batch_size,
                                                        autocast_dtype=self.autocast_dtype)
        if self.task.metrics_fn is not None:
            for key, value in self.task.metrics_fn(prompts, completions).items():
                record[f"{prefix}/{key}"] = float(value)
        record[f"{prefix}/sample"] = completions[0]
        return record

    # ---------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The run's state. Under data parallelism every rank must call it (it gathers each rank's random state;
        everything else is identical on every rank)."""
        state = {
            "step": self.step,
            "data": {"epoch": self.data_epoch, "index": self.data_index},
            "trainable": {n: p.detach().clone() for n, p in trainable_named_parameters(self.model)},
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "kl_ctl": self.kl_ctl.state_dict(),
            "baseline": self.baseline.state_dict(),
            "method": self.method.state_dict(),
            "reward_model": self.learned_reward.state_dict() if self.learned_reward is not None else None,
            "generator": self.generator.get_state(),
            "generator_device": self.device.type,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }
        if self.dp.enabled:
            state["world_size"] = self.dp.world_size
            state["rank_rngs"] = self.dp.gather_object(
                {key: state[key] for key in ("generator", "torch_rng", "python_rng")})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = dict(trainable_named_parameters(self.model))
        if set(params) != set(state["trainable"]):
            raise ValueError("checkpoint: its trainable parameters do not match this model's")
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                params[name].copy_(tensor)
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.baseline.load_state_dict(state["baseline"])
        self.method.load_state_dict(state["method"])
        if self.learned_reward is not None:
            if state.get("reward_model") is None:
                raise ValueError("checkpoint: it holds no state of the task's learning reward")
            self.learned_reward.load_state_dict(state["reward_model"])
        saved_by = state.get("world_size", 1)
        if saved_by != self.dp.world_size:
            raise ConfigError(f"checkpoint: written by a run of {saved_by} process(es), and its random state "
                              f"cannot continue exactly on {self.dp.world_size}; resume it with "
                              + ("`accelerate launch --num_processes " + str(saved_by) + "`" if saved_by > 1
                                 else "one process (no accelerate launch)"))
        if self.dp.enabled:
            state = {**state, **state["rank_rngs"][self.dp.rank]}
        saved_on = state.get("generator_device", "cpu")
        if saved_on != self.device.type:
            raise ConfigError(f"model.device: this checkpoint was written by a run on {saved_on}, and its random "
                              f"state cannot continue exactly on {self.device.type}; resume with "
                              f"--set model.device={saved_on}")
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.step = int(state["step"])
        self.data_epoch, self.data_index = int(state["data"]["epoch"]), int(state["data"]["index"])

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0; every rank takes part). Returns its path, None on other ranks."""
        state = self.state_dict()
        path = (save_checkpoint(self.out_dir, self.step, state, keep=self.config.keep_checkpoints)
                if self.dp.is_main else None)
        self.dp.barrier()  # no rank runs ahead of a checkpoint that may yet fail to be written
        return path

    def _resume(self) -> None:
        """Continue from the newest checkpoint that loads, and cut ``metrics.jsonl`` back to its step (the
        resumed run writes the later records again). A run directory that cannot be continued exactly (metrics
        behind the checkpoint, checkpoints lost after they were written) stops with an error naming the file;
        it never restarts from step 0 over existing results."""
        stale = (remove_stale_temps(self.out_dir) + remove_stale_temps(checkpoint_dir(self.out_dir))
                 if self.dp.is_main else [])
        if stale:
            warnings.warn(f"{self.out_dir}: removed {len(stale)} temporary file(s) left by a killed save "
                          f"({', '.join(p.name for p in stale)})", RunRecoveryWarning, stacklevel=3)
        metrics_path = self.metrics.path
        records = self.metrics.records()
        last = max((r["step"] for r in records), default=None)
        found = load_latest(self.out_dir)
        if found is None:
            first = self.config.checkpoint_every or self.config.steps
            if last is not None and last >= first:
                raise RunFileError(
                    f"{checkpoint_dir(self.out_dir)}: no checkpoint, but {metrics_path} has records up to step "
                    f"{last} and the first checkpoint is written at step {first}: the checkpoints were lost. "
                    f"Start again in another --out (or delete {self.out_dir} to train it again from step 0)")
            if records and self.dp.is_main:
                warnings.warn(f"{self.out_dir}: killed before its first checkpoint (step {first}); starting again "
                              f"from step 0 and dropping the {len(records)} record(s) written so far",
                              RunRecoveryWarning, stacklevel=3)
            self._truncate_metrics(-1)
            return
        path, state = found
        self.load_state_dict(state)
        if last is None or last < self.step:
            raise RunFileError(
                f"{metrics_path}: " + ("missing" if last is None else f"ends at step {last}")
                + f", behind the checkpoint {path.name}: the records up to step {self.step} are lost and a resumed "
                "run would not rewrite them. Restore the file, or start again in another --out")
        self._truncate_metrics(self.step)

    def _truncate_metrics(self, step: int) -> None:
        if self.dp.is_main:
            self.metrics.truncate_after(step)
        self.dp.barrier()  # the other ranks read metrics.jsonl above: not while rank 0 rewrites it

    # ---------------------------------------------------------------------------------------------- the run
    def _log(self, record: dict[str, Any]) -> None:
        if not self.dp.is_main:
            return
        self.metrics.write(record)
        if self.config.tensorboard:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(self.out_dir / "tensorboard")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step" and math.isfinite(value):
                    self._tb.add_scalar(key, value, record["step"])

    def _eval_due(self, step: int) -> bool:
        every = self.config.eval.every
        return every > 0 and (step % every == 0 or step == self.config.steps)

    def train(self) -> list[dict[str, Any]]:
        """Run until ``config.steps`` iterations; returns the records written this call."""
        from tqdm.auto import tqdm

        written = []
        self._cast_frozen_weights()

        def evaluate(prefix: str = "eval") -> None:
            # Rank 0 evaluates, the others wait for it (evaluation draws its own noise: it changes no state).
            if self.dp.is_main:
                test_prompts = self.task.test_prompts[:self.config.eval.num_test_prompts]
                record = {"step": self.step, **(self.evaluate() if prefix == "eval" else
                                                self._evaluate_current("test", test_prompts))}
                self._log(record)
                written.append(record)
            self.dp.barrier()

        if self.step == 0 and self._eval_due(0):
            evaluate()
        bar = tqdm(total=self.config.steps, initial=self.step, disable=not self.config.progress or not self.dp.is_main,
                   desc=f"{self.config.method.name}", dynamic_ncols=True)
        try:
            while self.step < self.config.steps:
                record = self.train_step()
                self._log(record)
                written.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}",  # kl only on the iterations that compute it
                                **({"kl": f"{record['kl']:.3f}"} if "kl" in record else {}))
                if self._eval_due(self.step):
                    evaluate()
                every = self.config.checkpoint_every
                if (every and self.step % every == 0) or self.step == self.config.steps:
                    self.save()
            tested = any(r["step"] == self.step and "test/reward" in r for r in self.metrics.records())
            if self.task.test_prompts and not tested:
                evaluate("test")  # once, on the final weights: the task's test split (the Translation Game's table)
        finally:
            bar.close()
            self.close()
            self.metrics.close()
            if self._tb is not None:
                self._tb.close()
        return written

