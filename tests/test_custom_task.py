"""Bring your own task: the `prompts` task's loaders, TRL-style rewards named by import path, task
factories named by import path, their one-line errors, and the README's example run end to end."""

from __future__ import annotations

import inspect
import json
import math
import re
import shlex
import sys
import traceback

import pytest
import torch
from helpers import ROOT, TINY

from elastic_reset.cli import main
from elastic_reset.errors import ConfigError, DataFileError, ElasticResetError, RewardError
from elastic_reset.io import read_metrics
from elastic_reset.rl.reward import CheckedReward
from elastic_reset.tasks import Task, get_task
from elastic_reset.tasks.prompts import PromptsTask

PROMPTS = [f"Prompt number {i}:" for i in range(10)]
LETTERS = ["e", "a", "o", "i", "e", "a", "o", "i", "e", "a"]
REWARD = """
def letter_reward(prompts, completions, letter, **kwargs):
    return [c.count(x) / len(c) if c else 0.0 for c, x in zip(completions, letter)]

def echo(prompts, completions, **kwargs):
    return [float(len(p)) for p in prompts]

def maybe(prompts, completions, **kwargs):
    return [None if c == "skip" else 1.0 for c in completions]

def short(prompts, completions, **kwargs):
    return [0.0]

def strings(prompts, completions, **kwargs):
    return ["high"] * len(completions)

def broken(prompts, completions, **kwargs):
    return [1.0 / 0 for c in completions]

def positional_only(prompts, completions):
    return [0.0] * len(completions)

NOT_CALLABLE = 3
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p, "letter": x}) + "\n"
                                                   for p, x in zip(PROMPTS, LETTERS)))
    (tmp_path / "rewards.py").write_text(REWARD)
    return tmp_path


def task(files, **options):
    options.setdefault("path", str(files / "prompts.jsonl"))
    options.setdefault("reward", f"{files / 'rewards.py'}:letter_reward")
    return get_task("prompts", **options)


def checked(t: Task, bad_reward="error") -> CheckedReward:
    return CheckedReward(t.reward_fn, t.name, bad_reward, torch.device("cpu"))


# ------------------------------------------------------------------------------------------------ loaders
def test_jsonl_prompts_with_a_seeded_held_out_fraction(files):
    t = task(files, eval_fraction=0.2)
    assert isinstance(t, PromptsTask) and len(t.eval_prompts) == 2 and len(t.train_prompts) == 8
    assert sorted(t.train_prompts + t.eval_prompts) == sorted(PROMPTS)
    assert [p for p in PROMPTS if p in t.train_prompts] == t.train_prompts  # file order kept
    assert task(files, eval_fraction=0.2).eval_prompts == t.eval_prompts
    assert task(files, eval_fraction=0.2, seed=1).eval_prompts != t.eval_prompts
    assert t.drift_key == "kl_init" and t.reference_texts == []


def test_csv_with_a_named_column_and_an_eval_file(files):
    (files / "p.csv").write_text("question,letter\n" + "".join(f"{p},{x}\n" for p, x in zip(PROMPTS, LETTERS)))
    (files / "held.csv").write_text("question,letter\nHeld out one:,u\nHeld out two:,y\n")
    t = task(files, path=str(files / "p.csv"), column="question", eval_path=str(files / "held.csv"))
    assert t.train_prompts == PROMPTS and t.eval_prompts == ["Held out one:", "Held out two:"]
    assert t.reward_fn(["Held out one:"], ["uuuu"]) == [1.0]  # the eval file's own column


def test_plain_text_one_prompt_per_line_with_reference_and_pretrain_texts(files):
    (files / "p.txt").write_text("\n".join(PROMPTS) + "\n\n")
    (files / "ref.txt").write_text("A held-out sentence.\nAnother one.\n")
    (files / "pre.jsonl").write_text(json.dumps({"text": "Some pretraining text."}) + "\n")
    t = task(files, path=str(files / "p.txt"), reward=f"{files / 'rewards.py'}:echo",
             reference=str(files / "ref.txt"), pretrain=str(files / "pre.jsonl"))
    assert sorted(t.train_prompts + t.eval_prompts) == sorted(PROMPTS)
    assert t.reference_texts == ["A held-out sentence.", "Another one."] and t.drift_key == "perplexity"
    assert t.pretrain_texts == ["Some pretraining text."]
    assert t.reward_fn([PROMPTS[0]], ["x"]) == [float(len(PROMPTS[0]))]


def test_a_local_datasets_dataset_and_its_splits(files):
    from datasets import Dataset, DatasetDict

    train = Dataset.from_dict({"prompt": PROMPTS, "letter": LETTERS})
    test = Dataset.from_dict({"prompt": ["Test one:", "Test two:"], "letter": ["t", "s"]})
    train.save_to_disk(str(files / "flat"))
    DatasetDict({"train": train, "test": test}).save_to_disk(str(files / "dict"))
    t = task(files, path=None, dataset=str(files / "flat"))
    assert sorted(t.train_prompts + t.eval_prompts) == sorted(PROMPTS)
    t = task(files, path=None, dataset=str(files / "dict"), eval_split="test")
    assert t.train_prompts == PROMPTS and t.eval_prompts == ["Test one:", "Test two:"]
    assert t.reward_fn(["Test one:"], ["tt"]) == [1.0]
    with pytest.raises(ConfigError, match=r"task\.options\.dataset: .* has no split 'validation'"):
        task(files, path=None, dataset=str(files / "dict"), eval_split="validation")


def test_a_folder_that_datasets_load_dataset_reads(files):
    (files / "folder").mkdir()
    (files / "folder" / "train.csv").write_text("prompt,letter\n" + "".join(f"{p},{x}\n"
                                                                            for p, x in zip(PROMPTS, LETTERS)))
    t = task(files, path=str(files / "folder"))
    assert sorted(t.train_prompts + t.eval_prompts) == sorted(PROMPTS)
    assert t.reward_fn([PROMPTS[1]], ["a"]) == [1.0]


def test_without_the_datasets_package_a_dataset_is_one_line(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(ConfigError, match=r"^task\.options\.dataset: reading 'user/name' needs the `datasets` "):
        task(files, path=None, dataset="user/name")
    assert task(files).train_prompts  # files need no `datasets`


# ------------------------------------------------------------------------------------------------ rewards
def test_a_trl_reward_gets_the_rows_other_columns(files):
    t = task(files)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    scored = checked(t)(prompts, ["eeee", "aab", ""])
    scores, keep = scored.scores, scored.keep
    assert scores.tolist() == pytest.approx([1.0, 2 / 3, 0.0]) and keep.all()


def test_several_rewards_are_summed_with_weights_and_none_means_no_reward(files):
    t = task(files, reward=[f"{files / 'rewards.py'}:letter_reward", f"{files / 'rewards.py'}:maybe"],
             reward_weights=[2.0, 0.5])
    assert t.reward_fn([PROMPTS[0], PROMPTS[0]], ["ee", "skip"]) == [2.5, 0.0]
    only = task(files, reward=f"{files / 'rewards.py'}:maybe")
    assert math.isnan(only.reward_fn([PROMPTS[0]], ["skip"])[0])
    with pytest.raises(RewardError, match="non-finite"):
        checked(only)([PROMPTS[0]], ["skip"])
    scored = checked(only, "drop")([PROMPTS[0], PROMPTS[0]], ["skip", "ok"])
    scores, keep = scored.scores, scored.keep
    assert keep.tolist() == [False, True]


def test_checked_reward_calls_keyword_rewards_by_keyword_and_others_positionally():
    def trl(completions, **kwargs):  # TRL rewards often leave prompts to kwargs
        return [float(len(c)) for c in completions]

    def positional(p, c):
        return [1.0] * len(c)

    device = torch.device("cpu")
    assert CheckedReward(trl, "t", "error", device)(["p"], ["abc"]).scores.tolist() == [3.0]
    assert CheckedReward(positional, "t", "error", device)(["p"], ["abc"]).scores.tolist() == [1.0]
    with pytest.raises(RewardError, match="did not return numbers"):
        CheckedReward(lambda p, c: ["x"], "t", "error", device)(["p"], ["abc"])


def test_the_users_exception_keeps_its_own_traceback(files):
    t = task(files, reward=f"{files / 'rewards.py'}:broken")
    with pytest.raises(ZeroDivisionError) as info:
        checked(t)([PROMPTS[0]], ["x"])
    assert not isinstance(info.value, ElasticResetError)
    text = "".join(traceback.format_exception(info.value))
    assert "rewards.py" in text and "1.0 / 0" in text and "reward function of task 'prompts'" in text
    assert "(raised by task.options.reward " in text and "rewards.py:broken" in text


def test_the_cli_reports_a_bad_column_in_one_line(files, capsys):
    code = main(["train", str(TINY), "--out", str(files / "run"), "--set", "task.name=prompts",
                 "--set", f"task.options.path={files / 'prompts.jsonl'}", "--set", "task.options.column=question",
                 "--set", f"task.options.reward={files / 'rewards.py'}:letter_reward"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "task.options.column: " in err and "prompts.jsonl" in err


def test_a_reward_module_on_the_import_path(files, monkeypatch):
    (files / "my_trl_rewards.py").write_text(REWARD)
    monkeypatch.chdir(files)
    monkeypatch.delitem(sys.modules, "my_trl_rewards", raising=False)
    try:
        t = task(files, reward="my_trl_rewards:letter_reward")
        assert t.reward_fn([PROMPTS[1]], ["aa"]) == [1.0]
    finally:
        sys.modules.pop("my_trl_rewards", None)


def _sequence_model(folder, num_labels=1, template=None):
    """A tiny BERT sequence classifier on MiniLM's tokenizer, saved as a folder."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from elastic_reset.models import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    tokenizer.chat_template = template
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=64, num_labels=num_labels))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer


def test_a_reward_model_folder_scores_prompt_and_completion_as_trl_does(files):
    model, tokenizer = _sequence_model(files / "rm")
    t = task(files, reward=[str(files / "rm"), f"{files / 'rewards.py'}:letter_reward"], reward_weights=[1.0, 10.0])
    prompts, completions = [PROMPTS[0], PROMPTS[1]], [" eeee", " a long answer"]
    with torch.no_grad():
        enc = tokenizer([p + c for p, c in zip(prompts, completions)], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        logits = model(**enc).logits[:, 0].tolist()
    letters = [c.count(x) / len(c) for c, x in zip(completions, LETTERS[:2])]
    assert t.reward_fn(prompts, completions) == pytest.approx([a + 10 * b for a, b in zip(logits, letters)],
                                                              abs=1e-5)
    _sequence_model(files / "classifier", num_labels=2)
    with pytest.raises(ConfigError, match=r"^task\.options\.reward: .*classifier is not module:function, and no "
                                          r"reward model loads from it \(.*one output \(num_labels=1\); this one "
                                          r"has 2\)$"):
        task(files, reward=str(files / "classifier"))


def test_a_reward_model_renders_a_conversation_with_its_own_chat_template(files):
    model, tokenizer = _sequence_model(files / "rm", template="{% for m in messages %}[{{ m.role }}] {{ m.content }} "
                                                              "{% endfor %}")
    t = chat_task(files, chat_rows(), reward=str(files / "rm"))
    policy = byte_tokenizer_with(TEMPLATE)
    t.bind_tokenizer(policy)
    asked = "<system>Be brief.<user>Question 3?<assistant>"
    with torch.no_grad():
        enc = tokenizer(["[system] Be brief. [user] Question 3? [assistant] fine "], return_tensors="pt",
                        add_special_tokens=False)
        expected = model(**enc).logits[0, 0].item()
    assert t.reward_fn([asked], ["fine"]) == pytest.approx([expected], abs=1e-5)


THINKING = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>"
            "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}{% endif %}")


