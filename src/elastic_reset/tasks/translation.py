"""The Translation Game (Elastic Reset §4, Appendix A; Lee et al. 2019): FR→EN→DE on Multi30k.

The policy is the FR→EN *speaker* (``model.name: translation-fr-en``). For a French sentence it writes an English
message; the EN→DE *listener* (:class:`~elastic_reset.rewards.listener.ListenerReward`) reads it, and the reward is
how well the listener recovers the true German. The listener trains on every batch (cross-entropy on the sampled
English and the true German), so the game is played with French–German pairs only: the lines of Multi30k train
the agents were not pretrained on (:func:`~elastic_reset.data.translation.game_pairs`; all of them for agents
pretrained out of domain, the default build), whose English nothing reads.

- **Task score**: FR→EN→DE BLEU (``eval/task_bleu``): the listener's greedy German from the speaker's English
  against the true German. Set ``eval.greedy: true`` so that the speaker's messages are greedy too.
- **Drift**: FR→EN BLEU (``eval/drift_bleu``) of the speaker's English against the true English, which the game never
  sees: the paper's exact measure of language drift. Higher is better.
- Validation: Multi30k ``val``; test (``test/...``, once after the last iteration): ``test_2016_flickr``.
- ``pretrain_texts``: the speaker's (French, English) pretraining pairs, for the multitask / S2P loss.
- ``reference_lm``: the English LM of the pretraining text, for ``kl.reference: lm`` (the paper's KL PENALTY).

Build the agents first: ``elastic-reset build translation-agents --data-dir ../shared/data``. The data and its split:
:mod:`elastic_reset.data.translation`; BLEU: :func:`elastic_reset.pretrain.translation.bleu` (the agents' build
early-stops on it).
"""

from __future__ import annotations

import json
from pathlib import Path

from elastic_reset.data.translation import game_pairs, load_multi30k, pretraining_text
from elastic_reset.errors import ConfigError
from elastic_reset.pretrain.translation import bleu_score
from elastic_reset.rewards.listener import ListenerReward
from elastic_reset.tasks.base import Task, register_task


@register_task("translation_game")
def translation_game_task(data_dir: str | None = None, agents: str | None = None, listener_lr: float = 1e-4,
                          max_tokens: int = 64) -> Task:
    """Options: ``agents``, the folder ``build translation-agents`` wrote (default: the cache); ``listener_lr``, the
    listener's AdamW learning rate (0: a fixed listener); ``max_tokens``, tokens of a message or reference the
    listener reads."""
    from elastic_reset.models import translation_agents_path

    if data_dir is None:
        raise ConfigError("task.data_dir: the Translation Game reads Multi30k with French from "
                          "<data_dir>/multi30k (e.g. ../shared/data); there is no online fallback")
    if not isinstance(listener_lr, (int, float)) or isinstance(listener_lr, bool) or not listener_lr >= 0:
        raise ConfigError(f"task.options.listener_lr: expected a number >= 0 (0: a fixed listener), got "
                          f"{listener_lr!r}")
    agents_dir = Path(agents) if agents is not None else translation_agents_path()
    train = load_multi30k(data_dir, "train")
    # The split the agents were pretrained with: the game must be played on the lines they never saw.
    metrics_path = agents_dir / "build_metrics.json"
    built = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    corpus = built.get("corpus", "multi30k")  # older builds were in-domain
    pretrain_lines = built.get("split", {}).get("pretrain_lines")  # None: the default half
    val, test = load_multi30k(data_dir, "val"), load_multi30k(data_dir, "test")

    german_of: dict[str, str] = {}
    for fr, de in game_pairs(train, pretrain_lines=pretrain_lines):
        german_of.setdefault(fr, de)  # a French sentence that occurs twice (8 in the half split): first German kept
    game_prompts = list(german_of)
    english_of = {}
    for split in (val, test):
        german_of.update(zip(split["fr"], split["de"]))
        english_of.update(zip(split["fr"], split["en"]))
    listener = ListenerReward(agents_dir / "en-de", german_of, lr=float(listener_lr), max_tokens=max_tokens)

    def metrics(prompts: list[str], completions: list[str]) -> dict[str, float]:
        # Each BLEU with its length ratio (hypothesis / reference tokens): a speaker paid per German token drifts
        # into longer messages, which BLEU's brevity penalty does not charge.
        english = bleu_score(completions, [english_of[p] for p in prompts])
        german = bleu_score(listener.translate(completions), [german_of[p] for p in prompts])
        return {"drift_bleu": float(english.score), "drift_length_ratio": english.sys_len / english.ref_len,
                "task_bleu": float(german.score), "task_length_ratio": german.sys_len / german.ref_len}

    pretrain = list(zip(*pretraining_text(data_dir, corpus, train, pretrain_lines)["fr-en"]))
    return Task(name="translation_game", train_prompts=game_prompts, eval_prompts=list(val["fr"]),
                reward_fn=listener, reference_texts=[], pretrain_texts=pretrain,
                metrics_fn=metrics, test_prompts=list(test["fr"]), score_key="task_bleu", drift_key="drift_bleu",
                reference_lm=str(agents_dir / "en-lm"))
