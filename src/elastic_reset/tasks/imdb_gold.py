"""``imdb_gold``: the gold-vs-proxy testbed (Gao et al. 2022, arXiv 2210.10760). The IMDB task's prompts
and drift (perplexity on held-out reviews), but the policy is trained on a *proxy*: a reward model (Bradley–Terry or
Advantage Model) learned from pairs the gold labelled (``elastic-reset build gold-pairs``, then ``reward-model train
--data <pairs>/pairs.jsonl``). The gold, the sentiment classifier, never trains the policy; it is measured:

- ``eval/gold``, ``eval/gold_log_odds``: the gold's P(positive) and log-odds of the policy's continuations;
- ``eval/win_rate``: the share of prompts where the gold prefers the policy's continuation to the initial policy's;
- ``eval/proxy_gold_agreement``: the proxy's pairwise ranking accuracy against the gold on those continuations;
- ``eval_forget/*``: the same on WikiText-2 paragraph openings, prompts unlike the RL prompts, where forgetting
  shows (paper 2, Peng et al. §4.3: the alignment tax).

``eval/reward`` is the proxy's score.
"""

from __future__ import annotations

from pathlib import Path

from elastic_reset.data.imdb import task_splits
from elastic_reset.data.wikitext import paragraph_prompts
from elastic_reset.errors import ConfigError
from elastic_reset.rewards.gold import pairwise_agreement, sigmoid
from elastic_reset.tasks.base import Task, register_task


class GoldScores:
    """The gold's scores of one evaluation, computed once for its two uses: :meth:`judge` (the win rate's score,
    the log-odds: the same order as P(positive)) and :meth:`metrics` (``gold``, ``gold_log_odds`` and, given the
    ``proxy``, ``proxy_gold_agreement``: the proxy's pairwise ranking accuracy against the gold on the policy's own
    samples). The evaluator judges a set's completions and then asks for its metrics on the same texts, so the
    last result is kept."""

    def __init__(self, gold, proxy=None):
        self.gold = gold
        self.proxy = proxy
        self._last: tuple[tuple[str, ...], list[float]] | None = None

    def log_odds(self, prompts: list[str], completions: list[str]) -> list[float]:
        texts = tuple(self.gold.texts(prompts, completions))
        if self._last is None or self._last[0] != texts:
            self._last = (texts, self.gold.log_odds(list(texts)))
        return self._last[1]

    def judge(self, prompts: list[str], completions: list[str]) -> list[float]:
        return self.log_odds(prompts, completions)

    def metrics(self, prompts: list[str], completions: list[str]) -> dict[str, float]:
        log_odds = self.log_odds(prompts, completions)
        out = {"gold": sum(sigmoid(x) for x in log_odds) / len(log_odds),
               "gold_log_odds": sum(log_odds) / len(log_odds)}
        if self.proxy is not None:  # scored again here: the evaluator keeps the reward's scores to itself
            out["proxy_gold_agreement"] = pairwise_agreement(list(self.proxy(prompts, completions)), log_odds)
        return out


@register_task("imdb_gold")
def imdb_gold_task(data_dir: str | None = None, reward_model: str | None = None, gold: str | None = None,
                   n_train: int | None = None, n_eval: int = 64, n_reference: int = 64, n_test: int = 0,
                   n_forget: int = 64, seed: int = 0, reward_batch_size: int = 16, n_report: int = 0) -> Task:
    """Options: ``reward_model`` (required: the proxy, a folder from ``reward-model train``), ``gold`` (the
    sentiment classifier folder; default the ``imdb-classifier`` build), the IMDB task's counts (``n_report``: a
    second validation set, ``eval_report/*``, to report checkpoints chosen on ``eval/*``), ``n_forget``
    WikiText-2 prompts for the forget set (0: none)."""
    from elastic_reset.models import imdb_classifier
    from elastic_reset.reward_models.reward import PreferenceModelReward
    from elastic_reset.rewards.classifier import SentimentReward

    if data_dir is None:
        raise ConfigError("task.data_dir: the imdb_gold task reads imdb/ and wikitext2/ from it (../shared/data)")
    if reward_model is None:
        raise ConfigError("task.options.reward_model: the proxy is required: a folder from `elastic-reset "
                          "reward-model train --data <gold pairs>/pairs.jsonl`")
    if not (Path(reward_model) / "reward_model.json").is_file():
        raise FileNotFoundError(f"task.options.reward_model: no reward model at {reward_model}")
    gold_path = imdb_classifier(gold, "task.options.gold")
    data = task_splits(data_dir, seed=seed, n_train=n_train, n_eval=n_eval, n_reference=n_reference, n_test=n_test,
                       n_report=n_report)
    proxy = PreferenceModelReward(reward_model, batch_size=reward_batch_size)
    gold_scores = GoldScores(SentimentReward(gold_path), proxy)
    return Task(
        name="imdb_gold",
        train_prompts=data.train_prompts,
        eval_prompts=data.eval_prompts,
        reward_fn=proxy,
        reference_texts=data.reference_texts,
        pretrain_texts=data.pretrain_texts,
        test_prompts=data.test_prompts,
        metrics_fn=gold_scores.metrics,
        judge_fn=gold_scores.judge,
        eval_sets={**({"forget": paragraph_prompts(data_dir, n_forget, seed=seed)} if n_forget else {}),
                   **({"report": data.report_prompts} if n_report else {})},
        eval_set_texts={"report": data.report_texts} if n_report else {},
        score_key="gold",
    )
