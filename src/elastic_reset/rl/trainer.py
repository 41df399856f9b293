"""The training loop: rollout → reward → KL-penalised advantages → policy update, with a drift-control method.

One *iteration* (the ``step`` of ``metrics.jsonl``) samples ``prompts_per_step × samples_per_prompt``
completions, scores them, and runs ``epochs`` passes of minibatch updates over them. Set-up is
:class:`RLTrainer`'s constructor; read :meth:`RLTrainer.train_step` top to bottom for the whole algorithm. The
run directory is :mod:`~elastic_reset.rl.rundir`'s, evaluation :mod:`~elastic_reset.rl.evaluation`'s, the
algorithm's maths :mod:`~elastic_reset.rl.estimators`' and the drift-control method's :mod:`~elastic_reset.rl.methods`'.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import get_scheduler

from elastic_reset.errors import (ConfigError, ElasticResetError, NonFiniteError, RewardError, RunFileError,
                                  first_line)
from elastic_reset.lm.cpu_bf16 import precast_weights, release_packed_linears, use_fp32_attention
from elastic_reset.lm.device import autocast_dtype, resolve_device
from elastic_reset.lm.rollout import Rollout
from elastic_reset.lm.scoring import ResponseOutput, contiguous_head_input
from elastic_reset.rl import ops
from elastic_reset.rl.checkpoint import list_checkpoints, save_checkpoint
from elastic_reset.rl.components import build_components
from elastic_reset.rl.config import TrainConfig, config_to_dict
from elastic_reset.rl.distributed import DataParallel, mean_record
from elastic_reset.rl.estimators import Minibatch, build_estimator
from elastic_reset.rl.evaluation import Evaluator
from elastic_reset.rl.export import hub_token, push_folder, save_run_policy
from elastic_reset.rl.methods import PolicyHandle, build_method
from elastic_reset.rl.policy import (
    Policy,
    Reference,
    context_length,
    load_model_and_tokenizer,
    trainable_named_parameters,
)
from elastic_reset.rl.reward import CheckedReward, RewardResult, add_logged, completion_rows, component_means
from elastic_reset.rl.rundir import RunDirectory
from elastic_reset.rl.tracking import Trackers
from elastic_reset.tasks import Task, get_task


class _Clock:
    """Wall-clock seconds of the phases of an iteration, each since the previous one."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.times[phase], self._last = now - self._last, now


class CheckpointMismatch(ValueError):
    """A checkpoint's tensors that do not fit the model being resumed."""


