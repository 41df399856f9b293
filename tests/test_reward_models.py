"""Reward models from preference pairs: the losses against hand-computed values, calibration on a
hand-made case, the prompt-disjoint split, and the pair readers (malformed files refused naming the line)."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import shutil
import time

import numpy as np
import pytest
import torch

from elastic_reset.data.preferences import (
    PreferencePair,
    html_to_text,
    load_hh_rlhf,
    load_stack_exchange,
    read_pairs,
    split_by_prompt,
    split_hh_dialogue,
)
from elastic_reset.errors import ConfigError, DataFileError, RunFileError
from elastic_reset.reward_models.calibration import calibration, clustered_accuracy_se
from elastic_reset.reward_models.losses import advantage, advantage_model_loss, bradley_terry_loss
from conftest import SHARED_DATA


def nls(x: float) -> float:
    """−log σ(x), by hand."""
    return math.log(1 + math.exp(-x))


# ------------------------------------------------------------------------------------------------- losses
def test_bradley_terry_loss_matches_the_hand_computed_value():
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert loss.item() == pytest.approx((nls(2.0) + nls(-1.0)) / 2, rel=1e-6)  # 0.720095


def test_advantage_model_loss_is_ranking_plus_bounding_with_margin_2_5():
    a_c, a_r = torch.tensor([1.0, 3.0]), torch.tensor([-1.0, 0.0])
    by_hand = [nls(1 - -1) + nls(2.5 - 1) + nls(2.5 + -1), nls(3 - 0) + nls(2.5 - 3) + nls(2.5 + 0)]
    assert advantage_model_loss(a_c, a_r).item() == pytest.approx(sum(by_hand) / 2, rel=1e-6)  # 0.815654
    # The bounding term pulls a chosen advantage above the margin back down (Bradley–Terry would push it up).
    a_c.requires_grad_(True)
    advantage_model_loss(a_c, a_r).backward()
    assert a_c.grad[1] > 0
    a_c.grad = None
    bradley_terry_loss(a_c, a_r).backward()
    assert a_c.grad[1] < 0


def test_advantage_subtracts_the_expected_reward_of_the_prompt():
    assert advantage(torch.tensor([2.0, -1.0]), torch.tensor([0.5, 0.5])).tolist() == [1.5, -1.5]


# -------------------------------------------------------------------------------------------- calibration
def test_calibration_of_a_hand_made_case():
    right = math.log(3.0)  # σ(log 3) = 0.75
    # All four pairs right at 0.75: the 0.75 bin is always right, the 0.25 bin always wrong: ECE = 0.25.
    c = calibration([right] * 4)
    assert c.accuracy == 1.0 and c.ece == pytest.approx(0.25)
    assert c.bin_confidence.tolist() == pytest.approx([0.25, 0.75]) and c.bin_count.tolist() == [4, 4]
    # Three right and one wrong, all at 0.75: right 75 % of the time when saying 0.75: calibrated, ECE = 0.
    c = calibration([right] * 3 + [-right])
    assert c.accuracy == pytest.approx(0.75) and c.ece == pytest.approx(0.0, abs=1e-12)
    assert c.bin_accuracy.tolist() == pytest.approx([0.25, 0.75])
    # Log loss: −(3 log 0.75 + log 0.25) / 4 = 0.5623; each pair claims max(p, 1 − p) = 0.75.
    assert c.log_loss == pytest.approx(-(3 * math.log(0.75) + math.log(0.25)) / 4) and c.confidence == 0.75
    # A model that always says 0.5 is perfectly calibrated yet no better than a coin: log loss ln 2, confidence 0.5.
    c = calibration([0.0] * 4)
    assert c.ece == 0.0 and c.log_loss == pytest.approx(math.log(2)) and c.confidence == 0.5


def test_pair_metrics_per_category_and_per_preference_set():
    from elastic_reset.reward_models.evaluate import pair_metrics

    pairs = [PreferencePair("p", "c", "r", cat) for cat in ("helpful", "helpful", "harmless", "beer", "mine")]
    chosen = np.array([1.0, 0.0, 2.0, -1.0, 5.0])
    rejected = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
    m = pair_metrics(pairs, chosen, rejected)
    assert m["pairs"] == 5 and m["accuracy"] == pytest.approx(3 / 5)
    helpful = m["categories"]["helpful"]
    assert helpful["pairs"] == 2 and helpful["accuracy"] == 0.5 and helpful["responses"] == 4
    assert helpful["mean"] == pytest.approx(0.5) and helpful["std"] == pytest.approx(0.5)
    assert m["categories"]["beer"]["accuracy"] == 0.0
    # HH-RLHF = helpful + harmless (margins 1, -1, 2); beer alone stands for Stack Exchange; "mine" is in no set.
    hh = calibration([1.0, -1.0, 2.0])
    assert m["datasets"]["hh-rlhf"] == {"pairs": 3, "prompts": 1, "accuracy": pytest.approx(2 / 3),
                                        "accuracy_se": None, "ece": pytest.approx(hh.ece),
                                        "log_loss": pytest.approx(hh.log_loss),
                                        "confidence": pytest.approx(hh.confidence)}
    assert m["datasets"]["stack-exchange"]["pairs"] == 1 and set(m["datasets"]) == {"hh-rlhf", "stack-exchange"}


def test_clustered_accuracy_se_of_a_hand_made_case():
    # Right four times on question a, wrong on b and on c: accuracy 2/3, per-question sums of (right − 2/3):
    # 4/3, −2/3, −2/3; √(3/2 · 24/9) / 6 = 1/3, against √(p(1 − p)/n) = 0.19 were the pairs independent.
    margins, prompts = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0], ["a", "a", "a", "a", "b", "c"]
    assert clustered_accuracy_se(margins, prompts) == pytest.approx(1 / 3)
    # One pair a prompt: the standard error of a mean, √(Σ (x − x̄)² / (n − 1)) / √n.
    right = np.array([1, 1, 1, 1, 0, 0.0])
    assert clustered_accuracy_se(margins, list("abcdef")) == pytest.approx(right.std(ddof=1) / math.sqrt(6))
    assert clustered_accuracy_se([1.0, -1.0], ["a", "a"]) is None
    with pytest.raises(ValueError, match="prompts"):
        clustered_accuracy_se([1.0], ["a", "b"])


def test_pair_metrics_count_prompts_and_their_error():
    from elastic_reset.reward_models.evaluate import pair_metrics

    pairs = [PreferencePair(q, "c", "r", "beer") for q in "aaaabc"]
    m = pair_metrics(pairs, np.array([1.0, 1, 1, 1, -1, -1]), np.zeros(6))
    beer = m["categories"]["beer"]
    assert (m["prompts"], beer["prompts"], m["datasets"]["stack-exchange"]["prompts"]) == (3, 3, 3)
    assert m["accuracy_se"] == beer["accuracy_se"] == pytest.approx(1 / 3)


def test_calibration_counts_a_tie_as_half_and_refuses_nan():
    assert calibration([0.0, 1.0]).accuracy == 0.75
    with pytest.raises(ValueError, match="margins"):
        calibration([float("nan")])


# -------------------------------------------------------------------------------------------------- split
def test_split_by_prompt_is_deterministic_order_free_and_prompt_disjoint():
    pairs = [PreferencePair(f"prompt {i % 700}", f"good {i}", f"bad {i}") for i in range(2000)]
    parts = split_by_prompt(pairs, seed=0)
    shuffled = random.Random(1).sample(pairs, len(pairs))
    again = split_by_prompt(shuffled, seed=0)
    assert {k: set(v) for k, v in parts.items()} == {k: set(v) for k, v in again.items()}
    prompts = {k: {p.prompt for p in v} for k, v in parts.items()}
    assert not (prompts["train"] & prompts["val"] or prompts["train"] & prompts["test"]
                or prompts["val"] & prompts["test"])
    assert sum(map(len, parts.values())) == 2000
    assert 0.75 < len(prompts["train"]) / 700 < 0.85 and len(prompts["val"]) > 40 and len(prompts["test"]) > 40
    assert {k: set(v) for k, v in split_by_prompt(pairs, seed=1).items()} != {k: set(v) for k, v in parts.items()}


# ----------------------------------------------------------------------------------------------- readers
def test_a_pair_file_is_read_and_a_malformed_line_is_refused_naming_it(tmp_path):
    good = {"prompt": "p", "chosen": "a", "rejected": "b", "category": "x"}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(good) + "\n")
    assert read_pairs(path) == [PreferencePair("p", "a", "b", "x")] * 2
    for line, message in [({"prompt": "p", "chosen": "a"}, "'rejected'"), ("{not json", "not valid JSON"),
                          ({"prompt": "p", "chosen": "a", "rejected": 3}, "'rejected'"),
                          ({"prompt": "p", "chosen": " ", "rejected": "b"}, "empty response")]:
        bad = tmp_path / "bad.jsonl.gz"
        with gzip.open(bad, "wt") as f:
            f.write(json.dumps(good) + "\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
        with pytest.raises(DataFileError, match=rf"bad\.jsonl\.gz:2: .*{message}"):
            read_pairs(bad)
    with pytest.raises(DataFileError, match="no such preference file"):
        read_pairs(tmp_path / "missing.jsonl")


def test_hh_dialogue_splits_at_the_last_assistant_turn():
    text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how?\n\nAssistant: like this."
    assert split_hh_dialogue(text) == ("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how?\n\nAssistant:",
                                       "like this.")


def test_html_bodies_become_plain_text():
    assert html_to_text("<p>Use &lt;5&gt; g.</p>\n\n\n<p>Then <a href='x'>stir</a>.</p>") == (
        "Use <5> g.\n\nThen stir.")


@pytest.fixture()
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline datasets not found at {SHARED_DATA} (set ELASTIC_RESET_DATA to the data folder)")
    return SHARED_DATA


def test_hh_rlhf_and_stack_exchange_load_with_their_categories(shared_data):
    with pytest.warns(UserWarning, match="24 pair"):
        hh = load_hh_rlhf(shared_data)
    assert len(hh) == 4666 - 24
    assert {p.category for p in hh} == {"helpful", "harmless"}
    assert all(p.prompt.endswith("\n\nAssistant:") and p.chosen != p.rejected for p in hh)
    se = load_stack_exchange(shared_data)
    assert len(se) == 2196 + 150 and {p.category for p in se} == {"beer", "coffee"}
    assert all(p.prompt.startswith("Question: ") and "<p>" not in p.chosen for p in se)


# -------------------------------------------------------------------------------------------- a tiny model
def toy_pairs(n: int, seed: int) -> list[PreferencePair]:
    """Chosen answers praise, rejected ones complain; everything else is random filler."""
    rng = random.Random(seed)
    words = ["the", "film", "plot", "actor", "scene", "music", "ending", "cast"]

    def filler():
        return " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))
    return [PreferencePair(f"Q{i}: {filler()}?\nA:", f" {filler()} great {filler()}", f" {filler()} awful {filler()}",
                           "odd" if i % 2 else "even") for i in range(n)]


@pytest.mark.parametrize("advantage_model", [False, True])
def test_a_tiny_reward_model_learns_the_toy_preference(tmp_path, advantage_model):
    from transformers import TrainingArguments

    from elastic_reset.models import byte_tokenizer, tiny_causal_lm
    from elastic_reset.reward_models.model import PairwiseRewardModel
    from elastic_reset.reward_models.evaluate import evaluate_pairs
    from elastic_reset.reward_models.packing import PairCollator, encode_pairs
    from elastic_reset.reward_models.train import PairwiseTrainer

    torch.set_num_threads(1)
    tokenizer = byte_tokenizer()
    model = PairwiseRewardModel(tiny_causal_lm(seed=0).model, pooling="last", advantage=advantage_model)
    before = evaluate_pairs(model, toy_pairs(64, seed=1), tokenizer, max_tokens=96)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, num_train_epochs=3,
                             learning_rate=3e-3, report_to=[], save_strategy="no", logging_steps=5,
                             remove_unused_columns=False, disable_tqdm=True, use_cpu=True, seed=0)
    trainer = PairwiseTrainer(model=model, args=args, train_dataset=encode_pairs(toy_pairs(256, seed=0), tokenizer, 96),
                              data_collator=PairCollator(tokenizer.pad_token_id))
    trainer.train()
    after = evaluate_pairs(model, toy_pairs(64, seed=1), tokenizer, max_tokens=96)
    stats = after["categories"]
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0] - 0.2, losses
    assert after["accuracy"] > 0.9 > before["accuracy"], (before["accuracy"], after["accuracy"])
    assert set(stats) == {"odd", "even"} and all(s["responses"] == 64 for s in stats.values())
    if advantage_model:  # the bounding loss keeps the advantages within about ±m
        assert all(abs(s["mean"]) < 2.5 for s in stats.values())


def test_grouping_by_length_pads_less_and_still_sees_every_pair_once(tmp_path):
    from transformers import TrainingArguments

    from elastic_reset.models import byte_tokenizer, tiny_causal_lm
    from elastic_reset.reward_models.model import PairwiseRewardModel
    from elastic_reset.reward_models.packing import PairCollator, encode_pairs
    from elastic_reset.reward_models.train import PairwiseTrainer

    tokenizer = byte_tokenizer()
    rng = random.Random(0)
    pairs = [PreferencePair(f"Q{i}:" + " x" * rng.randint(1, 60), " good", " bad", "c") for i in range(160)]
    encoded = encode_pairs(pairs, tokenizer, 256)
    padded, seen = {}, {}
    for strategy in ("random", "group_by_length"):
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, report_to=[],
                                 remove_unused_columns=False, use_cpu=True, train_sampling_strategy=strategy)
        trainer = PairwiseTrainer(model=PairwiseRewardModel(tiny_causal_lm(seed=0).model, pooling="last"),
                                  args=args, train_dataset=encoded, data_collator=PairCollator(tokenizer.pad_token_id))
        batches = list(trainer.get_train_dataloader())
        padded[strategy] = sum(b["pair_mask"].numel() for b in batches)
        seen[strategy] = sorted(int(m.sum()) for b in batches for m in b["pair_mask"])
    assert seen["group_by_length"] == seen["random"]  # the same pairs, each once
    assert padded["group_by_length"] < 0.8 * padded["random"], padded


def test_pairs_scored_in_batches_keep_their_order_and_scores():
    from elastic_reset.models import byte_tokenizer, tiny_causal_lm
    from elastic_reset.reward_models.model import PairwiseRewardModel
    from elastic_reset.reward_models.evaluate import score_pairs

    tokenizer = byte_tokenizer()
    model = PairwiseRewardModel(tiny_causal_lm(seed=0).model, pooling="last", advantage=True)
    pairs = toy_pairs(24, seed=3)  # of varied lengths: sorted by length for the batches
    batched = score_pairs(model, pairs, tokenizer, 96, batch_size=5)
    one_by_one = [score_pairs(model, [p], tokenizer, 96, batch_size=1) for p in pairs]
    for got, expected in zip(batched, zip(*one_by_one)):
        np.testing.assert_allclose(got, np.concatenate(expected), atol=1e-5)


class WordTokenizer:
    """Words with their leading space as tokens, as a BPE merges them: ``"Answer: "`` ends in a lone space token
    that ``"Answer: I"`` merges into ``" I"``."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def __call__(self, texts):
        import re

        return {"input_ids": [[self.vocab.setdefault(w, len(self.vocab)) for w in re.findall(r" ?[^ ]+| +$", t)]
                              for t in texts]}