def test_chat_template_kwargs_reach_the_policys_template_and_a_reward_models_as_in_trl(files):
    t = chat_task(files, chat_rows(), chat_template_kwargs={"enable_thinking": False})
    t.bind_tokenizer(byte_tokenizer_with(THINKING))
    assert "<system>Be brief.<user>Question 3?<assistant><no-think>" in t.train_prompts + t.eval_prompts
    plain = chat_task(files, chat_rows())
    plain.bind_tokenizer(byte_tokenizer_with(THINKING))
    assert "<system>Be brief.<user>Question 3?<assistant>" in plain.train_prompts + plain.eval_prompts

    rm_template = ("{% for m in messages %}{{ m.content }} {% endfor %}"
                   "{% if enable_thinking is defined and not enable_thinking %}nothink{% endif %}")
    model, tokenizer = _sequence_model(files / "rm", template=rm_template)
    rm = chat_task(files, chat_rows(), reward=str(files / "rm"), chat_template_kwargs={"enable_thinking": False})
    rm.bind_tokenizer(byte_tokenizer_with(THINKING))
    with torch.no_grad():
        enc = tokenizer(["Be brief. Question 3? fine nothink"], return_tensors="pt", add_special_tokens=False)
        expected = model(**enc).logits[0, 0].item()
    asked = "<system>Be brief.<user>Question 3?<assistant><no-think>"
    assert rm.reward_fn([asked], ["fine"]) == pytest.approx([expected], abs=1e-5)


def test_a_reward_model_of_reward_model_train_is_the_reward(files):
    from elastic_reset.reward_models.model import RewardModelConfig
    from elastic_reset.reward_models.reward import PreferenceModelReward
    from elastic_reset.reward_models.train import train_reward_model

    pairs = files / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"q {i}:", "chosen": " e" * (i % 3 + 1), "rejected": " x"}) + "\n"
                             for i in range(40)))
    train_reward_model(RewardModelConfig(backbone="tiny-llama", data=[str(pairs)], batch_size=4, max_tokens=32),
                       files / "bt", progress=False, log=lambda _: None)
    t = task(files, reward=str(files / "bt"))
    prompts, completions = [PROMPTS[2], PROMPTS[3]], [" e e", " x"]
    assert t.reward_fn(prompts, completions) == pytest.approx(PreferenceModelReward(files / "bt")(prompts,
                                                                                                  completions))
    with pytest.raises(ConfigError, match=r"^task\.options\.reward: .*bt is a reward model `reward-model train` "
                                          r"wrote, which scores text; these prompts are chat messages$"):
        chat_task(files, chat_rows(), reward=str(files / "bt"))


def test_trls_own_token_id_reward_gets_the_completion_ids(files):
    rewards = pytest.importorskip("trl.rewards")
    t = get_task("prompts", path=str(files / "prompts.jsonl"),
                 reward=[rewards.get_soft_overlong_punishment(max_completion_len=8, soft_punish_cache=4),
                         f"{files / 'rewards.py'}:letter_reward"])
    from elastic_reset.lm.rollout import Rollout

    ids = torch.tensor([[5, 5, 5, 0, 0, 0, 0], [7] * 7])  # 3 and 7 tokens, right-padded
    rollout = Rollout(query_ids=torch.ones(2, 1, dtype=torch.long), query_mask=torch.ones(2, 1, dtype=torch.long),
                      response_ids=ids, response_mask=(ids > 0).float(), logprobs=torch.zeros(2, 7))
    scores = checked(t)([PROMPTS[0], PROMPTS[1]], ["ee", "bbbbbbb"], rollout).scores
    assert scores.tolist() == pytest.approx([0.0 + 1.0, -0.75 + 0.0])  # (8 - 4 - 7) / 4 for 7 tokens


def test_a_run_passes_each_sample_its_token_ids_and_logs_each_reward(files):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    (files / "ids.py").write_text("def n_tokens(completion_ids, **kwargs):\n"
                                  "    return [float(len(ids)) for ids in completion_ids]\n")
    rewards = f"['{files / 'ids.py'}:n_tokens', '{files / 'rewards.py'}:letter_reward']"
    config = tiny_config("task.name=prompts", "steps=2", "eval.every=2", "eval.num_prompts=2",
                         f"task.options={{path: {files / 'prompts.jsonl'}, reward: {rewards}, "
                         "reward_weights: [1.0, 10.0]}")
    records = RLTrainer(config, files / "run").train()
    train = [r for r in records if "reward" in r]
    assert len(train) == 2
    for r in train:  # TRL's rewards/<name>: each function's mean, the reward their weighted sum
        assert r["rewards/n_tokens"] == pytest.approx(r["response_length"])
        assert r["reward"] == pytest.approx(r["rewards/n_tokens"] + 10 * r["rewards/letter_reward"])
    evals = [r for r in records if "eval/reward" in r]
    assert len(evals) == 2
    for r in evals:
        assert r["eval/rewards/n_tokens"] == pytest.approx(r["eval/response_length"])
        assert r["eval/reward"] == pytest.approx(r["eval/rewards/n_tokens"] + 10 * r["eval/rewards/letter_reward"])


SCHEDULED = """
def scheduled(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
    log_metric("progress", trainer_state.global_step / trainer_state.max_steps)
    log_extra("length", [len(c) for c in completions])
    return [float(trainer_state.global_step)] * len(completions)
"""


def test_a_trl_reward_gets_the_trainer_state_and_what_it_logs_reaches_the_run_logs(files):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    (files / "sched.py").write_text(SCHEDULED)
    config = tiny_config("task.name=prompts", "steps=3", "eval.every=3", "eval.num_prompts=2", "log_completions=true",
                         f"task.options={{path: {files / 'prompts.jsonl'}, reward: {files / 'sched.py'}:scheduled}}")
    records = RLTrainer(config, files / "run").train()
    train = [r for r in records if "reward" in r]
    # as in TRL, global_step counts the iterations done before this one's rewards; max_steps is the run's steps
    assert [(r["step"], r["reward"], r["progress"]) for r in train] == [(1, 0.0, 0.0), (2, 1.0, 1 / 3),
                                                                         (3, 2.0, 2 / 3)]
    evals = [r for r in records if "eval/reward" in r]
    assert [(r["step"], r["eval/reward"], r["eval/progress"]) for r in evals] == [(0, 0.0, 0.0), (3, 3.0, 1.0)]
    rows = read_metrics(files / "run" / "completions.jsonl")
    n = config.algo.prompts_per_step * config.algo.samples_per_prompt
    assert [r["step"] for r in rows] == [1] * n + [2] * n + [3] * n
    assert all(r["length"] == len(r["completion"]) and r["reward"] == r["rewards/scheduled"] == r["step"] - 1
               and r["prompt"] in PROMPTS for r in rows)


