"""The gold-vs-proxy testbed: Bradley–Terry-noisy gold labels, gold-labelled pairs a proxy can learn
from, the forget set's prompts, and the imdb_gold task run end to end on tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from elastic_reset.data.preferences import read_pairs
from elastic_reset.data.wikitext import detokenize, paragraph_prompts
from elastic_reset.errors import ConfigError
from elastic_reset.models import byte_tokenizer, minilm_path, tiny_causal_lm
from elastic_reset.rewards.classifier import SentimentReward
from elastic_reset.rewards.gold import (GoldPairsConfig, bradley_terry_labels, build_gold_pairs, journal_path,
                                         label_pairs)


def test_bradley_terry_labels_follow_the_logistic_probability():
    n = 20_000
    share = sum(bradley_terry_labels([math.log(3)] * n, [0.0] * n, temperature=1.0, seed=0)) / n
    assert share == pytest.approx(0.75, abs=0.01)  # sigma(log 3) = 3/4
    hotter = sum(bradley_terry_labels([2 * math.log(3)] * n, [0.0] * n, temperature=2.0, seed=1)) / n
    assert hotter == pytest.approx(0.75, abs=0.01)  # the gap is measured in units of T
    assert all(bradley_terry_labels([0.1, 0.2], [0.0, 0.3], temperature=1e-4, seed=0) == [True, False]
               for _ in range(3))  # T -> 0: the gold's own order


class FakeGold:
    """Scores a text by its count of the letter 'a' (log-odds)."""

    texts = staticmethod(SentimentReward.texts)

    def log_odds(self, texts):
        return [float(t.count("a")) for t in texts]


def test_pairs_are_labelled_by_the_gold_and_keep_its_scores():
    prompts = ["p1 ", "p2 ", "p3 "]
    pairs = [("aaaa", "b"), ("b", "aaaa"), ("a", "a")]
    rows = label_pairs(prompts, pairs, FakeGold(), GoldPairsConfig(temperature=1e-4))
    assert [(r["chosen"], r["rejected"]) for r in rows[:2]] == [("aaaa", "b"), ("aaaa", "b")]
    assert [(r["gold_chosen"], r["gold_rejected"]) for r in rows[:2]] == [(4.0, 0.0), (4.0, 0.0)]
    assert [r["prompt"] for r in rows] == prompts


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny byte-level policy and an untrained tiny sentiment classifier on MiniLM's tokenizer, as folders."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    root = tmp_path_factory.mktemp("gold")
    tiny_causal_lm(seed=0).save_pretrained(root / "policy")
    byte_tokenizer().save_pretrained(root / "policy")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                          num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=64, num_labels=2))
    classifier.save_pretrained(root / "gold")
    tokenizer.save_pretrained(root / "gold")
    return root


def test_gold_pairs_are_written_as_a_preference_file_with_exact_gold_scores(tiny_models, tmp_path):
    prompts = [f"This film was {w} and" for w in ("great", "awful", "long", "odd", "fine", "dull")]
    # T far below the untrained classifier's gaps (1e-7 to 1e-4 log-odds): the labels are then the gold's own order
    config = GoldPairsConfig(n_pairs=5, temperature=1e-12, max_new_tokens=6, batch_size=2)
    out, metrics = build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, tmp_path / "pairs", config)
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == prompts[:5] and len(read_pairs(out / "pairs.jsonl")) <= 5
    gold = SentimentReward(tiny_models / "gold")
    chosen = gold.log_odds([r["prompt"] + r["chosen"] for r in rows])
    assert chosen == pytest.approx([r["gold_chosen"] for r in rows], abs=1e-5)
    gaps = [r["gold_chosen"] - r["gold_rejected"] for r in rows]
    assert min(gaps) >= 0  # T -> 0: the gold's own order (an exact tie alone would be a coin flip)
    assert metrics["label_agrees_with_gold"] == (sum(g > 0 for g in gaps) + 0.5 * gaps.count(0)) / 5
    assert json.loads((out / "metrics.json").read_text())["pairs"] == 5
    with pytest.raises(FileExistsError, match="--force"):
        build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, out, config)


def test_an_interrupted_pairs_build_resumes_to_the_very_pairs_of_an_uninterrupted_one(tiny_models, tmp_path,
                                                                                        monkeypatch):
    from transformers import GenerationMixin

    prompts = [f"This film was {w} and" for w in ("great", "awful", "long", "odd", "fine")]
    config = GoldPairsConfig(n_pairs=5, temperature=0.5, max_new_tokens=6, batch_size=1)
    whole, _ = build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, tmp_path / "whole", config)
    out = tmp_path / "pairs"
    journal = journal_path(out)

    def killed_at_batch(n: int, **options):
        """Build ``out`` with the n-th generation of this build raising as a kill would."""
        generate, calls = GenerationMixin.generate, []

        def generate_or_die(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return generate(self, *args, **kwargs)

        monkeypatch.setattr(GenerationMixin, "generate", generate_or_die)
        with pytest.raises(KeyboardInterrupt):
            build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, out, config, **options)
        monkeypatch.undo()
        return [json.loads(line)["step"] for line in journal.read_text().splitlines()]

    assert killed_at_batch(3) == [-1, 0, 1]
    with journal.open("a") as f:
        f.write('{"step": 2, "pairs": [["torn')  # what a kill during a write leaves
    with pytest.raises(FileExistsError, match="--resume"):
        build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, out, config)
    other = GoldPairsConfig(n_pairs=5, temperature=0.5, max_new_tokens=6, batch_size=1, seed=1)
    with pytest.raises(ConfigError, match="other settings \\(config\\)"):
        build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, out, other, resume=True)
    assert killed_at_batch(2, resume=True) == [-1, 0, 1, 2]  # the torn line is gone, batch 2 written once
    out, metrics = build_gold_pairs(tiny_models / "policy", tiny_models / "gold", prompts, out, config, resume=True)
    assert metrics["resumed_pairs"] == 3
    assert (out / "pairs.jsonl").read_text() == (whole / "pairs.jsonl").read_text()
    assert not journal.exists()


def test_a_missing_gold_is_refused_by_its_field_with_the_command_that_builds_one_there(shared_data, tmp_path,
                                                                                       capsys):
    from elastic_reset.cli import main
    from elastic_reset.models import IMDB_CLASSIFIER_BUILD
    from elastic_reset.tasks import get_task

    proxy, missing = tmp_path / "proxy", tmp_path / "no-gold"
    proxy.mkdir()
    (proxy / "reward_model.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as err:
        get_task("imdb_gold", data_dir=str(shared_data), reward_model=str(proxy), gold=str(missing))
    assert str(err.value).startswith(f"task.options.gold: no sentiment classifier at {missing}")
    assert f"`{IMDB_CLASSIFIER_BUILD} --out {missing}`" in str(err.value)
    # The build refuses it before it samples (its policy is missing too: sampling first would fail on that).
    assert main(["build", "gold-pairs", "--data-dir", str(shared_data), "--n-pairs", "2", "--gold", str(missing),
                 "--policy", str(tmp_path / "no-policy"), "--out", str(tmp_path / "pairs")]) == 2
    assert f"--gold: no sentiment classifier at {missing}" in capsys.readouterr().err
    assert not (tmp_path / "pairs").exists()


def test_wikitext_prompts_are_detokenized_paragraph_openings(shared_data):
    assert detokenize(" a guest @-@ starring role , 1 @,@ 000 times . ") == "a guest-starring role, 1,000 times."
    prompts = paragraph_prompts(shared_data, 20, seed=0)
    assert len(set(prompts)) == 20 and all(20 <= len(p.split(" ")) <= 40 and "@" not in p for p in prompts)
    assert prompts == paragraph_prompts(shared_data, 20, seed=0) != paragraph_prompts(shared_data, 20, seed=1)


def test_the_imdb_gold_task_trains_on_the_proxy_and_measures_the_gold(shared_data, tiny_models, tmp_path,
                                                                        monkeypatch):
    from elastic_reset.evaluation.runs import TASK_FILE
    from elastic_reset.reward_models.model import RewardModelConfig
    from elastic_reset.reward_models.train import train_reward_model
    from elastic_reset.rl.trainer import RLTrainer
    from elastic_reset.tasks import get_task
    from helpers import tiny_config

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"review {i}:", "chosen": " good" * (i % 3 + 1),
                                         "rejected": " bad"}) + "\n" for i in range(20)))
    proxy = tmp_path / "proxy"
    train_reward_model(RewardModelConfig(backbone="tiny-llama", data=[str(pairs)], batch_size=4, max_tokens=64),
                       proxy, progress=False, log=lambda _: None)
    calls = []  # the gold's texts and log-odds, call by call; an untrained classifier would score every text ~0

    def gold_log_odds(self, texts):
        calls.append((list(texts), [t.count("e") / 4 - 2.0 for t in texts]))
        return calls[-1][1]

    monkeypatch.setattr(SentimentReward, "log_odds", gold_log_odds)
    task = get_task("imdb_gold", data_dir=str(shared_data), reward_model=str(proxy), gold=str(tiny_models / "gold"),
                    n_train=16, n_eval=4, n_reference=4, n_forget=4, n_report=4)
    config = tiny_config("steps=2", "eval.every=2", "eval.num_prompts=4", "eval.num_texts=4", "eval.batch_size=4",
                         "eval.ema=false")
    records = RLTrainer(config, tmp_path / "run", task=task).train()
    first, last = records[0], records[-1]
    assert first["eval/win_rate"] == first["eval_forget/win_rate"] == 0.5
    for record in (first, last):
        for name, prompts in (("eval", task.eval_prompts[:4]), ("eval_forget", task.eval_sets["forget"]),
                              ("eval_report", task.eval_sets["report"])):
            # the gold scored this set's prompts + the policy's completions: its metrics are those scores' means
            texts, log_odds = next(c for c in calls if [t[:len(p)] for t, p in zip(c[0], prompts)] == prompts
                                   and record[f"{name}/gold_log_odds"] == pytest.approx(sum(c[1]) / len(c[1])))
            assert len(texts) == len(prompts) and len(set(log_odds)) > 1
            gold = [1 / (1 + math.exp(-x)) for x in log_odds]
            assert record[f"{name}/gold"] == pytest.approx(sum(gold) / len(gold))
        assert "eval/perplexity" in record and "eval_forget/perplexity" not in record
        assert "eval_report/perplexity" in record and not set(task.eval_sets["report"]) & set(task.eval_prompts)
        assert 0 <= record["eval/proxy_gold_agreement"] <= 1 and "eval_forget/proxy_gold_agreement" in record
    assert json.loads((tmp_path / "run" / TASK_FILE).read_text())["score"] == "gold"
    bare = get_task("imdb_gold", data_dir=str(shared_data), reward_model=str(proxy), gold=str(tiny_models / "gold"),
                    n_train=16, n_eval=4, n_reference=4, n_forget=0)
    assert bare.eval_sets == {}  # no forget set, no report set
    with pytest.raises(FileNotFoundError, match="task.options.reward_model"):
        get_task("imdb_gold", data_dir=str(shared_data), reward_model=str(tmp_path / "none"))


def test_the_gold_scores_an_evaluation_once_for_the_judge_and_the_metrics():
    from elastic_reset.rewards.classifier import SentimentReward
    from elastic_reset.tasks.imdb_gold import GoldScores

    calls = []

    class FakeGold:
        texts = staticmethod(SentimentReward.texts)

        def log_odds(self, texts):
            calls.append(texts)
            return [float(len(t)) - 10 for t in texts]

    gold = GoldScores(FakeGold())
    prompts, completions = ["a ", "b "], ["good", "very good"]
    assert gold.judge(prompts, completions) == [-4.0, 1.0]
    assert gold.metrics(prompts, completions) == pytest.approx(
        {"gold": (1 / (1 + math.exp(4)) + 1 / (1 + math.exp(-1))) / 2, "gold_log_odds": -1.5})
    assert len(calls) == 1  # the metrics read the judge's scores of the same texts
    gold.judge(prompts, ["bad", "bad"])
    assert len(calls) == 2 and gold.metrics(prompts, completions)["gold_log_odds"] == -1.5 and len(calls) == 3


def test_proxy_gold_agreement_is_the_share_of_gold_ordered_pairs_the_proxy_orders_alike():
    from elastic_reset.rewards.gold import pairwise_agreement
    from elastic_reset.tasks.imdb_gold import GoldScores

    assert pairwise_agreement([1, 2, 3], [10, 20, 30]) == 1.0 and pairwise_agreement([3, 2, 1], [10, 20, 30]) == 0.0
    # gold pairs (0,1) (0,2) (1,2) with (1,2) a gold tie left out; proxy agrees on (0,1), ties on (0,2)
    assert pairwise_agreement([0.0, 1.0, 0.0], [0.0, 5.0, 5.0]) == 0.75
    assert math.isnan(pairwise_agreement([1.0], [2.0]))

    class FakeGold:
        def texts(self, prompts, completions):
            return [p + c for p, c in zip(prompts, completions)]

        def log_odds(self, texts):
            return [float(len(t)) for t in texts]

    scores = GoldScores(FakeGold(), proxy=lambda prompts, completions: [-float(len(c)) for c in completions])
    assert scores.metrics(["a", "b"], ["x", "yy"])["proxy_gold_agreement"] == 0.0  # the proxy reverses the gold


def test_the_gao_fit_recovers_its_coefficients_and_peak():
    from elastic_reset.evaluation.overoptimisation import gao_fit

    d = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
    fit = gao_fit(d, [x * (1.5 - 0.5 * math.log(x)) if x > 0 else 0.0 for x in d])
    assert (fit.alpha, fit.beta, fit.r2, fit.points) == pytest.approx((1.5, 0.5, 1.0, 5))
    assert fit.peak_d == pytest.approx(math.exp(2.0)) and fit.peak_gain == pytest.approx(0.5 * math.exp(2.0))
    assert float(fit(fit.peak_d)) == pytest.approx(fit.peak_gain)  # the curve's maximum is the peak
    assert gao_fit([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).peak_d is None  # a straight line never turns down


def test_gold_and_proxy_gains_are_measured_from_step_0_and_drawn(tmp_path):
    import numpy as np

    from elastic_reset.errors import ReportError
    from elastic_reset.evaluation.figures import plot_gold_vs_proxy
    from elastic_reset.evaluation.overoptimisation import gold_vs_proxy
    from elastic_reset.evaluation.runs import Run

    def run(scores, score):
        return Run(path=tmp_path, method="kl", seed=0, drift="kl_init", source="eval", steps=np.array([0, 5, 10]),
                   rewards=np.array(scores), drifts=np.array([0.0, 1.0, 4.0]), score=score)

    curves = gold_vs_proxy({"kl": [run([0.2, 1.2, 0.7], "gold_log_odds")]},
                           {"kl": [run([-1.0, 0.0, 2.0], "reward")]})
    assert curves["kl"]["d"].tolist() == [0.0, 1.0, 2.0]
    assert curves["kl"]["gold"].tolist() == pytest.approx([0.0, 1.0, 0.5])
    assert curves["kl"]["proxy"].tolist() == [0.0, 1.0, 3.0]
    assert plot_gold_vs_proxy(curves, tmp_path / "gvp.png").stat().st_size > 1000
    with pytest.raises(ReportError, match="methods differ"):
        gold_vs_proxy({"kl": []}, {"er": []})