def test_a_shared_prompt_keeps_the_tokens_of_the_whole_text_and_cuts_from_the_left():
    from elastic_reset.reward_models.packing import encode_shared_prompts

    tok = WordTokenizer()
    ids = lambda text: tok([text])["input_ids"][0]  # noqa: E731
    [(prompt, (yes, no))] = encode_shared_prompts(tok, ["Answer: "], [["I do", "No"]], max_tokens=8)
    assert prompt == ids("Answer:") and yes == ids(" I do") and no == ids(" No")
    # Cut from the left: each response to its last max_tokens - 1, the prompt to what the longest leaves (>= 1).
    [(prompt, (long, short))] = encode_shared_prompts(tok, ["a b c d e f"], [[" 1 2 3 4 5", " x y"]], max_tokens=4)
    assert long == ids(" 3 4 5") and short == ids(" x y") and prompt == ids(" f")
    [(prompt, (short,))] = encode_shared_prompts(tok, ["a b c d e f"], [[" x"]], max_tokens=4)
    assert prompt == ids(" d e f") and short == ids(" x")


def tiny_reward_model_folder(path, advantage: bool):
    """A reward model's folder as ``reward-model train`` writes it, with the untrained tiny model's weights."""
    from dataclasses import asdict

    from elastic_reset.reward_models.model import SETTINGS, WEIGHTS, RewardModelConfig, build_model, trained_state

    config = RewardModelConfig(backbone="tiny-llama", advantage=advantage, data=["unused.jsonl"], max_tokens=256)
    model, _ = build_model(config)
    path.mkdir()
    torch.save(trained_state(model), path / WEIGHTS)
    (path / SETTINGS).write_text(json.dumps({"config": asdict(config), "metrics": {}}))
    return path