def test_completion_rows_hold_what_json_can_write():
    import numpy as np

    from elastic_reset.rl.reward import completion_rows

    rows = completion_rows(3, ["p", "q"], ["a", "b"], [1.0, None], {"r": [1.0, None]},
                           {"n": [np.float32(0.5), torch.tensor(2)], "v": [np.arange(2), [1, {"k": "x"}]]})
    assert json.loads(json.dumps(rows)) == [
        {"step": 3, "prompt": "p", "completion": "a", "reward": 1.0, "rewards/r": 1.0, "n": 0.5, "v": "[0 1]"},
        {"step": 3, "prompt": "q", "completion": "b", "reward": None, "rewards/r": None, "n": 2, "v": [1, {"k": "x"}]}]


def test_a_resumed_run_writes_each_steps_completions_once(files):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    def config(steps):
        return tiny_config("task.name=prompts", f"steps={steps}", "checkpoint_every=2", "log_completions=true",
                           f"task.options={{path: {files / 'prompts.jsonl'}, reward: {files / 'rewards.py'}:echo}}")

    run = files / "run"
    RLTrainer(config(2), run).train()
    # a crash after step 3's rows, before its checkpoint: a resumed run writes step 3 again, and only once
    for name in ("metrics.jsonl", "completions.jsonl"):
        with open(run / name, "a") as f:
            f.write(json.dumps({"step": 3, "reward": 0.0, "prompt": "lost"}) + "\n")
    RLTrainer(config(3), run, resume=True).train()
    steps = [r["step"] for r in read_metrics(run / "completions.jsonl")]
    n = steps.count(1)
    assert n > 0 and steps == [1] * n + [2] * n + [3] * n
    assert "lost" not in (run / "completions.jsonl").read_text()


def test_a_column_named_as_what_trl_passes_gives_way_to_trls_value(files):
    (files / "state.jsonl").write_text("".join(json.dumps({"prompt": p, "trainer_state": "a column"}) + "\n"
                                               for p in PROMPTS))
    (files / "state.py").write_text("def steps(prompts, completions, trainer_state, **kwargs):\n"
                                    "    return [float(trainer_state.global_step)] * len(completions)\n")
    t = task(files, path=str(files / "state.jsonl"), reward=f"{files / 'state.py'}:steps")
    assert checked(t)([PROMPTS[0]], ["a"]).scores.tolist() == [0.0]


ASYNC = """
import asyncio

first_done = None

async def waits_for_the_other(prompts, completions, **kwargs):
    await asyncio.wait_for(first_done.wait(), timeout=5)
    return [1.0] * len(completions)

async def sets_it(prompts, completions, **kwargs):
    first_done.set()
    return [2.0] * len(completions)

def plain(prompts, completions, **kwargs):
    global first_done
    first_done = asyncio.Event()
    return [4.0] * len(completions)
"""


def test_async_rewards_run_together_as_trl_runs_them_also_inside_a_running_event_loop(files):
    import asyncio

    (files / "async_rewards.py").write_text(ASYNC)
    # the first async reward waits for the second: it ends only when both run at once (sequentially: a timeout)
    t = task(files, reward=[f"{files / 'async_rewards.py'}:{name}" for name in
                            ("plain", "waits_for_the_other", "sets_it")])
    assert checked(t)([PROMPTS[0]] * 2, ["a", "b"]).scores.tolist() == [7.0, 7.0]

    async def in_a_notebook():  # asyncio.run is refused inside a running loop
        return checked(t)([PROMPTS[0]], ["a"]).scores.tolist()

    assert asyncio.run(in_a_notebook()) == [7.0]


BAD_LOGS = """
def not_a_number(prompts, completions, log_metric, **kwargs):
    log_metric("x", "high")
    return [0.0] * len(completions)

def short_column(prompts, completions, log_extra, **kwargs):
    log_extra("x", [1])
    return [0.0] * len(completions)

def taken_column(prompts, completions, log_extra, **kwargs):
    log_extra("prompt", list(completions))
    return [0.0] * len(completions)

def taken_metric(prompts, completions, log_metric, **kwargs):
    log_metric("entropy", 1.0)  # a statistic of the update, added to the record after the reward's
    return [0.0] * len(completions)
"""


@pytest.mark.parametrize("name, pattern", [
    ("not_a_number", r"^log_metric\('x', \.\.\.\): expected a number, got 'high'$"),
    ("short_column", r"^log_extra\('x', \.\.\.\): expected one value per completion \(2\), got 1$"),
    ("taken_column", r"^log_extra\('prompt', \.\.\.\): a column of the completions log already"),
])
def test_what_a_reward_logs_badly_is_one_line(files, name, pattern):
    (files / "bad_logs.py").write_text(BAD_LOGS)
    with pytest.raises(RewardError, match=pattern):
        checked(task(files, reward=f"{files / 'bad_logs.py'}:{name}"))([PROMPTS[0]] * 2, ["a", "b"])


def test_a_logged_metric_never_overwrites_the_trainers_own(files):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    (files / "bad_logs.py").write_text(BAD_LOGS)
    reward = f"{files / 'bad_logs.py'}:taken_metric"
    config = tiny_config("task.name=prompts", "steps=1",
                         f"task.options={{path: {files / 'prompts.jsonl'}, reward: {reward}}}")
    with pytest.raises(RewardError, match=r"^log_metric\('entropy', \.\.\.\): 'entropy' is a metric the trainer logs"):
        RLTrainer(config, files / "run").train()


def test_each_reward_has_a_short_name_for_the_logs(files):
    from elastic_reset.tasks.prompts import _short_names

    assert _short_names(["a/b/rewards.py:letter", "my_mod:letter", "runs/rm/", "org/model", "x.py:other"]) == \
        ["letter_1", "letter_2", "rm", "model", "other"]