class RLTrainer:
    """Runs one training run into ``out_dir`` (config, ``metrics.jsonl``, checkpoints).

    Args:
        config: a validated :class:`TrainConfig`.
        out_dir: the run directory. It must not hold a run already unless ``resume=True``. It is locked while
            the trainer lives (until :meth:`train` returns or :meth:`close`): a second writer is refused.
        task: the task; by default ``config.task`` is looked up in the task registry.
        resume: continue from the latest checkpoint in ``out_dir`` (from scratch if it has none yet).

    A set-up error leaves no run behind (nothing but the lock is written until the set-up has succeeded).
    """

    def __init__(self, config: TrainConfig, out_dir: str | Path, *, task: Task | None = None,
                 resume: bool = False):
        config.validate()
        self.config = config
        self.out_dir = Path(out_dir)
        # Under `accelerate launch`: one rank of several (rl/distributed.py); otherwise the identity.
        self.dp = DataParallel.from_environment(resolve_device(config.model.device).type)
        # refused before any work, not after the run
        self._hub_token = hub_token("push_to_hub") if config.push_to_hub and self.dp.is_main else None
        self.run = RunDirectory(self.out_dir, config, is_main=self.dp.is_main)
        self._frozen_casts: ExitStack | None = None
        try:
            self.run.claim(resume)
            self.dp.barrier()  # every rank has checked the run directory before rank 0 writes to it
            self._set_up(task)
            if resume:
                found = self.run.checkpoint_to_resume()
                self.dp.barrier()  # the other ranks read metrics.jsonl above: not while rank 0 rewrites it
                if found is not None:
                    self._resume_from(*found)
            self.run.write_config(self.task.name, self.task.score_key, self.task.drift_key)
            for component in self.components if self.dp.is_main else ():
                component.save(self.out_dir)
        except BaseException:
            self.close()
            self.run.abandon()
            raise

    def _set_up(self, task: Task | None) -> None:
        config = self.config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.task = task or get_task(config.task.name, config.task.data_dir, **config.task.options)

        self.model, self.tokenizer = load_model_and_tokenizer(config.model, seed=config.seed)
        bind = getattr(self.task, "bind_tokenizer", None)
        if bind is not None:  # prompts that depend on the tokenizer (a chat template)
            bind(self.tokenizer)
        self.device = self.dp.device(resolve_device(config.model.device))
        self.model.to(self.device)  # before any copy of it (reference, NLPO mask model, EMA)
        contiguous_head_input(self.model)
        self.is_lora = config.model.lora is not None
        self.autocast_dtype = autocast_dtype(config.model.autocast, self.device)
        use_fp32_attention(self.model, self.autocast_dtype)  # before any copy of the model (reference, NLPO mask)
        self.policy = Policy(self.model, self.tokenizer, sampling=config.sampling,
                             max_prompt_tokens=config.model.max_prompt_tokens, autocast_dtype=self.autocast_dtype,
                             max_text_tokens=config.eval.max_text_tokens,
                             recompute=config.model.activation_checkpointing)
        self.reward = CheckedReward(self.task.reward_fn, self.task.name, config.bad_reward, self.device,
                                    max_steps=config.steps)
        self._check_task_inputs()

        self.reference = Reference(self.model, self.is_lora)
        self.reference_lm = self._load_reference_lm() if config.kl.reference == "lm" else None
        self._cast_frozen_weights()
        self.trainable_params = [p for _, p in trainable_named_parameters(self.model)]
        self.estimator = build_estimator(config.algo, self.dp, config.sampling.max_new_tokens,
                                         self.model.config.hidden_size, self.device)
        self.value_head = self.estimator.value_head
        params = self.trainable_params + (list(self.value_head.parameters()) if self.value_head else [])
        self.optimizer = torch.optim.AdamW(params, lr=config.algo.lr, eps=config.algo.adam_eps,
                                           betas=(0.9, config.algo.adam_beta2), weight_decay=config.algo.weight_decay)
        self.scheduler = None if config.algo.lr_scheduler == "constant" else self._build_scheduler()
        a = config.algo
        self.entropy_ctl = (ops.AdaptiveEntropyCoef(a.entropy_coef, a.entropy_target, a.entropy_coef_delta,
                                                    a.entropy_coef_min, a.entropy_coef_max)
                            if a.entropy_target is not None else None)
        self.kl_ctl = (ops.AdaptiveKLController(config.kl.coef, config.kl.target, config.kl.horizon)
                       if config.kl.target is not None else ops.FixedKLController(config.kl.coef))
        self.method = build_method(config.method)
        self.method.setup(PolicyHandle(self.model, self.optimizer, list(self.task.pretrain_texts), self.policy.nll))
        self.evaluator = Evaluator(self.policy, self.task, config, self.reference, self.reward, self.run)
        # from the initial weights, which the model still holds here (Selective Rehearsal's set)
        self.components = build_components(config, self.task, self.policy, self.reward, self.dp, self.out_dir,
                                           self.tokenizer.pad_token_id)
        self.hooks = [self.method, *self.components]
        reserved = {p for component in self.components for p in component.reserved_prompts}
        self.train_prompts = [p for p in self.task.train_prompts if p not in reserved]
        # Before any resume: the model still holds the initial weights here. Rank 0 alone evaluates.
        if self.dp.is_main:
            self.evaluator.load_initial()

        # On the model's device: sampling draws its noise there (a CPU generator cannot feed CUDA's rand). Each
        # data-parallel rank draws its own samples; rank 0's stream is the single-process one.
        self.generator = torch.Generator(self.device).manual_seed(config.seed + 1_000_033 * self.dp.rank)
        self.step = 0
        self._unseen_eval: dict[str, float] = {}  # the latest evaluation, until the method has seen it
        self.data_epoch, self.data_index = 0, 0
        self.metrics = self.run.metrics
        self._trackers: Trackers | None = None

    def _cast_frozen_weights(self) -> None:
        """Under bf16 autocast, cast the weights that never change (a LoRA base, the reference copy) to bf16 once,
        instead of at every forward: autocast caches its casts only for weights that require grad. Same numbers
        (autocast computes with the same bf16 values); faster forwards (BENCHMARKS.md). The sampler casts the
        trainable weights itself, once per rollout. Costs memory: the fp32 originals stay, so the frozen weights
        take 1.5x their fp32 size. Until :meth:`close` (``train()`` calls it at the end) puts the fp32 weights
        back, ``trainer.model`` needs autocast to run."""
        if self._frozen_casts is not None or self.autocast_dtype is None:
            return
        self._frozen_casts = ExitStack()
        self._frozen_casts.enter_context(precast_weights(self.model, self.autocast_dtype, trainable=False))
        if not self.is_lora:
            with self.reference.model() as ref:
                self._frozen_casts.enter_context(precast_weights(ref, self.autocast_dtype, trainable=False))

    def close(self) -> None:
        """Give the model its fp32 frozen weights back and release the run directory. Idempotent."""
        self._restore_fp32_weights()
        self.run.release()

    def _restore_fp32_weights(self) -> None:
        """Put the fp32 frozen weights back (see :meth:`_cast_frozen_weights`) and drop the sampler's packs of
        them. Idempotent."""
        if self._frozen_casts is not None:
            self._frozen_casts.close()
            self._frozen_casts = None
        if hasattr(self, "model"):
            release_packed_linears(self.model)

    # ------------------------------------------------------------------------------------------ set-up checks
    def _check_task_inputs(self) -> None:
        ctx = context_length(self.model)
        cut = self.config.model.max_prompt_tokens
        longest = None
        if cut is None or not self.task.cut_prompts:  # the prompts' own lengths matter: measured once
            prompts = [*self.task.train_prompts, *self.task.eval_prompts, *self.task.test_prompts,
                       *(p for ps in self.task.eval_sets.values() for p in ps)]
            lengths = [len(ids) for ids in self.tokenizer(prompts)["input_ids"]]
            longest = max(lengths)
            over = sum(n > cut for n in lengths) if cut is not None else 0
            if over:
                warnings.warn(f"model.max_prompt_tokens: {over} of the task's {len(lengths)} prompts are longer than "
                              f"{cut} tokens (the longest: {longest}) and are cut to their last {cut}; set it to "
                              f"{longest}, or to null for no cut", stacklevel=2)
        needed = (longest if cut is None else cut) + self.config.sampling.max_new_tokens
        if ctx is not None and not self.model.config.is_encoder_decoder and needed > ctx:
            what = f"the longest prompt ({longest} tokens)" if cut is None else "model.max_prompt_tokens"
            raise ConfigError(f"model.max_prompt_tokens: {what} + sampling.max_new_tokens = {needed} exceeds the "
                              f"model's context length {ctx}")
        weights = getattr(self.task.reward_fn, "weights", None)
        if self.config.algo.reward_aggregation != "sum" and not weights:
            raise ConfigError(f"algo.reward_aggregation: normalize_then_sum aggregates a task's several weighted "
                              f"rewards (the prompts task's); task {self.task.name!r} has one reward")
        n = self.config.algo.prompts_per_step
        if len(self.task.train_prompts) < n:
            raise ConfigError(f"algo.prompts_per_step: {n} exceeds the task's {len(self.task.train_prompts)} "
                              "training prompts")
        if self.dp.enabled:
            self.dp.check_divides("algo.prompts_per_step", n)
            self.dp.check_divides("algo.minibatch_size", self.config.algo.minibatch_size)
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
                              f"({first_line(err)})") from None
        if lm.config.vocab_size != self.model.config.vocab_size:
            raise ConfigError(f"kl.reference: the task's reference LM {path} has a vocabulary of "
                              f"{lm.config.vocab_size} tokens, the policy {self.model.config.vocab_size}")
        if self.tokenizer.bos_token_id is None:
            raise ConfigError("kl.reference: 'lm' needs a tokenizer with a BOS token to condition the LM on")
        lm.requires_grad_(False)
        return lm.eval().to(self.device)

    # ------------------------------------------------------------------------------------------------- data
    def _next_prompts(self) -> list[str]:
        """The next ``prompts_per_step`` prompts of a seeded per-epoch shuffle, or of the task's order
        (``algo.shuffle_prompts``); resumable from two integers."""
        prompts = self.train_prompts
        out = []
        while len(out) < self.config.algo.prompts_per_step:
            order = list(range(len(prompts)))
            if self.config.algo.shuffle_prompts:
                random.Random(self.config.seed * 1_000_003 + self.data_epoch).shuffle(order)
            out.append(prompts[order[self.data_index]])
            self.data_index += 1
            if self.data_index == len(prompts):
                self.data_epoch, self.data_index = self.data_epoch + 1, 0
        return out

    # ------------------------------------------------------------------------------------- the KL reference
    def _reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """log π_ref of each response token: the initial model, the EMA weights (``kl.reference: ema``, the
        authors' IMDB code) or the task's LM (``lm``). The reference is the unmasked model: NLPO's mask restricts
        sampling, not what drift is measured against. ``lm`` scores the response alone, after the LM's BOS (a
        language model of the output language knows nothing of the prompt)."""
        if self.reference_lm is not None:
            start = torch.full_like(rollout.response_ids[:, :1], self.tokenizer.bos_token_id)
            alone = Rollout(query_ids=start, query_mask=torch.ones_like(start), response_ids=rollout.response_ids,
                            response_mask=rollout.response_mask, logprobs=rollout.logprobs)
            return self.policy.score(alone, self.reference_lm, masked=False).logprobs
        swapped = self.method.kl_reference()  # an anchor's reference copy or EMA, swapped into the policy
        if swapped is None and self.config.kl.reference == "ema":
            swapped = self.method.ema_weights()
        if swapped is not None:
            with swapped:
                return self.policy.score(rollout, masked=False).logprobs
        with self.reference.model() as ref:
            return self.policy.score(rollout, ref, masked=False).logprobs

    def _build_scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """transformers' schedule of ``algo.lr_scheduler`` over the run's steps; a setting it does not take (in
        ``algo.lr_scheduler_kwargs``) is a one-line error naming it."""
        a = self.config.algo
        try:
            return get_scheduler(a.lr_scheduler, self.optimizer, num_warmup_steps=a.warmup_steps,
                                 num_training_steps=self.config.steps,
                                 scheduler_specific_kwargs=dict(a.lr_scheduler_kwargs) or None)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"algo.lr_scheduler_kwargs: {dict(a.lr_scheduler_kwargs)!r} for "
                              f"{a.lr_scheduler}: {first_line(err)}") from None

    # ---------------------------------------------------------------------------------------- one iteration
    def train_step(self) -> dict[str, Any]:
        c, clock = self.config, _Clock()
        k = c.algo.samples_per_prompt

        # 1. Rollout: sample k completions per prompt (NLPO: only inside the mask model's top-p set).
        prompts = [p for p in self.dp.shard(self._next_prompts()) for _ in range(k)]
        rollout = self.policy.sample(prompts, self.generator, mask=self.method.sampling_mask())
        clock("sample")

        # 2. Reward.
        completions = self.policy.decode(rollout.response_ids, rollout.response_mask)
        scored = self.reward(prompts, completions, rollout, step=self.step)
        if c.log_completions and self.dp.is_main:
            self._log_completions(prompts, completions, scored)
        keep = self.estimator.kept(scored.keep)
        if not keep.any():
            raise RewardError("every sample of this batch had an invalid reward (bad_reward: drop)")
        mask = rollout.response_mask.float() * keep[:, None].float()
        clock("reward")

        # 3. Log-probs of the sampling policy and of the KL reference (a KL outside the reward is only logged: its
        # reference forward is skipped between logged iterations).
        n = len(rollout)
        beta = self.kl_ctl.value if self.method.uses_kl else 0.0
        track_kl = beta != 0 or (c.kl.log_every > 0 and (self.step + 1) % c.kl.log_every == 0)
        minibatch = c.algo.minibatch_size // self.dp.world_size  # this rank's share of each minibatch
        fused = self.method.updates_policy and minibatch >= n and self.estimator.epochs == 1
        old_logp, old_values, ref_logp, fused_out = self._old_and_reference(rollout, fused, track_kl, clock)

        # 4. KL-penalised reward and advantages (paper eq. 1: R = r − β·log π/π_ref).
        kl_tok = (torch.where(mask > 0, ops.kl_estimate(old_logp, ref_logp, c.kl.estimator), 0.0) if track_kl
                  else torch.zeros_like(mask))
        advantages, returns = self.estimator.advantages(self._advantage_scores(scored, keep, k), keep, mask,
                                                        rollout.response_mask, kl_tok, beta, old_values)
        ended = self.policy.ended(rollout)
        # DAPO / TRL: a cut-off response's reward shaped its group's baseline above, but it adds no gradient
        loss_mask = mask * ended[:, None] if c.algo.mask_truncated_completions else mask
        batch = Minibatch(loss_mask, advantages, old_logp, old_values, returns)

        # 5. Policy (and value) update: epochs × minibatches; one step on the whole batch when fused.
        stats = self._update_epochs(rollout, batch, fused_out, minibatch) if self.method.updates_policy else []
        clock("update")

        # 5b. The components see the kept samples (a reward that learns learns from them, paper §4).
        kept = keep.nonzero().flatten().tolist()
        kept_prompts, kept_completions = [prompts[i] for i in kept], [completions[i] for i in kept]
        seen = {k: v for hook in self.hooks for k, v in hook.on_batch(kept_prompts, kept_completions).items()}
        if seen:
            clock("components")

        # 6. Bookkeeping: the lr schedule, KL controller, the method's end-of-iteration work (resets), metrics.
        lr = self.optimizer.param_groups[0]["lr"]  # this iteration's
        if self.scheduler is not None:
            self.scheduler.step()
        mean_kl = self.dp.mean_of(kl_tok.sum(dim=1)[keep]) if track_kl else None  # the whole batch's: alike on ranks
        if mean_kl is not None:
            self.kl_ctl.update(mean_kl, n * self.dp.world_size)
        self.step += 1
        return self._record(scored, keep, rollout, ended, beta, mean_kl, lr, stats, seen, clock.times)

    def _update_epochs(self, rollout: Rollout, batch: Minibatch, fused_out: ResponseOutput | None,
                       minibatch: int) -> list[dict[str, float]]:
        """``epochs`` passes of minibatch updates over the rollout (one step on the whole batch, on the forward
        ``fused_out``, when given); each optimizer step's statistics."""
        n = len(rollout)
        step_tokens = None
        if self.config.algo.loss_aggregation == "batch_token":  # every rank's tokens, per rank and minibatch (dapo)
            steps = 1 if fused_out is not None else math.ceil(n / minibatch)
            step_tokens = max(self.dp.sum([float(batch.mask.sum())])[0], 1.0) / (steps * self.dp.world_size)
        stats = []
        for _ in range(self.estimator.epochs):
            if fused_out is not None:
                stats.append(self._update(rollout, batch, fused_out, step_tokens))
            else:
                order = torch.randperm(n, generator=self.generator, device=self.generator.device)
                for start in range(0, n, minibatch):
                    idx = order[start:start + minibatch]
                    stats.append(self._update(rollout.select(idx), batch.select(idx), step_tokens=step_tokens))
            self.method.on_epoch_end()
        return stats

    def _old_and_reference(self, rollout: Rollout, fused: bool, track_kl: bool, clock: _Clock) -> tuple:
        """The sampling policy's log-probs and values, the KL reference's log-probs (None when not tracked) and the
        fused update's forward (None when not fused). When the update is a single optimizer step on the whole batch
        (one epoch of one minibatch), the policy the update differentiates IS the sampling policy, so the update's
        own forward gives the old log-probs and values, detached: one forward saved, and PPO's ratio is exactly 1
        (as in TRL's GRPO with one iteration). Otherwise they come from a teacher-forced forward, except
        REINFORCE/RLOO in fp32, where the sampler's log-probs equal it (under bf16 the KV-cache path differs enough
        to put noise, and a KL at step 0, into the penalty) unless a ratio needs NLPO's masked distribution, which
        the sampler does not record."""
        old_logp = old_values = fused_out = None
        with torch.no_grad():
            masked_ratio = rollout.action_mask is not None and self.config.algo.ratio != "none"
            if not fused and (self.value_head is not None or self.autocast_dtype is not None or masked_ratio):
                old = self.policy.score(rollout, hidden=self.value_head is not None)
                old_logp, old_values = old.logprobs, self.estimator.values(old)
            elif not fused:
                old_logp = rollout.logprobs
            ref_logp = self._reference_logprobs(rollout) if track_kl else None
        clock("ref")
        if fused:
            fused_out = self._policy_forward(rollout)
            old_logp = fused_out.logprobs.detach()
            old_values = None if self.value_head is None else self.estimator.values(fused_out).detach()
        return old_logp, old_values, ref_logp, fused_out

    def _record(self, scored: RewardResult, keep: torch.Tensor, rollout: Rollout, ended: torch.Tensor, beta: float,
                mean_kl: float | None, lr: float, stats: list[dict[str, float]], seen: dict[str, float],
                times: dict[str, float]) -> dict[str, Any]:
        """The iteration's metrics record (every rank's mean under data parallelism); the method's end-of-iteration
        work (resets) runs here, on what it says."""
        scores = scored.scores
        record: dict[str, Any] = {
            "step": self.step,
            "reward": float(scores[keep].mean()),
            "reward_std": float(scores[keep].std()) if int(keep.sum()) > 1 else 0.0,
            **({"kl": mean_kl} if mean_kl is not None else {}),
            "kl_coef": beta,
            "lr": lr,
            "response_length": float(rollout.response_lengths.float().mean()),
            "clipped_ratio": float((~ended).float().mean()),
            "dropped": int((~keep).sum()),
            **{f"rewards/{name}": value for name, value in component_means([scored.components]).items()},
        }
        for key in dict.fromkeys(key for st in stats for key in st):  # each statistic's mean over the minibatches
            values = [st[key] for st in stats if key in st]
            record[key] = sum(values) / len(values)
        record.update(seen)  # what the components logged
        record.update(self.method.on_iteration_end(self.step, {**self._unseen_eval, **record}))
        self._unseen_eval = {}
        record.update({f"time/{key}": round(value, 4) for key, value in times.items()})
        if self.device.type == "cuda":  # what the process has held on the GPU so far (compare --jobs sizes by it)
            record["memory/gpu_peak_gib"] = round(torch.cuda.max_memory_reserved(self.device) / 2**30, 3)
        add_logged(record, component_means([scored.logged]))  # last: never over a key the trainer logs
        return mean_record(self.dp.gather_object(record)) if self.dp.enabled else record

    def _advantage_scores(self, scored: RewardResult, keep: torch.Tensor, k: int) -> torch.Tensor:
        """The reward the advantages see (the logged one is the task's): its rewards normalised in their groups
        before the sum (``algo.reward_aggregation``), then clipped (``algo.reward_clip_range``)."""
        a = self.config.algo
        scores = scored.scores
        if a.reward_aggregation == "normalize_then_sum":
            parts = [[math.nan if v is None else v for v in values] for values in scored.components.values()]
            grouped = ops.group_normalized_sum(torch.tensor(parts, device=scores.device).T,
                                               self.task.reward_fn.weights, k)
            scores = torch.where(keep, grouped, 0.0)
        return scores if a.reward_clip_range is None else scores.clamp(*a.reward_clip_range)

    def _log_completions(self, prompts: list[str], completions: list[str], scored: RewardResult) -> None:
        """This iteration's samples into ``completions.jsonl`` and the trackers' ``completions`` table."""
        rows = completion_rows(self.step + 1, prompts, completions,
                               [float(v) if k else None for v, k in zip(scored.scores.tolist(), scored.keep.tolist())],
                               scored.components, scored.extra)
        for row in rows:
            self.run.completions.write(row)
        if self._open_trackers() is not None:
            self._trackers.log_rows("completions", rows)

    def _policy_forward(self, rollout: Rollout) -> ResponseOutput:
        """The update's forward, with grad: log-probs, entropy and (PPO) the hidden states for values."""
        return self.policy.score(rollout, hidden=self.value_head is not None, entropy=True,
                                 entropy_grad=bool(self.config.algo.entropy_coef) or self.entropy_ctl is not None)

    def _update(self, rollout: Rollout, mb: Minibatch, out: ResponseOutput | None = None,
                step_tokens: float | None = None) -> dict[str, float]:
        """One optimizer step on a minibatch; returns its statistics. ``out``: its forward, when already run;
        ``step_tokens``: the reduction's divisor (``loss_aggregation: batch_token``)."""
        c = self.config.algo

        def step_loss(out: ResponseOutput) -> tuple[torch.Tensor, dict[str, float], torch.Tensor | None]:
            """The minibatch's loss from the forward ``out``: policy loss, entropy bonus, the method's and the
            components' extra losses (Selective Rehearsal's, paper 2 eq. 9); its statistics; the tokens the policy
            loss acts on (None: all)."""
            high, batch = None, mb
            if c.top_entropy_quantile < 1:  # the other tokens' policy terms are 0 (the reduction still counts them)
                high = ops.high_entropy_mask(out.entropy, mb.mask, c.top_entropy_quantile, self.dp.cat)
                batch = replace(mb, advantages=torch.where(high, mb.advantages, 0.0))
            loss, stats = self.estimator.loss(out, batch, step_tokens)
            entropy = ops.masked_mean(out.entropy, mb.mask)
            stats["entropy"] = float(entropy.detach())
            coef = c.entropy_coef if self.entropy_ctl is None else self.entropy_ctl.applied
            if coef:  # the bonus over the tokens the policy loss acts on, as TRL's
                loss = loss - coef * (entropy if high is None else ops.masked_mean(out.entropy, high))
            for hook in self.hooks:
                extra = hook.extra_loss()
                if extra is not None:
                    loss = loss + extra[0]
                    stats.update(extra[1])
            return loss, stats, high

        out = self._policy_forward(rollout) if out is None else out
        loss, stats, high = step_loss(out)
        self.optimizer.zero_grad(set_to_none=True)
        self._check_finite("loss", loss)
        loss.backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.dp.average_gradients(params)

        def recompute() -> None:
            """The step's loss again at the policy's current weights, on the same samples: its gradients in .grad."""
            self.optimizer.zero_grad(set_to_none=True)
            again = step_loss(self._policy_forward(rollout))[0]
            self._check_finite("loss", again)
            again.backward()
            self.dp.average_gradients(params)

        stats.update(self.method.on_gradients(params, recompute))
        if c.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        self._check_finite("gradient norm", grad_norm)
        stats["grad_norm"] = float(grad_norm)
        self.optimizer.step()
        for hook in self.hooks:
            hook.on_optimizer_step()
        if self.entropy_ctl is not None:  # the step's token entropy, every rank's, where the bonus acts
            acting = mb.mask.bool() if high is None else high
            stats["entropy_coef"] = self.entropy_ctl.update(self.dp.mean_of(out.entropy.detach()[acting]))
        return {key: float(value) for key, value in stats.items()}

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

    def evaluate(self) -> dict[str, Any]:
        """Validation reward, drift and task metrics, for the current weights and the method's EMA (see
        :class:`~elastic_reset.rl.evaluation.Evaluator`). Changes no training state."""
        return self.evaluator.evaluate(self.method, self.step)

    # ---------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The run's state. Under data parallelism every rank must call it (it gathers each rank's random state;
        everything else is identical on every rank)."""
        state = {
            "step": self.step,
            "data": {"epoch": self.data_epoch, "index": self.data_index},
            "unseen_eval": dict(self._unseen_eval),
            "trainable": {n: p.detach().clone() for n, p in trainable_named_parameters(self.model)},
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "kl_ctl": self.kl_ctl.state_dict(),
            **({"entropy_ctl": self.entropy_ctl.state_dict()} if self.entropy_ctl is not None else {}),
            **self.estimator.state_dict(),
            "method": self.method.state_dict(),
            **{component.key: component.state_dict() for component in self.components},
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

    def _resume_from(self, path: Path, state: dict[str, Any]) -> None:
        """:meth:`load_state_dict` of the checkpoint ``path``; one that is another model's is named, in one line."""
        try:
            self.load_state_dict(state)
        except CheckpointMismatch as err:
            raise RunFileError(f"{path}: {err}; it is not this run's checkpoint (restore the run's own, or start "
                               "it again in a new directory)") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = dict(trainable_named_parameters(self.model))
        if set(params) != set(state["trainable"]):
            raise CheckpointMismatch("its trainable parameters do not match this model's "
                                     f"({len(state['trainable'])} saved, {len(params)} here)")
        for name, tensor in state["trainable"].items():
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise CheckpointMismatch(f"{name} has shape {tuple(tensor.shape)} there but "
                                         f"{tuple(params[name].shape)} in this model")
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                params[name].copy_(tensor)
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        if self.entropy_ctl is not None:
            self.entropy_ctl.load_state_dict(state["entropy_ctl"])
        self.estimator.load_state_dict(state)
        self.method.load_state_dict(state["method"])
        for component in self.components:
            component.load_state_dict(state.get(component.key))
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
        self._unseen_eval = {k: float(v) for k, v in state.get("unseen_eval", {}).items()}  # older runs: none

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0; every rank takes part). Returns its path, None on other ranks."""
        state = self.state_dict()
        path = (save_checkpoint(self.out_dir, self.step, state, keep=self.config.keep_checkpoints)
                if self.dp.is_main else None)
        self.dp.barrier()  # no rank runs ahead of a checkpoint that may yet fail to be written
        return path

    # ---------------------------------------------------------------------------------------------- the run
    def _log(self, record: dict[str, Any]) -> None:
        if not self.dp.is_main:
            return
        self.metrics.write(record)
        if self._open_trackers() is not None:
            self._trackers.log(record)

    def _open_trackers(self) -> Trackers | None:
        """The run's trackers, opened at the first record (set-up writes nothing); None without any."""
        if self._trackers is None and self.config.trackers():
            self._trackers = Trackers(self.config.trackers(), self.out_dir, config_to_dict(self.config),
                                      project=self.config.project, run_name=self.config.run_name)
        return self._trackers

    def _push(self, final: Path) -> None:
        repo = self.config.push_to_hub
        try:
            push_folder(final, repo, self._hub_token, f"elastic-reset run {self.out_dir.name}, step {self.step}")
        except Exception as err:  # the run is saved: say how to finish by hand
            raise ElasticResetError(f"push_to_hub: the upload to {repo} failed ({first_line(err)}); the run is "
                                    f"complete and its policy is in {final}: `hf upload {repo} {final}` uploads it"
                                    ) from err

    def _eval_due(self, step: int) -> bool:
        every = self.config.eval.every
        return every > 0 and (step % every == 0 or step == self.config.steps)

    def _evaluate_and_log(self, test: bool = False) -> dict[str, Any] | None:
        """Rank 0 evaluates and logs, the others wait for it (evaluation draws its own noise: it changes no
        state). ``test``: the task's test split instead of validation."""
        record = None
        if self.dp.is_main:
            record = {"step": self.step, **(self.evaluator.test(self.step) if test else self.evaluate())}
            self._log(record)
        self.dp.barrier()
        if not test:  # what the method's triggers see at the next iteration's end, the same on every rank
            shared = self.dp.gather_object(record)[0] if self.dp.enabled else record
            self._unseen_eval = {k: v for k, v in shared.items() if isinstance(v, (int, float)) and k != "step"}
        return record

    def train(self) -> list[dict[str, Any]]:
        """Run until ``config.steps`` iterations; returns the records written this call."""
        from tqdm.auto import tqdm

        written: list[dict[str, Any]] = []
        self.run.record_machine(self.step, self.device)
        self._cast_frozen_weights()
        bar = None
        try:
            if self.step == 0 and self._eval_due(0):
                written.append(self._evaluate_and_log())
            bar = tqdm(total=self.config.steps, initial=self.step, dynamic_ncols=True, desc=self.config.method.name,
                       disable=not self.config.progress or not self.dp.is_main)
            while self.step < self.config.steps:
                record = self.train_step()
                self._log(record)
                written.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}",  # kl only on the iterations that compute it
                                **({"kl": f"{record['kl']:.3f}"} if "kl" in record else {}))
                if self._eval_due(self.step):
                    written.append(self._evaluate_and_log())
                every = self.config.checkpoint_every
                if (every and self.step % every == 0) or self.step == self.config.steps:
                    self.save()
            tested = any(r["step"] == self.step and "test/reward" in r for r in self.metrics.records())
            if self.task.test_prompts and not tested:
                written.append(self._evaluate_and_log(test=True))  # once, on the final weights
            if self.dp.is_main:  # the trained policy as a save_pretrained folder, while the run is still locked
                self._restore_fp32_weights()  # the fp32 originals, not autocast's bf16 copies
                final = save_run_policy(self.out_dir, self.config, self.model, self.tokenizer,
                                        self.out_dir / "final", self.step)
                if self.config.push_to_hub:
                    self._push(final)
        finally:
            if bar is not None:
                bar.close()
            self.close()
            self.metrics.close()
            self.run.completions.close()
            if self._trackers is not None:
                self._trackers.close()
        return [r for r in written if r is not None]