@pytest.mark.parametrize("advantage_model", [False, True])
def test_one_pass_over_a_shared_prompt_scores_as_separate_passes(tmp_path, advantage_model):
    # A pair's row [prompt | chosen | rejected] gives each response the score of its own forward of prompt +
    # response (the mask hides the other response, the positions continue from the prompt), and e(x) the score
    # of the prompt alone; in training (pair_scores) and as the RL engine's reward alike.
    from elastic_reset.reward_models.model import load_reward_model
    from elastic_reset.reward_models.packing import PairCollator, encode_pairs, pair_scores
    from elastic_reset.reward_models.reward import PreferenceModelReward

    torch.set_num_threads(1)
    model, tokenizer, _ = load_reward_model(tiny_reward_model_folder(tmp_path / "rm", advantage_model))
    assert model.shares_prompt
    pairs = toy_pairs(12, seed=4)  # nothing is cut at 256 tokens
    collate = PairCollator(tokenizer.pad_token_id)
    with torch.no_grad():
        packed = pair_scores(model, collate(encode_pairs(pairs, tokenizer, 256, share_prompt=True)))
        separate = pair_scores(model, collate(encode_pairs(pairs, tokenizer, 256, share_prompt=False)))
    for got, expected in zip(packed, separate):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    reward = PreferenceModelReward(tmp_path / "rm", batch_size=5)
    prompts, answers = [p.prompt for p in pairs], [p.rejected for p in pairs]
    with torch.no_grad():
        alone = reward._score_separately(prompts, answers)
    np.testing.assert_allclose(reward(prompts, answers), alone.numpy(), atol=1e-5)
    np.testing.assert_allclose(reward(prompts, answers), separate[1].numpy(), atol=1e-5)