def test_a_rewards_logged_mean_is_over_the_samples_it_scored():
    from elastic_reset.rl.reward import component_means

    # TRL's None ("not mine") and a non-finite value are left out; a reward that scored nothing is not logged
    assert component_means([{"a": [1.0, None], "b": [None, None]}, {"a": [3.0, math.nan], "b": [None]}]) == {"a": 2.0}


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("options, error, pattern", [
    ({"column": "question"}, ConfigError, r"^task\.options\.column: .*prompts\.jsonl has no column 'question' "
                                          r"\(columns: prompt, letter\)$"),
    ({"path": "EMPTY"}, DataFileError, r"empty\.jsonl: no rows$"),
    ({"path": "missing.jsonl"}, ConfigError, r"^task\.options\.path: no such file or folder .*missing\.jsonl"),
    ({"reward": "no_such_module_here:f"}, ConfigError, r"^task\.options\.reward: no module named 'no_such_module_h"),
    ({"reward": "REWARDS:NOT_CALLABLE"}, ConfigError, r"^task\.options\.reward: .* is a int, not a callable$"),
    ({"reward": "REWARDS:nothing"}, ConfigError, r"^task\.options\.reward: .* has no attribute 'nothing'"),
    ({"reward": "letter_reward"}, ConfigError, r"^task\.options\.reward: expected module:name"),
    ({"reward": "REWARDS:positional_only"}, ConfigError, r"^task\.options\.reward: .* cannot be called as TRL"),
    ({"reward_weights": [1.0, 2.0]}, ConfigError, r"^task\.options\.reward_weights: expected 1 finite"),
    ({"chat_template_kwargs": ["enable_thinking"]}, ConfigError, r"^task\.options\.chat_template_kwargs: expected "
                                                                 r"a mapping of template variables"),
    ({"reward": None}, ConfigError, r"^task\.options\.reward: the prompts task needs a reward"),
])
def test_bad_input_is_one_line_naming_the_field_or_file(files, options, error, pattern):
    (files / "empty.jsonl").write_text("\n")
    options = {k: (str(files / "empty.jsonl") if v == "EMPTY" else str(files / v) if k == "path" else
                   v.replace("REWARDS", str(files / "rewards.py")) if isinstance(v, str) else v)
               for k, v in options.items()}
    with pytest.raises(error, match=pattern) as info:
        task(files, **options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, pattern", [
    ("short", r"short returned 1 values for 2 completions$"),
    ("strings", r"strings did not return numbers: could not convert"),
])
def test_a_reward_returning_the_wrong_thing_is_one_line(files, name, pattern):
    t = task(files, reward=f"{files / 'rewards.py'}:{name}")
    with pytest.raises(RewardError, match=pattern) as info:
        checked(t)([PROMPTS[0], PROMPTS[1]], ["a", "b"])
    assert str(info.value).startswith("task.options.reward: ") and "\n" not in str(info.value)


def test_a_prompt_that_is_not_text_names_the_file_and_row(files):
    (files / "bad.jsonl").write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": 3}) + "\n")
    with pytest.raises(DataFileError, match=r"bad\.jsonl row 2: column 'prompt' is int$"):
        task(files, path=str(files / "bad.jsonl"))


# ------------------------------------------------------------------------------------------------ factories
def test_a_task_factory_named_by_import_path(files):
    (files / "my_tasks.py").write_text(
        "from elastic_reset.tasks import Task\n\n"
        "def make_task(data_dir=None, letter='e'):\n"
        "    return Task(name='mine', train_prompts=['a', 'b'], eval_prompts=['c'], reference_texts=['d'],\n"
        "                reward_fn=lambda prompts, completions: [float(letter in c) for c in completions])\n\n"
        "def not_a_task(data_dir=None):\n"
        "    return 42\n")
    t = get_task(f"{files / 'my_tasks.py'}:make_task", letter="z")
    assert t.name == "mine" and t.reward_fn(["a"], ["zz"]) == [1.0]
    with pytest.raises(ConfigError, match=r"^task\.options: .*unexpected keyword argument 'colour'"):
        get_task(f"{files / 'my_tasks.py'}:make_task", colour="red")
    with pytest.raises(ConfigError, match=r"^task\.name: .* returned a int, not an elastic_reset\.tasks\.Task$"):
        get_task(f"{files / 'my_tasks.py'}:not_a_task")
    with pytest.raises(ConfigError, match=r"^task\.name: no such file"):
        get_task(f"{files / 'nope.py'}:make_task")
    with pytest.raises(ConfigError, match=r"^task\.name: unknown task 'nope'"):
        get_task("nope")


# ------------------------------------------------------------------------------------------------ chat
def test_the_chat_template_is_applied_once_the_tokenizer_is_known(files):
    from elastic_reset.models import byte_tokenizer

    tok = byte_tokenizer()
    t = task(files)
    t.bind_tokenizer(tok)  # no template: prompts unchanged
    assert t.train_prompts == t._raw["train_prompts"] and set(t.train_prompts) <= set(PROMPTS)
    with pytest.raises(ConfigError, match=r"^task\.options\.chat_template: true, but"):
        task(files, chat_template=True).bind_tokenizer(tok)
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    t.bind_tokenizer(tok)
    first = PROMPTS.index(t._raw["train_prompts"][0])
    assert t.train_prompts[0] == f"<user>{PROMPTS[first]}<assistant>"
    # The reward sees the prompt as written, with its row's columns.
    assert t.reward_fn([t.train_prompts[0]], [LETTERS[first] * 2]) == [1.0]
    off = task(files, chat_template=False)
    off.bind_tokenizer(tok)
    assert off.train_prompts == off._raw["train_prompts"] and set(off.train_prompts) <= set(PROMPTS)


def test_the_trainer_binds_the_tokenizer_so_the_template_choice_is_applied(files):
    # The tiny model's tokenizer has no chat template: asking for one must stop the run's set-up, naming the option.
    from elastic_reset.rl.config import config_from_dict
    from elastic_reset.rl.trainer import RLTrainer

    config = config_from_dict({}, ["model.name=tiny-llama", "model.autocast=none", "algo.prompts_per_step=2",
                                   "algo.minibatch_size=2", "task.name=prompts",
                                   f"task.options={{path: {files / 'prompts.jsonl'}, reward: '{files / 'rewards.py'}"
                                   ":letter_reward', chat_template: true}"])
    with pytest.raises(ConfigError, match=r"^task\.options\.chat_template: true, but"):
        RLTrainer(config, files / "run")


TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT_REWARD = """
def shape(prompts, completions, letter, **kwargs):
    # 100 x messages in the prompt + 10 x completion turns + letters in the assistant's content
    return [100 * len(p) + 10 * len(c) + c[0]["content"].count(x) if c[0]["role"] == "assistant" else -1.0
            for p, c, x in zip(prompts, completions, letter)]
"""


def byte_tokenizer_with(template):
    from elastic_reset.models import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


