"""Selective Rehearsal (Peng et al. 2023, paper 2 §3.2): keep rehearsing what the initial policy already did well.

Before RL, the initial policy answers ``rehearsal.prompts`` of the training prompts (the paper's D_PPO, "each
response y being generated from the initial policy model"); the prompts are embedded (all-MiniLM-L6-v2,
mean-pooled; the paper used SimCSE) and clustered by k-means into ``rehearsal.clusters`` groups; within each, the
``rehearsal.top_k`` (prompt, response) pairs with the highest reward-model score form the rehearsal set D_R. Every
optimizer step then adds γ · E_{(x,y)~D_R} Σ_t −log π(y_t | y_<t, x) (eq. 9, γ = 0.01: the summed NLL of a
response, averaged over ``rehearsal.batch`` examples of D_R, cycled in a shuffled order). The selected prompts are
reserved for rehearsal and left out of RL training (§1: SR tells "which examples should be used for PPO training
and which should be reserved for rehearsing"); ``rehearsal.exclude: false`` keeps them in.

The set is written to ``RUN/rehearsal.jsonl`` (prompt, response, their token ids, score, cluster) when the run
starts and read back on resume, so that a continued run rehearses the same examples.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from elastic_reset.errors import ConfigError, RewardError, RunFileError
from elastic_reset.io import atomic_write_text
from elastic_reset.lm.pooling import mean_pool
from elastic_reset.lm.rollout import Rollout
from elastic_reset.lm.scoring import pad_rows

if TYPE_CHECKING:
    from elastic_reset.rl.config import RehearsalConfig
    from elastic_reset.rl.policy import Policy
    from elastic_reset.rl.reward import CheckedReward

FILE = "rehearsal.jsonl"
"""The rehearsal set in a run directory."""


def select_representatives(embeddings: np.ndarray, scores: Sequence[float], clusters: int, top_k: int,
                           seed: int = 0) -> list[tuple[int, int]]:
    """(index, cluster) of the ``top_k`` highest-scoring items of each k-means cluster of ``embeddings``, cluster
    by cluster, best first. A cluster smaller than ``top_k`` is refused, naming it: the paper keeps k per cluster."""
    from sklearn.cluster import KMeans

    embeddings = np.asarray(embeddings, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if len(embeddings) != len(scores) or len(scores) == 0:
        raise ConfigError(f"rehearsal.prompts: expected candidates with one score each, got {len(embeddings)} "
                          f"embeddings and {len(scores)} scores")
    if clusters > len(scores):
        raise ConfigError(f"rehearsal.clusters: {clusters} clusters of {len(scores)} candidates")
    # scikit-learn takes seeds below 2**32; a run's seed may be any signed 64-bit integer
    labels = KMeans(n_clusters=clusters, n_init=10, random_state=seed % 2**32).fit_predict(embeddings)
    chosen = []
    for cluster in range(clusters):
        members = np.flatnonzero(labels == cluster)
        if len(members) < top_k:
            raise ConfigError(f"rehearsal.top_k: {top_k} per cluster, but cluster {cluster} holds "
                              f"{len(members)} of the {len(scores)} candidates (lower top_k or clusters, or raise "
                              "rehearsal.prompts)")
        best = members[np.argsort(-scores[members], kind="stable")[:top_k]]
        chosen += [(int(i), cluster) for i in best]
    return chosen


def embed(texts: list[str], path: str | Path, batch_size: int = 64) -> np.ndarray:
    """Sentence embeddings of ``texts``: the encoder at ``path``'s last hidden states, mean-pooled over tokens and
    L2-normalised (how all-MiniLM-L6-v2 is meant to be used)."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=128,
                              return_tensors="pt")
            pooled = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
            out.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(out).numpy()