def write_toy_file(path, n, seed):
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                                        "category": p.category}) + "\n" for p in toy_pairs(n, seed)))
    return path


def test_a_backbone_folder_whose_tokenizer_is_not_its_models_is_refused(tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from elastic_reset.models import minilm_path
    from elastic_reset.reward_models.model import RewardModelConfig, build_model

    BertModel(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path)  # 30,522 tokens for 100 rows
    with pytest.raises(ConfigError, match="tokenizer has 30522 tokens but the model embeds 100"):
        build_model(RewardModelConfig(backbone=str(tmp_path), data=["x.jsonl"]))


def test_train_writes_a_model_that_loads_back_with_the_same_scores(tmp_path):
    from elastic_reset.reward_models.evaluate import evaluate_pairs
    from elastic_reset.reward_models.model import RewardModelConfig, load_reward_model
    from elastic_reset.reward_models.train import train_reward_model

    torch.set_num_threads(1)
    config = RewardModelConfig(backbone="tiny-llama", advantage=True, data=[str(write_toy_file(
        tmp_path / "pairs.jsonl", 320, 0))], epochs=2, batch_size=16, max_tokens=96, save_steps=10)
    metrics = train_reward_model(config, tmp_path / "rm", progress=False, log=lambda _: None)
    assert metrics["test"]["accuracy"] > 0.9 and metrics["train_pairs"] > 200
    assert not (tmp_path / "rm.checkpoints").exists()
    model, tokenizer, settings = load_reward_model(tmp_path / "rm")
    assert settings["config"]["advantage"] is True
    assert evaluate_pairs(model, toy_pairs(32, seed=5), tokenizer, 96)["accuracy"] > 0.9
    with pytest.raises(FileExistsError, match="already there"):
        train_reward_model(config, tmp_path / "rm", progress=False, log=lambda _: None)
    # A saved config edited by hand with an unknown key is one line naming the file and the key.
    saved = json.loads((tmp_path / "rm" / "reward_model.json").read_text())
    saved["config"]["learning_rat"] = 1.0
    (tmp_path / "rm" / "reward_model.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"reward_model.json: config.learning_rat: unknown key \(known: "):
        load_reward_model(tmp_path / "rm")
    # Weights that hold a pickled object are refused without running it, in one line.
    del saved["config"]["learning_rat"]
    (tmp_path / "rm" / "reward_model.json").write_text(json.dumps(saved))
    import datetime

    torch.save({"planted": datetime.datetime(2020, 1, 1)}, tmp_path / "rm" / "trained.pt")
    with pytest.raises(RunFileError, match=r"trained.pt: does not load \(it holds a pickled object \(datetime"):
        load_reward_model(tmp_path / "rm")


@pytest.mark.parametrize("group_by_length", [False, True])
def test_an_interrupted_training_resumes_to_the_same_model(tmp_path, group_by_length):
    from transformers import TrainerCallback

    from elastic_reset.reward_models.model import RewardModelConfig
    from elastic_reset.reward_models.train import train_reward_model

    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 13:
                raise KeyboardInterrupt

    torch.set_num_threads(1)
    data = [str(write_toy_file(tmp_path / "pairs.jsonl", 320, 0))]
    config = RewardModelConfig(backbone="tiny-llama", data=data, epochs=1, batch_size=8, max_tokens=96,
                               save_steps=10, group_by_length=group_by_length)
    full = train_reward_model(config, tmp_path / "full", progress=False, log=lambda _: None)
    with pytest.raises(KeyboardInterrupt):
        train_reward_model(config, tmp_path / "cut", progress=False, log=lambda _: None, callbacks=[Crash()])
    with pytest.raises(FileExistsError, match="--resume"):
        train_reward_model(config, tmp_path / "cut", progress=False, log=lambda _: None)
    class Count(TrainerCallback):
        steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            Count.steps += 1

    # The training time counts on from the checkpoint's (made large here, to tell it from the resumed part's).
    clock = tmp_path / "cut.checkpoints" / "checkpoint-10" / "training_seconds.json"
    assert 0 < json.loads(clock.read_text())["seconds"] < full["train_seconds"]
    clock.write_text(json.dumps({"seconds": 1000.0}))
    # Processes killed while saving leave a checkpoint without its trainer state (written last), or with half of
    # it; the Trainer, given either, stops with an error. The resume must take the newest finished one.
    for step, state in ((20, '{"global_step": 2'), (30, None)):
        unfinished = tmp_path / "cut.checkpoints" / f"checkpoint-{step}"
        shutil.copytree(clock.parent, unfinished)
        if state is None:
            (unfinished / "trainer_state.json").unlink()
        else:
            (unfinished / "trainer_state.json").write_text(state)
    logged = []
    t0 = time.perf_counter()
    resumed = train_reward_model(config, tmp_path / "cut", resume=True, progress=False, log=logged.append,
                                 callbacks=[Count()])
    for step in (20, 30):
        assert any(f"checkpoint-{step} was not saved to the end" in line for line in logged)
    assert 1000 < resumed["train_seconds"] < 1000 + time.perf_counter() - t0
    assert Count.steps == math.ceil(full["train_pairs"] / 8) - 10  # continued from the checkpoint at step 10
    assert resumed["train_loss"][-1] == pytest.approx(full["train_loss"][-1], rel=1e-5)
    assert resumed["test"]["accuracy"] == full["test"]["accuracy"]
    for category, stats in full["test"]["categories"].items():
        assert resumed["test"]["categories"][category]["mean"] == pytest.approx(stats["mean"], rel=1e-5)


def test_the_cli_trains_a_reward_model_and_refuses_a_bad_file(tmp_path, capsys):
    from elastic_reset.cli import main

    torch.set_num_threads(1)
    data = write_toy_file(tmp_path / "pairs.jsonl", 200, 0)
    assert main(["reward-model", "train", "--backbone", "tiny-llama", "--data", str(data), "--epochs", "2",
                 "--batch-size", "16", "--max-tokens", "96", "--save-steps", "7", "--group-by-length",
                 "--report-to", "tensorboard", "--out", str(tmp_path / "rm")]) == 0
    assert "test accuracy" in capsys.readouterr().out and (tmp_path / "rm" / "reward_model.json").is_file()
    config = json.loads((tmp_path / "rm" / "reward_model.json").read_text())["config"]
    assert config["save_steps"] == 7 and config["group_by_length"] is True
    # The tracker got the Trainer's losses, and its event files outlive the checkpoints folder.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [EventAccumulator(str(f.parent)).Reload() for f in (tmp_path / "rm" / "runs").rglob("events.out.*")]
    assert any(len(e.Scalars("train/loss")) >= 2 for e in events if "train/loss" in e.Tags()["scalars"])
    assert main(["reward-model", "train", "--backbone", "tiny-llama", "--data", str(data), "--report-to", "tensorbord",
                 "--out", str(tmp_path / "rm4")]) == 2
    assert "report_to: expected tracker names from" in capsys.readouterr().err
    assert not (tmp_path / "rm4.checkpoints").exists()
    # Scored again on its own test split: the numbers it was trained with, now per category too.
    assert main(["reward-model", "evaluate", str(tmp_path / "rm")]) == 0
    assert re.search(r"all \d\.\d{3} ± \d\.\d{3} /", capsys.readouterr().out)  # accuracy ± its error over prompts
    trained = json.loads((tmp_path / "rm" / "reward_model.json").read_text())["metrics"]["test"]
    again = json.loads((tmp_path / "rm" / "evaluation.json").read_text())["test"]
    assert again["accuracy"] == trained["accuracy"] and set(again["categories"]) == {"odd", "even"}
    assert main(["reward-model", "evaluate", str(tmp_path / "rm")]) == 2  # not replaced without --force
    assert "already there" in capsys.readouterr().err
    # Too few prompts for a test part: refused before training, not after it.
    write_toy_file(tmp_path / "few.jsonl", 3, 0)
    assert main(["reward-model", "train", "--backbone", "tiny-llama", "--data", str(tmp_path / "few.jsonl"),
                 "--out", str(tmp_path / "rm3")]) == 2
    assert "leaves no" in capsys.readouterr().err and not (tmp_path / "rm3.checkpoints").exists()
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "chosen": "a"}\n')
    assert main(["reward-model", "train", "--backbone", "tiny-llama", "--data", str(tmp_path / "bad.jsonl"),
                 "--out", str(tmp_path / "rm2")]) == 2
    assert "bad.jsonl:1: field 'rejected'" in capsys.readouterr().err


def test_reliability_diagram_is_written(tmp_path):
    from elastic_reset.evaluation.figures import plot_reliability

    c = calibration([math.log(3.0)] * 3 + [-1.0, 2.0])
    run = {"test": {"accuracy": c.accuracy, "ece": c.ece, "bins": {
        "confidence": c.bin_confidence.tolist(), "accuracy": c.bin_accuracy.tolist(), "count": c.bin_count.tolist()}}}
    out = plot_reliability({"RM": [run, run], "AM": run}, tmp_path / "rel.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rl_against_a_trained_reward_model_raises_its_held_out_score(shared_data, tmp_path):
    # The helpful task end to end on tiny models: a tiny reward model trained on HH-RLHF pairs is the reward, a
    # tiny policy trains against it with RLOO, and the reward model's score of the policy's answers to held-out
    # (validation) prompts rises. Flipping the policy loss's sign makes it fail.
    from elastic_reset.reward_models.model import RewardModelConfig
    from elastic_reset.reward_models.train import train_reward_model
    from elastic_reset.rl.trainer import RLTrainer
    from test_learning import evals, learning_config

    torch.set_num_threads(1)
    with pytest.warns(UserWarning):
        pairs = load_hh_rlhf(shared_data, ("helpful",))[:300]
    (tmp_path / "hh.jsonl").write_text("".join(json.dumps(
        {"prompt": p.prompt[-200:], "chosen": p.chosen[:100], "rejected": p.rejected[:100]}) + "\n" for p in pairs))
    train_reward_model(RewardModelConfig(backbone="tiny-llama", data=[str(tmp_path / "hh.jsonl")], epochs=4,
                                         batch_size=16, max_tokens=96), tmp_path / "rm", progress=False,
                       log=lambda _: None)
    config = learning_config("task.name=helpful", f"task.data_dir={shared_data}", "eval.num_texts=4",
                             "model.max_prompt_tokens=64")
    config.task.options["reward_model"] = str(tmp_path / "rm")
    with pytest.warns(UserWarning):
        ev = evals(RLTrainer(config, tmp_path / "run").train())
    start, end = ev[0]["eval/reward"], ev[30]["eval/reward"]
    assert end > start + 0.5, f"held-out reward-model score {start:.3f} -> {end:.3f} in 30 iterations"


# ------------------------------------------------------------------------------ pairs without a preference
def test_a_pair_file_leaves_out_pairs_without_a_preference_naming_the_file(tmp_path):
    good, other = ({"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "c", "rejected": "d"})
    tie = {"prompt": "p", "chosen": "same", "rejected": "same"}
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (good, tie, other, tie)))
    with pytest.warns(UserWarning, match=rf"{re.escape(str(path))}: 2 pair\(s\) left out \(chosen and rejected are "
                                         r"identical"):
        assert read_pairs(path) == [PreferencePair("p", "a", "b"), PreferencePair("q", "c", "d")]
    path.write_text(json.dumps(tie) + "\n")
    with pytest.warns(UserWarning, match="1 pair"), pytest.raises(DataFileError, match="no preference pairs"):
        read_pairs(path)


def test_hh_rlhf_leaves_out_pairs_the_same_way(tmp_path):
    folder = tmp_path / "hh-rlhf" / "helpful-base"
    folder.mkdir(parents=True)
    dialogue = "\n\nHuman: hi?\n\nAssistant:"
    rows = [{"chosen": dialogue + " yes", "rejected": dialogue + " no"},
            {"chosen": dialogue + " same", "rejected": dialogue + " same"},                  # no preference
            {"chosen": dialogue + " yes", "rejected": "\n\nHuman: other?\n\nAssistant: no"}]  # two prompts
    with gzip.open(folder / "test.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match=r"hh-rlhf: 2 pair\(s\) left out \(the two transcripts differ before the "
                                         r"last answer, or the answers are identical or empty\)"):
        assert load_hh_rlhf(tmp_path, ("helpful",)) == [PreferencePair(dialogue, "yes", "no", "helpful")]


# ------------------------------------------------------------------------- numbers refused before a build
BAD_NUMBERS = [["--lr", "-1"], ["--lr", "nan"], ["--lr", "0"], ["--epochs", "inf"], ["--epochs", "0"],
               ["--seed", "-1"], ["--seed", "1.5"], ["--batch-size", "0"], ["--max-tokens", "0"]]


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=[" ".join(b) for b in BAD_NUMBERS])
def test_reward_model_train_refuses_a_bad_number_while_parsing(tmp_path, monkeypatch, capsys, bad):
    from elastic_reset.cli import main
    from elastic_reset.reward_models import train

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(train, "train_reward_model", no_build)
    monkeypatch.setattr(train, "build_model", no_build)
    with pytest.raises(SystemExit) as exit_:
        main(["reward-model", "train", "--backbone", "tiny-llama", "--data", str(tmp_path / "p.jsonl"), *bad])
    assert exit_.value.code == 2
    assert f"error: argument {bad[0]}: " in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("command", [["build-reward-model", "imdb"], ["build-policy", "imdb"],
                                     ["build", "imdb-classifier"], ["build", "imdb-policy"]])
def test_the_build_commands_refuse_a_bad_number_while_parsing(capsys, command):
    from elastic_reset.cli import main

    classifier = command in (["build-reward-model", "imdb"], ["build", "imdb-classifier"])
    numbers = ([["--lr", "-1"], ["--lr", "nan"], ["--seed", "-1"], ["--epochs", "0"], ["--n-train", "0"]]
               if classifier else [["--steps", "0"], ["--steps", "-3"]])
    for bad in numbers:
        with pytest.raises(SystemExit) as exit_:
            main([*command, *bad])
        assert exit_.value.code == 2
        assert f"error: argument {bad[0]}: " in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("field, value", [("lr", -1.0), ("lr", float("nan")), ("epochs", float("inf")),
                                          ("seed", -1), ("split_seed", 2**32), ("margin", 0.0)])
def test_reward_model_config_refuses_a_bad_number_before_anything_loads(tmp_path, monkeypatch, field, value):
    from elastic_reset.reward_models import train

    def no_load(*args, **kwargs):
        raise AssertionError("data or a model was loaded")

    monkeypatch.setattr(train, "load_preferences", no_load)
    monkeypatch.setattr(train, "build_model", no_load)
    config = train.RewardModelConfig(backbone="tiny-llama", data=[str(tmp_path / "p.jsonl")], **{field: value})
    with pytest.raises(ConfigError, match=rf"^{field}: expected"):
        train.train_reward_model(config, tmp_path / "rm")
