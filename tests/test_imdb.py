"""IMDB mock sentiment: the task's data (first-half prompts, disjoint seeded splits, cleaned text), the MiniLM
sentiment classifier (training writes a complete folder, the reward is one probability per completion), the
`build imdb-classifier` command (and its old name, build-reward-model imdb), and the errors a user meets first (no
data file, no reward model)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
import torch

from elastic_reset.cli import main
from elastic_reset.models import IMDB_CLASSIFIER_BUILD as BUILD_COMMAND
from elastic_reset.pretrain.classifier import train_sentiment_classifier
from elastic_reset.rewards.classifier import SentimentReward, accuracy
from elastic_reset.tasks import get_task

GOOD = ["wonderful", "brilliant", "moving", "delightful", "superb", "charming", "great", "beautiful"]
BAD = ["awful", "boring", "dull", "terrible", "painful", "stupid", "bad", "dreadful"]
SMALL = dict(n_train=200, n_eval=40, n_reference=40, n_pretrain=100)


def synthetic_reviews(n: int) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        word = (GOOD if label else BAD)[(i // 2) % 8]
        texts.append(f"This film number {i} was {word}, truly {word} from start to end.")
        labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    """A classifier trained once for this module: 64 short reviews, 1 epoch, max_length 64, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        texts, labels = synthetic_reviews(64)
        out = tmp_path_factory.mktemp("rm") / "classifier"
        train_sentiment_classifier(texts, labels, out, epochs=1, batch_size=16, lr=1e-4, max_length=64, seed=0,
                                   eval_texts=texts[:16], eval_labels=labels[:16], log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return out


def independent_reviews(data_dir: Path, split: str) -> list[tuple[str, int]]:
    """The split read and cleaned without the package's code."""
    rows = []
    with gzip.open(data_dir / "imdb" / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows.append((" ".join(row["text"].replace("<br />", " ").split()), row["label"]))
    return rows


def first_half(text: str) -> str:
    words = text.split(" ")
    return " ".join(words[:len(words) // 2])


# ------------------------------------------------------------------------------------------------ the classifier
def test_training_writes_a_complete_model_folder(reward_dir):
    names = {p.name for p in reward_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "metrics.json"} <= names
    metrics = json.loads((reward_dir / "metrics.json").read_text())
    assert metrics["train_size"] == 64 and metrics["epochs"] == 1 and metrics["max_length"] == 64
    assert metrics["steps"] == 4 and metrics["seed"] == 0 and metrics["batch_size"] == 16
    assert metrics["test_size"] == 16 and 0.0 <= metrics["test_accuracy"] <= 1.0
    assert metrics["truncation_side"] == "left"
    # The atomic write leaves no temporary sibling behind.
    assert [p.name for p in reward_dir.parent.iterdir()] == ["classifier"]


def test_sentiment_reward_is_one_probability_per_completion(reward_dir):
    reward = SentimentReward(reward_dir, batch_size=4, max_length=64)
    prompts = ["The movie was", "I thought the plot", "Honestly,", "The acting", "It was", "Overall"]
    completions = [" wonderful.", " was dull and awful", " a brilliant film", "", " bad", " great great great"]
    values = reward(prompts, completions)
    assert len(values) == len(completions)
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in values)
    # The prompt is scored together with its completion (RL4LMs' include_prompt_for_eval), in input order.
    joined = reward.score([p + c for p, c in zip(prompts, completions)])
    assert values == pytest.approx(joined, abs=1e-6)
    singles = [reward.score([p + c])[0] for p, c in zip(prompts, completions)]
    assert values == pytest.approx(singles, abs=2e-2)  # bf16: padding may move the last digits
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        reward(["a", "b"], ["c"])
    texts, labels = synthetic_reviews(8)
    probs = reward.score(texts)
    right = [(p >= 0.5) == bool(y) for p, y in zip(probs, labels)]
    assert accuracy(reward_dir, texts, labels, max_length=64) == sum(right) / len(right)
    flipped = [1 - y for y in labels]
    assert accuracy(reward_dir, texts, flipped, max_length=64) == 1 - sum(right) / len(right)


def test_training_rejects_bad_labels(tmp_path):
    with pytest.raises(ValueError, match="labels must be 0"):
        train_sentiment_classifier(["a", "b"], [0, 2], tmp_path / "x", epochs=1, batch_size=2, lr=1e-4, seed=0)
    with pytest.raises(ValueError, match="2 texts but 1 labels"):
        train_sentiment_classifier(["a", "b"], [0], tmp_path / "x", epochs=1, batch_size=2, lr=1e-4, seed=0)
    assert not (tmp_path / "x").exists()


def test_missing_classifier_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nothing"))):
        SentimentReward(tmp_path / "nothing")


# ------------------------------------------------------------------------------------------------------ the task
def test_prompts_are_first_halves_of_cleaned_reviews_in_disjoint_splits(shared_data, reward_dir):
    task = get_task("imdb", str(shared_data), reward_model=str(reward_dir), **SMALL)
    assert (len(task.train_prompts), len(task.eval_prompts), len(task.reference_texts), len(task.pretrain_texts)) \
        == (200, 40, 40, 100)
    train = independent_reviews(shared_data, "train")
    test = independent_reviews(shared_data, "test")
    train_halves = {first_half(t): y for t, y in train}
    test_halves = {first_half(t) for t, _ in test}
    test_texts = {t for t, _ in test}

    assert all(p in train_halves for p in task.train_prompts)
    assert all(p in test_halves for p in task.eval_prompts)
    assert set(task.reference_texts) <= test_texts
    assert set(task.pretrain_texts) <= {t for t, _ in train}
    # Shuffled before taking a prefix (the files are all-negative, then all-positive).
    labels = [train_halves[p] for p in task.train_prompts]
    assert 0.3 < sum(labels) / len(labels) < 0.7
    # Validation prompts come from other reviews than the reference texts, and not from the training prompts.
    assert not any(r.startswith(p + " ") or r == p for p in task.eval_prompts for r in task.reference_texts)
    assert not set(task.eval_prompts) & set(task.train_prompts)
    assert not set(task.reference_texts) & set(task.pretrain_texts)
    # A prompt is a proper first half: at most half the words of a longer review.
    for p in task.train_prompts[:20]:
        assert p and not p.endswith(" ")
    everything = task.train_prompts + task.eval_prompts + task.reference_texts + task.pretrain_texts
    assert not any("<br" in t.lower() for t in everything)
    assert callable(task.reward_fn)
    values = task.reward_fn(task.eval_prompts[:3], [" I loved it.", " Awful.", ""])
    assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)


def test_task_is_deterministic_given_its_seed(shared_data, reward_dir):
    a = get_task("imdb", str(shared_data), reward_model=str(reward_dir), seed=3, **SMALL)
    b = get_task("imdb", str(shared_data), reward_model=str(reward_dir), seed=3, **SMALL)
    c = get_task("imdb", str(shared_data), reward_model=str(reward_dir), seed=4, **SMALL)
    for key in ("train_prompts", "eval_prompts", "reference_texts", "pretrain_texts"):
        assert getattr(a, key) == getattr(b, key)
        assert getattr(a, key) != getattr(c, key)


def test_max_prompt_words_keeps_the_end_of_the_half(shared_data, reward_dir):
    full = get_task("imdb", str(shared_data), reward_model=str(reward_dir), **SMALL)
    capped = get_task("imdb", str(shared_data), reward_model=str(reward_dir), max_prompt_words=10, **SMALL)
    for long, short in zip(full.train_prompts, capped.train_prompts):
        assert len(short.split(" ")) <= 10 and long.endswith(short)


def test_missing_data_file_names_the_path(tmp_path, reward_dir):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "imdb" / "train.jsonl.gz"))):
        get_task("imdb", str(tmp_path), reward_model=str(reward_dir))