def chat_rows(n=6):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question {i}?"}],
             "letter": "e"} for i in range(n)]
    rows.append({"prompt": [{"role": "user", "content": "Go on:"}, {"role": "assistant", "content": "Sure,"}],
                 "letter": "e"})
    return rows


def chat_task(files, rows, **options):
    (files / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (files / "chat_reward.py").write_text(CHAT_REWARD)
    options.setdefault("reward", f"{files / 'chat_reward.py'}:shape")
    return task(files, path=str(files / "chat.jsonl"), **options)


def test_conversational_prompts_are_rendered_by_the_template_and_reach_the_reward_as_trl_passes_them(files):
    from elastic_reset.models import byte_tokenizer

    t = chat_task(files, chat_rows(), eval_fraction=0.3)
    tok = byte_tokenizer()
    tok.chat_template = TEMPLATE
    t.bind_tokenizer(tok)
    shown = t.train_prompts + t.eval_prompts
    assert sorted(shown) == sorted([f"<system>Be brief.<user>Question {i}?<assistant>" for i in range(6)]
                                   + ["<user>Go on:<assistant>Sure,"])  # a final assistant turn is continued
    assert len(t.eval_prompts) == 2
    asked = ["<system>Be brief.<user>Question 3?<assistant>", "<user>Go on:<assistant>Sure,"]
    assert t.reward_fn(asked, ["eee", "e"]) == [213.0, 211.0]
    (files / "greedy.py").write_text("def pops(prompts, completions, **kwargs):\n"
                                     "    return [float(len(p.pop()['content'])) for p in prompts]\n")
    popping = chat_task(files, chat_rows(), reward=f"{files / 'greedy.py'}:pops")
    popping.bind_tokenizer(tok)
    assert popping.reward_fn(asked, ["x", "y"]) == popping.reward_fn(asked, ["x", "y"]) == [11.0, 5.0]
    t.bind_tokenizer(tok)  # idempotent
    assert sorted(t.train_prompts + t.eval_prompts) == sorted(shown)


def test_a_template_that_writes_the_bos_token_leaves_one_when_the_tokenizer_adds_it_too(files):
    from tokenizers.processors import TemplateProcessing

    tok = byte_tokenizer_with("{{ bos_token }}" + TEMPLATE)
    t = chat_task(files, chat_rows())
    t.bind_tokenizer(tok)  # this tokenizer adds no BOS: the template's stays
    assert all(p.startswith("<s><") for p in t.train_prompts)
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    t.bind_tokenizer(tok)  # one that adds it (Llama's): one BOS, as the policy encodes the prompt
    ids = tok(t.train_prompts).input_ids
    assert all(row[0] == tok.bos_token_id != row[1] for row in ids)


@pytest.mark.parametrize("template, options, pattern", [
    (None, {}, r"chat messages, which need .* a chat template, and it has none$"),
    (TEMPLATE, {"chat_template": False}, r"chat messages, .* and it is switched off \(false\)$"),
])
def test_conversational_prompts_without_a_chat_template_are_refused(files, template, options, pattern):
    from elastic_reset.models import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = template
    with pytest.raises(ConfigError, match=r"^task\.options\.chat_template: the prompts are " + pattern):
        chat_task(files, chat_rows(), **options).bind_tokenizer(tok)


@pytest.mark.parametrize("bad, pattern", [
    ({"prompt": [{"role": "user"}]}, r"row 8: column 'prompt': message 1 is not \{\"role\": str, \"content\""),
    ({"prompt": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
     r"row 8: column 'prompt': the last message's role must be user, tool or assistant, got 'system'$"),
    ({"prompt": []}, r"row 8: column 'prompt': the last message's role .* got none \(an empty list\)$"),
    ({"prompt": "plain text"}, r"row 8: column 'prompt' is text, but row 1's is not: one format for every prompt$"),
])
def test_a_malformed_or_mixed_conversation_names_the_row(files, bad, pattern):
    with pytest.raises(DataFileError, match=r"chat\.jsonl " + pattern):
        chat_task(files, chat_rows() + [{**bad, "letter": "e"}])


def test_chat_messages_are_read_for_prompts_only_and_in_one_format_with_the_held_out_ones(files):
    (files / "ref.jsonl").write_text(json.dumps({"text": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(DataFileError, match=r"ref\.jsonl row 1: column 'text' is a list \(chat messages are read "
                                            r"for the prompts only\)$"):
        chat_task(files, chat_rows(), reference=str(files / "ref.jsonl"))
    with pytest.raises(ConfigError, match=r"^task\.options\.eval_path: its prompts are text, the training prompts "
                                          r"chat messages: one format for both$"):
        chat_task(files, chat_rows(), eval_path=str(files / "prompts.jsonl"))


def test_a_run_on_a_conversational_datasets_dataset_with_a_chat_model(files):
    from datasets import Dataset

    from elastic_reset.models import byte_tokenizer, tiny_causal_lm
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    model = files / "chat-model"
    tok = byte_tokenizer()
    tok.chat_template = TEMPLATE
    tiny_causal_lm(seed=0).save_pretrained(model)
    tok.save_pretrained(model)
    Dataset.from_list(chat_rows(8)).save_to_disk(str(files / "chat-data"))
    (files / "chat_reward.py").write_text(CHAT_REWARD)
    config = tiny_config(f"model.name={model}", "task.name=prompts", "eval.every=2", "eval.num_prompts=2",
                         "steps=2", f"task.options={{dataset: {files / 'chat-data'}, reward: "
                         f"'{files / 'chat_reward.py'}:shape', eval_fraction: 0.25}}")
    trainer = RLTrainer(config, files / "run")
    assert all(p.startswith(("<system>Be brief.<user>Question ", "<user>Go on:<assistant>Sure,"))
               for p in trainer.task.train_prompts + trainer.task.eval_prompts)  # what the policy is prompted with
    records = trainer.train()
    train = [r for r in records if "reward" in r]
    # 200 or 210 (two messages, one assistant turn) plus the letters: the reward got TRL's conversational call
    assert len(train) == 2 and all(210 <= r["reward"] < 300 for r in train)
    assert any("eval/reward" in r for r in records)


# ------------------------------------------------------------------------------------------------ end to end
def _readme_example() -> tuple[str, str, list[list[str]], str, str]:
    """The JSONL, the reward, the commands (train, export) and the reload code of the README's "Your own task", and
    the same run from Python (docs/tasks.md, "From Python")."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own task\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(json|python|bash)\n(.*?)```", section, flags=re.S):
        blocks.setdefault(lang, []).append(body)
    commands = [shlex.split(line, comments=True) for line in blocks["bash"][0].replace("\\\n", " ").splitlines()]
    tasks = (ROOT / "docs" / "tasks.md").read_text().split("### From Python\n", 1)[1].split("\n#", 1)[0]
    script = re.findall(r"```python\n(.*?)```", tasks, flags=re.S)[0]
    return blocks["json"][0], blocks["python"][0], commands, blocks["python"][1], script


def test_the_readme_example_trains_exports_and_reloads_end_to_end(tmp_path, monkeypatch):
    jsonl, python, (train, export), reload, _ = _readme_example()
    (tmp_path / "prompts.jsonl").write_text(jsonl)
    (tmp_path / "my_reward.py").write_text(python)
    monkeypatch.chdir(tmp_path)
    assert train[:3] == ["elastic-reset", "train", "configs/tiny.yaml"]
    assert main(["train", str(TINY), *train[3:]]) in (0, None)
    records = read_metrics(tmp_path / "runs" / "mine" / "metrics.jsonl")
    rewards = [r["reward"] for r in records if "reward" in r]
    assert len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
    assert any("eval/kl_init" in r for r in records)
    assert json.loads((tmp_path / "runs" / "mine" / "task.json").read_text())["name"] == "prompts"
    assert export[:2] == ["elastic-reset", "export"] and main(export[1:]) == 0
    scope: dict = {}
    exec(reload, scope)  # the README's own reload code, on the folder the README's export wrote
    ids = scope["tokenizer"]("Write a line about the sea:", return_tensors="pt").input_ids
    assert torch.isfinite(scope["model"](input_ids=ids).logits).all()


def test_the_readme_example_from_python_with_a_datasets_dataset_and_a_reward_function(tmp_path, monkeypatch):
    jsonl, python, _, _, script = _readme_example()
    (tmp_path / "prompts.jsonl").write_text(jsonl)
    (tmp_path / "my_reward.py").write_text(python)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_reward", raising=False)
    assert '"configs/tiny.yaml"' in script
    scope: dict = {}
    exec(script.replace('"configs/tiny.yaml"', repr(str(TINY))), scope)
    rewards = [r["reward"] for r in scope["records"] if "reward" in r]
    assert len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
    assert (tmp_path / "runs" / "mine-py" / "final" / "config.json").is_file()
    assert json.loads((tmp_path / "runs" / "mine-py" / "task.json").read_text())["name"] == "prompts"


@pytest.mark.parametrize("options, pattern", [
    ({"dataset": 42}, r"^task\.options\.dataset: expected a dataset, a dict of them by split or a list of row "
                      r"dicts, got int$"),
    ({"dataset": ["a prompt"]}, r"^task\.options\.dataset: expected rows that are dicts \(column: value\), got "
                                r"str$"),
    ({"dataset": {"train": []}, "split": "test"}, r"^task\.options\.dataset: .* has no split 'test' \(splits: "
                                                  r"train\)$"),
    ({"reward": 3}, r"^task\.options\.reward: expected module:function \(from Python, a function too\)"),
])
def test_python_objects_that_are_not_a_dataset_or_a_reward_are_one_line(files, options, pattern):
    options = {"path": None, "dataset": [{"prompt": p} for p in PROMPTS], **options}
    with pytest.raises(ConfigError, match=pattern):
        task(files, **options)


def test_a_datasetdict_from_python_by_split_with_a_reward_function(files):
    from datasets import Dataset, DatasetDict

    rows = {"prompt": PROMPTS, "letter": LETTERS}
    data = DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict({k: v[:2] for k, v in
                                                                                     rows.items()})})
    seen = []

    def reward(prompts, completions, letter, **kwargs):
        seen.append(list(letter))
        return [1.0] * len(completions)

    t = get_task("prompts", dataset=data, eval_split="test", reward=reward)
    assert t.train_prompts == PROMPTS and t.eval_prompts == PROMPTS[:2]
    assert t.reward_fn([PROMPTS[3]], ["x"]) == [1.0] and seen == [[LETTERS[3]]]
    listed = get_task("prompts", dataset=[{"prompt": p, "letter": x} for p, x in zip(PROMPTS, LETTERS)],
                      reward=reward, seed=0)
    assert listed.train_prompts == task(files).train_prompts  # a list of rows reads as the same file does


def test_the_readme_grpo_table_names_real_settings_on_both_sides():
    from elastic_reset.rl.config import describe_fields

    readme = (ROOT / "docs" / "trl.md").read_text()  # the README's "Coming from TRL", moved to docs/trl.md
    section = readme.split("## `GRPOConfig` settings", 1)[1].split("\n\n", 1)[1].split("\n\n")[0].strip()
    rows = [[re.findall(r"`([^`]+)`", cell) for cell in line.strip("|").split("|")[:2]]
            for line in section.splitlines()[2:]]
    from elastic_reset.tasks.prompts import prompts_task

    ours = {name for name, *_ in describe_fields()} | {f"task.options.{name}" for name in
                                                       inspect.signature(prompts_task).parameters}
    theirs = [n.split("=")[0] for trl, _ in rows for n in trl]
    named = [n for _, here in rows for n in here]
    assert len(rows) == 27 and len(theirs) >= 43
    assert not [n for n in named if n not in ours], "README names settings the config does not have"
    trl = pytest.importorskip("trl")
    import dataclasses
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)} | {"peft_config"}
    assert not [n for n in theirs if n not in fields], "README names GRPOConfig fields TRL does not have"


def test_the_readme_dapo_recipe_is_a_valid_config():
    import yaml

    from elastic_reset.rl.config import config_from_dict

    readme = (ROOT / "docs" / "trl.md").read_text()  # the GRPO family's recipes
    block = readme.split("```yaml\n# DAPO", 1)[1].split("```", 1)[0]
    config = config_from_dict(yaml.safe_load("# DAPO" + block), ["model.name=tiny-llama"])
    a = config.algo
    assert (a.ratio, a.clip_range_high, a.loss_aggregation, a.mask_truncated_completions, a.epochs) == \
        ("token", 0.28, "batch_token", True, 1)
    assert (a.baseline, a.scale_rewards, a.whiten_advantages) == ("group_mean", "group", False)  # GRPO's
    assert config.kl.coef == 0.0


def test_the_cli_flags_stand_for_the_prompts_task_and_the_model(files, capsys):
    args = ["train", str(TINY), "--out", str(files / "run"), "--prompts", str(files / "prompts.jsonl"),
            "--reward", f"{files / 'rewards.py'}:letter_reward", "--reward", f"{files / 'rewards.py'}:maybe",
            "--set", "steps=1", "--set", "task.options.eval_fraction=0.3"]
    assert main(args) == 0
    saved = (files / "run" / "config.yaml").read_text()
    assert "name: prompts" in saved and "eval_fraction: 0.3" in saved and ":maybe" in saved
    train = [r for r in read_metrics(files / "run" / "metrics.jsonl") if "reward" in r]
    assert len(train) == 1 and {"rewards/letter_reward", "rewards/maybe"} <= set(train[0])
    assert main(["train", str(TINY), "--out", str(files / "run2"), "--model", str(files / "no-model"),
                 "--prompts", str(files / "prompts.jsonl"), "--reward", f"{files / 'rewards.py'}:maybe"]) == 2
    assert "no-model" in capsys.readouterr().err
    assert main(["train", str(TINY), "--out", str(files / "run2"), "--prompts", "typo.jsonl", "--reward", "m:f"]) == 2
    assert "task.options.path: no such file or folder 'typo.jsonl'" in capsys.readouterr().err  # not a Hub name
    assert not (files / "run2" / "config.yaml").exists()
    # compare: the grid's command, rerun to continue it, says them as --set
    assert main(["compare", str(TINY), "--out", str(files / "grid"), "--methods", "none", "--seeds", "1",
                 "--prompts", str(files / "prompts.jsonl"), "--reward", f"{files / 'rewards.py'}:maybe",
                 "--set", "steps=1"]) == 0
    argv = json.loads((files / "grid" / "summary.json").read_text())["argv"]
    assert "task.name=prompts" in argv and "--prompts" not in argv and argv[-1] == "steps=1"


def test_a_prompt_longer_than_the_cut_is_warned_about_or_kept_whole(files, tmp_path):
    import warnings

    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.trainer import RLTrainer

    long = "A long prompt, " * 8  # 120 bytes: 120 tokens of the byte-level model
    rows = [{"prompt": long, "letter": "e"}] + [{"prompt": p, "letter": x} for p, x in zip(PROMPTS, LETTERS)]
    (files / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def trainer(*overrides):
        t = task(files, path=str(files / "long.jsonl"), eval_path=str(files / "prompts.jsonl"))
        return RLTrainer(load_config(TINY, ["task.name=prompts", *overrides]), tmp_path / str(len(overrides)), task=t)
    with pytest.warns(UserWarning, match=r"^model\.max_prompt_tokens: 1 of the task's 21 prompts are longer than 48 "
                                         r"tokens \(the longest: 120\) and are cut to their last 48; set it to 120"):
        assert trainer().policy.encode([long])[0].shape[1] == 48
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer("model.max_prompt_tokens=null").policy.encode([long])[0].shape[1] == 120
    with pytest.raises(ConfigError, match=r"^model\.max_prompt_tokens: the longest prompt \(120 tokens\) \+ "
                                          r"sampling\.max_new_tokens = 1120 exceeds the model's context length"):
        trainer("model.max_prompt_tokens=null", "sampling.max_new_tokens=1000")


def test_a_trl_reward_by_its_trl_name_is_trls_function():
    from trl.rewards import think_format_reward

    from elastic_reset.tasks.prompts import reward_function

    assert reward_function("think_format_reward") == ("think_format_reward", think_format_reward)


def test_trls_soft_overlong_punishment_by_name_is_the_one_trls_scripts_build():
    from trl.rewards import get_soft_overlong_punishment

    from elastic_reset.tasks.prompts import reward_function

    name, fn = reward_function("get_soft_overlong_punishment")
    scripts = get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)  # trl/scripts/grpo.py
    ids = [[1] * 1000, [1] * 1100, [1] * 1300]  # under 1280 - 256, inside the cache, over the maximum
    assert name == "soft_overlong_punishment_reward"  # TRL's metric key
    assert fn(prompts=["p"] * 3, completions=["c"] * 3, completion_ids=ids) == scripts(ids) == [0.0, -0.296875, -1.0]


def test_conversations_mode_renders_prompts_as_trls_trainers_do_text_as_text_chat_through_the_template(files):
    from trl.data_utils import maybe_apply_chat_template

    from elastic_reset.models import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = TEMPLATE
    plain = [{"prompt": f"Question {i}?", "letter": "e"} for i in range(4)]
    shown = {}
    for name, rows, options in (("plain", plain, {"reward": f"{files / 'rewards.py'}:letter_reward"}),
                                ("chat", chat_rows(), {})):
        t = chat_task(files, rows, chat_template="conversations", **options)
        t.bind_tokenizer(tok)
        shown[name] = sorted(t.train_prompts + t.eval_prompts + t.test_prompts)
        assert shown[name] == sorted(maybe_apply_chat_template({"prompt": r["prompt"]}, tok)["prompt"] for r in rows)
    assert shown["plain"] == sorted(r["prompt"] for r in plain)  # text as it is, though the tokenizer has a template
    assert t.rendering.startswith("as TRL's trainers render them (task.options.chat_template: conversations)")
    for setting, has, said in ((None, True, "through the policy's chat template"),
                               (None, False, "as they are, without a chat template (the policy's tokenizer has none)"),
                               (False, True, "as they are, without a chat template (task.options.chat_template: false)")):
        t = chat_task(files, plain, chat_template=setting, reward=f"{files / 'rewards.py'}:letter_reward")
        t.bind_tokenizer(tok if has else byte_tokenizer())
        assert t.rendering.startswith(said), (setting, has, t.rendering)
    assert "<system>Be brief.<user>Question 0?<assistant>" in shown["chat"]
    with pytest.raises(ConfigError, match=r"^task\.options\.chat_template: expected null, true, false or conv"):
        chat_task(files, plain, chat_template="yes", reward=f"{files / 'rewards.py'}:letter_reward")
