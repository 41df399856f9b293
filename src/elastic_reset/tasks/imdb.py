"""IMDB mock sentiment (Elastic Reset §6, after Ziegler et al. 2019 and RL4LMs / GRUE): continue the first half
of a movie review so that the whole review reads as positively as possible.

- Prompts: the first half of the words of a review (RL4LMs' ``IMDB`` data pool). The engine keeps the last
  ``model.max_prompt_tokens`` (64 in RL4LMs) tokens of each.
- Train prompts come from the train split. Validation prompts and the reference texts (full human-written reviews,
  for the perplexity drift metric) come from the test split, in two disjoint parts; neither is ever seen by the
  policy's training or by the reward classifier. (RL4LMs itself drew validation from an unseeded 80/20 split of
  the train split and tested on 5,000 test reviews; here everything is seeded and all evaluation data is
  held out from the reward model's training data too.)
- Reward: P(positive) of prompt + completion under a sentiment classifier fine-tuned on the IMDB train labels
  (:class:`elastic_reset.rewards.classifier.SentimentReward`; the paper used DistilBERT, we use MiniLM). Build it
  once with ``elastic-reset build imdb-classifier --data-dir ../shared/data``.
- ``pretrain_texts`` (for the multitask / S2P loss) are full train reviews.

The data, its cleaning and its splits: :func:`elastic_reset.data.imdb.task_splits`; this module wires them to the
reward.
"""

from __future__ import annotations

from elastic_reset.data.imdb import task_splits
from elastic_reset.tasks.base import Task, register_task


@register_task("imdb")
def imdb_task(data_dir: str | None = None, reward_model: str | None = None, n_train: int | None = None,
              n_eval: int = 5000, n_reference: int = 5000, n_pretrain: int | None = None, seed: int = 0,
              max_prompt_words: int | None = None, reward_batch_size: int = 64,
              reward_max_length: int = 256, n_test: int = 0, n_report: int = 0) -> Task:
    """The IMDB task. ``n_train`` train prompts (default: all 25,000 train reviews), ``n_eval`` validation
    prompts, ``n_reference`` reference reviews, ``n_test`` test prompts, scored once on the final weights, and
    ``n_report`` prompts and reviews of a second validation set, evaluated beside the first as ``eval_report/*``
    with its own perplexity (select checkpoints on ``eval/*``, report them on ``eval_report/*``; all disjoint parts
    of the test split), ``n_pretrain`` multitask texts (default: all train reviews).
    ``reward_model``: a classifier folder (default ``models.imdb_classifier_path()``, built by ``elastic-reset
    build imdb-classifier``)."""
    from elastic_reset.models import imdb_classifier
    from elastic_reset.rewards.classifier import SentimentReward

    data = task_splits(data_dir, seed=seed, n_train=n_train, n_eval=n_eval, n_reference=n_reference,
                       n_pretrain=n_pretrain, max_prompt_words=max_prompt_words, n_test=n_test,
                       n_report=n_report)
    path = imdb_classifier(reward_model, "task.options.reward_model")
    return Task(
        name="imdb",
        train_prompts=data.train_prompts,
        eval_prompts=data.eval_prompts,
        reward_fn=SentimentReward(path, batch_size=reward_batch_size, max_length=reward_max_length),
        reference_texts=data.reference_texts,
        pretrain_texts=data.pretrain_texts,
        test_prompts=data.test_prompts,
        eval_sets={"report": data.report_prompts} if n_report else {},
        eval_set_texts={"report": data.report_texts} if n_report else {},
    )