def test_missing_reward_model_gives_the_build_command(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_RESET_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as err:
        get_task("imdb", str(shared_data), **SMALL)
    assert str(err.value).startswith("task.options.reward_model: no sentiment classifier at "
                                     f"{tmp_path / 'cache' / 'imdb-sentiment-minilm'}; build one with "
                                     f"`{BUILD_COMMAND}`")
    with pytest.raises(FileNotFoundError, match=re.escape(f"--out {tmp_path / 'mine'}")):
        get_task("imdb", str(shared_data), reward_model=str(tmp_path / "mine"), **SMALL)


def test_unknown_option_is_a_config_error(shared_data, reward_dir):
    with pytest.raises(ValueError, match="task.options"):
        get_task("imdb", str(shared_data), reward_model=str(reward_dir), n_trian=5)


# ---------------------------------------------------------------------------------------------------------- CLI
def test_build_reward_model_command(shared_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ELASTIC_RESET_CACHE", str(tmp_path / "cache"))
    args = ["build-reward-model", "imdb", "--data-dir", str(shared_data), "--n-train", "32", "--n-test", "16",
            "--max-length", "32", "--batch-size", "16"]
    assert main(args) == 0
    out = tmp_path / "cache" / "imdb-sentiment-minilm"  # the default: where the task looks
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_size"] == 32 and metrics["test_size"] == 16 and metrics["max_length"] == 32
    assert metrics["data_dir"] == str(shared_data)
    captured = capsys.readouterr()
    assert "test accuracy" in captured.out
    # The old name still works, with one line naming the new command.
    note = "elastic-reset: note: `build-reward-model imdb` is now `elastic-reset build imdb-classifier`\n"
    assert captured.err.count(note) == 1 and captured.err.count("note:") == 1
    # The task now finds it without being told where it is.
    assert get_task("imdb", str(shared_data), **SMALL).reward_fn(["It was"], [" great"])[0] >= 0.0
    # An existing model is not silently replaced, under either name.
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["build", "imdb-classifier", *args[2:]]) == 2
    assert "--force" in capsys.readouterr().err


def test_atomic_save_replaces_an_existing_folder(tmp_path):
    from elastic_reset.io import save_folder_atomically

    out = tmp_path / "model"
    save_folder_atomically(out, lambda d: (d / "a.txt").write_text("old"))
    save_folder_atomically(out, lambda d: (d / "b.txt").write_text("new"))
    assert [p.name for p in out.iterdir()] == ["b.txt"]

    def crash(d):
        (d / "half.txt").write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        save_folder_atomically(out, crash)
    assert [p.name for p in out.iterdir()] == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