def choose_examples(policy: Policy, reward: CheckedReward, train_prompts: Sequence[str], settings: RehearsalConfig,
                    seed: int) -> list[dict]:
    """D_R from the initial policy: it answers ``settings.prompts`` training prompts (drawn with ``seed``) on its own
    random stream, so that the RL samples stay those of the same run without rehearsal; the answers with a valid
    ``reward`` are embedded and the best ``settings.top_k`` of each of ``settings.clusters`` k-means clusters kept."""
    from elastic_reset.models import minilm_path

    if settings.prompts > len(train_prompts):
        raise ConfigError(f"rehearsal.prompts: {settings.prompts} exceeds the task's {len(train_prompts)} "
                          "training prompts")
    prompts = random.Random(seed).sample(list(train_prompts), settings.prompts)
    generator = torch.Generator(policy.device).manual_seed(seed + 2_000_029)
    rows = []
    for start in range(0, len(prompts), 32):
        chunk = prompts[start:start + 32]
        rollout = policy.sample(chunk, generator)
        completions = policy.decode(rollout.response_ids, rollout.response_mask)
        scored = reward(chunk, completions, rollout)
        scores, keep = scored.scores, scored.keep
        response_ids = rollout.response_id_lists()
        for i in keep.nonzero().flatten().tolist():
            rows.append({"prompt": chunk[i], "response": completions[i],
                         "query_ids": rollout.query_ids[i][rollout.query_mask[i].bool()].tolist(),
                         "response_ids": response_ids[i], "score": float(scores[i])})
    if not rows:
        raise RewardError("rehearsal: every candidate's reward was invalid; nothing to rehearse")
    embedder = minilm_path() if settings.embedder == "minilm" else settings.embedder
    embeddings = embed([r["prompt"] for r in rows], embedder)
    chosen = select_representatives(embeddings, [r["score"] for r in rows], settings.clusters, settings.top_k, seed)
    return [{**rows[i], "cluster": cluster} for i, cluster in chosen]


class Rehearsal:
    """The rehearsal set D_R and its loss (eq. 9). ``examples``: dicts with ``prompt``, ``response``,
    ``query_ids``, ``response_ids`` (token ids, no padding), ``score`` and ``cluster``."""

    def __init__(self, examples: list[dict], coef: float, batch: int, seed: int = 0):
        if not examples:
            raise ConfigError("rehearsal: the rehearsal set is empty (every candidate's reward was invalid?)")
        self.examples, self.coef, self.batch = examples, coef, batch
        self.order = list(range(len(examples)))
        random.Random(seed).shuffle(self.order)
        self.position = 0

    @property
    def prompts(self) -> set[str]:
        return {e["prompt"] for e in self.examples}

    def next_batch(self, pad_token_id: int) -> Rollout:
        """The next ``batch`` examples as a rollout (prompts left-padded, responses right-padded)."""
        rows = [self.examples[self.order[(self.position + i) % len(self.order)]] for i in range(self.batch)]
        self.position = (self.position + self.batch) % len(self.order)
        query_ids, query_mask = pad_rows([r["query_ids"] for r in rows], pad_token_id, side="left")
        response_ids, response_mask = pad_rows([r["response_ids"] for r in rows], pad_token_id)
        return Rollout(query_ids=query_ids, query_mask=query_mask, response_ids=response_ids,
                       response_mask=response_mask.float(), logprobs=torch.zeros(response_ids.shape))

    def loss(self, score: Callable[[Rollout], torch.Tensor], batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """γ × the summed response NLL, averaged over ``batch`` (:meth:`next_batch`, on the policy's device);
        ``score`` gives per-token log-probs with grad (the trainer's policy). Logged: the NLL per token, the paper's
        scale-free view of it."""
        logprobs = score(batch)
        nll = -(logprobs * batch.response_mask).sum(-1)
        per_token = float(nll.detach().sum() / batch.response_mask.sum().clamp(min=1))
        return self.coef * nll.mean(), {"rehearsal/nll": per_token}

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in self.examples))

    @staticmethod
    def read(path: str | Path) -> list[dict]:
        """The examples of a run's ``rehearsal.jsonl``, checked (a damaged file is named, not half-used)."""
        keys = {"prompt", "response", "query_ids", "response_ids", "score", "cluster"}
        examples = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            try:
                example = json.loads(line)
                ok = isinstance(example, dict) and keys <= set(example) and all(
                    isinstance(example[k], list) and example[k] and all(isinstance(t, int) for t in example[k])
                    for k in ("query_ids", "response_ids"))
            except json.JSONDecodeError:
                ok = False
            if not ok:
                raise RunFileError(f"{path}:{n}: expected a JSON object with {', '.join(sorted(keys))} (token ids "
                                   "as non-empty integer lists); start the run again in another --out")
            examples.append(example)
        return examples

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])
