"""Evaluation during training: held-out reward, drift (perplexity on reference text, KL to the initial model on
fresh samples), the task's own metrics and, with a judge, the win rate against the initial policy, for the current
weights and, where the method keeps one, the EMA's.

Evaluation draws its own noise from a fixed seed, so it never changes the training stream, and every evaluation
of a run samples with the same noise: differences between steps come from the weights, not the draw.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from elastic_reset.errors import RunFileError
from elastic_reset.evaluation.drift import perplexity as text_perplexity
from elastic_reset.io import atomic_write_text
from elastic_reset.rl.config import TrainConfig
from elastic_reset.rl.methods import DriftMethod
from elastic_reset.rl.policy import Policy, Reference
from elastic_reset.rl.reward import CheckedReward, add_logged, component_means
from elastic_reset.rl.rundir import RunDirectory
from elastic_reset.tasks import Task

REFERENCE_TEXTS = "reference_texts.json"
INITIAL_COMPLETIONS = "initial_completions.json"
_REFERENCE_SEED = 20_231_210  # not the run's seed: every run of a comparison scores the same texts


class Evaluator:
    """Evaluates ``policy`` on ``task`` as ``config.eval`` says; ``reference`` is the initial model."""

    def __init__(self, policy: Policy, task: Task, config: TrainConfig, reference: Reference,
                 reward: CheckedReward, run: RunDirectory):
        self.policy = policy
        self.task = task
        self.config = config
        self.reference = reference
        self.reward = reward
        self.run = run
        self.texts: list[str] = []
        self.judge = None if task.judge_fn is None else CheckedReward(task.judge_fn, task.name, "error",
                                                                       policy.device, what="judge_fn")
        self.initial: dict[str, list[str]] = {}
        self._initial_scores: dict[str, torch.Tensor] = {}  # the judge's scores of those, which never change

    def prompt_sets(self) -> dict[str, list[str]]:
        """``{prefix: prompts}`` evaluated every time: the validation prompts and the task's ``eval_sets``."""
        n = self.config.eval.num_prompts
        return {"eval": self.task.eval_prompts[:n], **{f"eval_{k}": v[:n] for k, v in self.task.eval_sets.items()}}

    def load_initial(self) -> None:
        """What the run compares against, fixed from the initial weights: the texts perplexity is measured on
        (``eval.reference``) and, with a judge, the initial policy's completions of every evaluated prompt set.
        Samples are drawn once and kept in the run directory, so a resumed run reads them back instead of drawing
        them from trained weights: call this while the policy still holds its initial weights."""
        self._load_reference_texts()
        if self.judge is not None and self.config.eval.every > 0:
            sets = {**self.prompt_sets(), "test": self.test_prompts()}
            self.initial = self._saved_completions(sets) or self._draw_completions(sets)

    def _saved_completions(self, sets: dict[str, list[str]]) -> dict[str, list[str]] | None:
        saved = self.run.read_json(INITIAL_COMPLETIONS)
        if saved is None:
            return None
        k = self.config.eval.samples_per_prompt
        if not (isinstance(saved, dict) and set(saved) == set(sets) and all(
                isinstance(saved[s], list) and len(saved[s]) == len(p) * k and all(isinstance(t, str) for t in saved[s])
                for s, p in sets.items())):
            raise RunFileError(f"{self.run.path / INITIAL_COMPLETIONS}: expected {{set: [completion, ...]}} for the "
                               f"sets {sorted(sets)} with eval.samples_per_prompt completions per prompt; delete it "
                               "only if the run restarts from scratch")
        return saved

    def _draw_completions(self, sets: dict[str, list[str]]) -> dict[str, list[str]]:
        drawn = {name: [t for _, _, texts in self._samples(prompts) for t in texts] for name, prompts in sets.items()}
        atomic_write_text(self.run.path / INITIAL_COMPLETIONS, json.dumps(drawn, indent=1, ensure_ascii=False) + "\n")
        return drawn

    def _load_reference_texts(self) -> None:
        e = self.config.eval
        if self.policy.is_encoder_decoder:
            self.texts = []  # no perplexity for an encoder-decoder policy: the task's own metrics measure drift
        elif e.reference == "task":
            self.texts = list(self.task.reference_texts[:e.num_texts])
        elif e.every == 0:
            self.texts = []  # never evaluated: nothing to draw
        else:
            self.texts = self._saved_texts() or self._draw_initial_samples()

    def _saved_texts(self) -> list[str] | None:
        texts = self.run.read_json(REFERENCE_TEXTS)
        if texts is None:
            return None
        n = self.config.eval.num_texts
        if not (isinstance(texts, list) and len(texts) == n and all(isinstance(t, str) for t in texts)):
            raise RunFileError(f"{self.run.path / REFERENCE_TEXTS}: expected a JSON list of {n} strings "
                               "(eval.num_texts); delete it only if the run restarts from scratch")
        return texts

    def _draw_initial_samples(self) -> list[str]:
        e = self.config.eval
        prompts = list(self.task.eval_prompts)
        prompts = [prompts[i % len(prompts)] for i in range(e.num_texts)]
        generator = torch.Generator(self.policy.device).manual_seed(_REFERENCE_SEED)
        texts = []
        with torch.no_grad():
            for start in range(0, len(prompts), e.batch_size):
                r = self.policy.sample(prompts[start:start + e.batch_size], generator, greedy=e.greedy)
                # The prompt as the model saw it (truncated to max_prompt_tokens), then what it wrote.
                texts.extend(p + c for p, c in zip(self.policy.decode(r.query_ids, r.query_mask),
                                                   self.policy.decode(r.response_ids, r.response_mask)))
        atomic_write_text(self.run.path / REFERENCE_TEXTS, json.dumps(texts, indent=1, ensure_ascii=False) + "\n")
        return texts

    def evaluate(self, method: DriftMethod, step: int = 0) -> dict[str, Any]:
        """``eval/*`` and ``eval_<set>/*`` for the current weights, and ``eval_ema/*`` (validation prompts only)
        for the EMA weights of a method that keeps one (with ``eval.ema`` on); ``step``: the iterations done."""
        record = {}
        for prefix, prompts in self.prompt_sets().items():
            record.update(self.evaluate_prompts(prefix, prompts, against=prefix,
                                                perplexity_texts=self.set_texts(prefix), step=step))
        if method.keeps_ema and self.config.eval.ema:
            with method.ema_weights():
                record.update(self.evaluate_prompts("eval_ema", against="eval", step=step))
        return record

    def set_texts(self, prefix: str) -> list[str]:
        """The texts ``prefix``'s perplexity is measured on: the reference texts for ``eval``, an eval set's own
        (``Task.eval_set_texts``) for ``eval_<name>``, none otherwise (perplexity does not depend on the prompts)."""
        if prefix == "eval":
            return self.texts
        texts = self.task.eval_set_texts.get(prefix.removeprefix("eval_"), [])
        return [] if self.policy.is_encoder_decoder else texts[:self.config.eval.num_texts]

    def test_prompts(self) -> list[str]:
        return self.task.test_prompts[:self.config.eval.num_test_prompts]

    def test(self, step: int = 0) -> dict[str, Any]:
        """``test/*``: the task's test split (the Translation Game's table), once, on the final weights."""
        return self.evaluate_prompts("test", self.test_prompts(), against="test", step=step)

    def _samples(self, prompts: list[str]):
        """``(prompts, rollout, completions)`` per batch of ``prompts`` × ``eval.samples_per_prompt``, drawn with the
        evaluation's fixed noise."""
        e = self.config.eval
        prompts = [p for p in prompts for _ in range(e.samples_per_prompt)]
        generator = torch.Generator(self.policy.device).manual_seed(self.config.seed + 1_000_003)
        with torch.no_grad():
            for start in range(0, len(prompts), e.batch_size):
                chunk = prompts[start:start + e.batch_size]
                rollout = self.policy.sample(chunk, generator, greedy=e.greedy)
                yield chunk, rollout, self.policy.decode(rollout.response_ids, rollout.response_mask)

    @torch.no_grad()
    def evaluate_prompts(self, prefix: str, prompts: list[str] | None = None, against: str | None = None,
                         perplexity_texts: list[str] | None = None, step: int = 0) -> dict[str, Any]:
        """Reward, KL to the initial model, perplexity on ``perplexity_texts`` (default: the reference texts;
        ``[]``: none), the task's metrics and, with a judge, the win rate against the initial policy's completions
        of the same prompts (the set ``against`` names in :attr:`initial`). ``step``: the iterations done, for a
        reward that reads TRL's ``trainer_state``."""
        e = self.config.eval
        if prompts is None:
            prompts = self.task.eval_prompts[:e.num_prompts]
        scores, completions, kls, all_prompts, lengths, parts, logged = [], [], [], [], [], [], []
        for chunk, rollout, texts in self._samples(prompts):
            result = self.reward(chunk, texts, rollout, step=step)
            parts.append(result.components)
            logged.append(result.logged)
            logp = self.policy.score(rollout).logprobs
            with self.reference.model() as ref:
                ref_logp = self.policy.score(rollout, ref).logprobs
            mask = rollout.response_mask.float()
            kls.append(torch.where(mask > 0, logp - ref_logp, 0.0).sum(1))
            lengths.append(rollout.response_lengths.float())
            scores.append(result.scores[result.keep])
            completions.extend(texts)
            all_prompts.extend(chunk)
        prompts = all_prompts
        record = {
            f"{prefix}/reward": float(torch.cat(scores).mean()),
            f"{prefix}/kl_init": float(torch.cat(kls).mean()),
            f"{prefix}/response_length": float(torch.cat(lengths).mean()),
            **{f"{prefix}/rewards/{name}": value for name, value in component_means(parts).items()},
        }
        if against in self.initial:
            if against not in self._initial_scores:
                self._initial_scores[against] = self.judge(prompts, self.initial[against], step=step).scores
            now, then = self.judge(prompts, completions, step=step).scores, self._initial_scores[against]
            record[f"{prefix}/win_rate"] = float(((now > then).float() + 0.5 * (now == then).float()).mean())
        perplexity_texts = self.texts if perplexity_texts is None else perplexity_texts
        if perplexity_texts:
            record[f"{prefix}/perplexity"] = text_perplexity(self.policy.model, self.policy.tokenizer, perplexity_texts,
                                                        max_tokens=e.max_text_tokens, batch_size=e.batch_size,
                                                        autocast_dtype=self.policy.autocast_dtype)
        if self.task.metrics_fn is not None:
            for key, value in self.task.metrics_fn(prompts, completions).items():
                record[f"{prefix}/{key}"] = float(value)
        record[f"{prefix}/sample"] = completions[0]
        add_logged(record, component_means(logged), f"{prefix}/")
        return record

