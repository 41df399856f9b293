"""The Translation Game (paper §4): data split, vocabulary, BLEU, the learning listener, the methods, resume.

Tiny agents (a 300-line vocabulary and one-layer 32-wide models, two epochs) are built once per session from
../shared/data; every test that needs them skips, saying why, where the data is absent.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from elastic_reset.data.translation import game_pairs, load_multi30k, pretrain_part, split_train
from elastic_reset.errors import ConfigError, RunFileError
from elastic_reset.evaluation.runs import load_run
from elastic_reset.io import read_metrics
from elastic_reset.lm.batching import length_grouped_batches
from elastic_reset.pretrain.translation import (AdaptConfig, AgentConfig, adapt_agents, bleu, build_agents,
                                               build_translation_agents, train_tokenizer)
from elastic_reset.rl.config import config_from_dict
from elastic_reset.rl.trainer import RLTrainer
from elastic_reset.tasks import get_task

from conftest import SHARED_DATA
from helpers import sigkill_after_step

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "translation.yaml"
TINY_AGENTS = AgentConfig(vocab_size=300, d_model=32, layers=1, heads=2, ffn=64, max_epochs=2, batch_size=32,
                          warmup=10)


# ------------------------------------------------------------------------------------------------- BLEU
def test_bleu_of_one_sentence_matches_the_hand_computed_value():
    # Clipped n-gram matches 5/6, 3/5, 2/4, 1/3; equal lengths, so no brevity penalty.
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected, abs=1e-9)


def test_bleu_is_a_corpus_score_with_brevity_penalty():
    # Sentence 2 is a perfect but short prefix (4 of 6 words). Corpus counts: 9/10, 6/8, 4/6, 2/4; hypothesis length
    # 10 against reference length 12: brevity penalty exp(1 - 12/10). Not the mean of the two sentence scores.
    expected = 100 * math.exp(1 - 12 / 10) * (9 / 10 * 6 / 8 * 4 / 6 * 2 / 4) ** 0.25
    got = bleu(["the cat sat on the mat", "the cat sat on"], ["the cat sat on a mat", "the cat sat on the mat"])
    assert got == pytest.approx(expected, abs=1e-9)


def test_bleu_extremes_and_mismatched_lengths():
    assert bleu(["a man rides a red bike ."], ["a man rides a red bike ."]) == pytest.approx(100.0)
    assert bleu(["xyz uvw qrs tuv"], ["a man rides a red bike ."]) == 0.0
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        bleu(["a", "b"], ["a"])


# ------------------------------------------------------------------------------------- data and vocabulary
def test_split_is_deterministic_disjoint_and_complete():
    pre, game = split_train(1000)
    assert (pre, game) == split_train(1000)
    assert not set(pre) & set(game) and sorted(pre + game) == list(range(1000))
    assert split_train(1000, seed=1) != (pre, game)
    small, rest = split_train(1000, pretrain_lines=100)
    assert len(small) == 100 and not set(small) & set(rest) and len(rest) == 900
    with pytest.raises(ValueError, match="pretrain_lines"):
        split_train(1000, pretrain_lines=1000)
    none, every = split_train(1000, pretrain_lines=0)  # agents pretrained out of domain: every line is the game's
    assert none == [] and every == list(range(1000))
    with pytest.raises(ValueError, match="pretrain_lines"):
        split_train(1000, pretrain_lines=-1)


def test_out_of_domain_pretraining_text_is_tatoeba_with_its_own_dev_pairs(shared_data):
    from elastic_reset.data.translation import load_pretrain_pairs, pretraining_dev, pretraining_text

    fr_en = load_pretrain_pairs(shared_data, "fr-en")
    assert len(fr_en["fr"]) == len(fr_en["en"]) == 165_479 and all(t == t.lower() for t in fr_en["en"][:200])
    train = load_multi30k(shared_data, "train")
    text = pretraining_text(shared_data, "tatoeba", train, 0)
    assert text["fr-en"] == (fr_en["fr"], fr_en["en"]) and len(text["en-de"][0]) == 168_279
    assert len(text["en"]) == len(set(text["en"])) < 165_479 + 168_279  # English of both directions, each once
    dev = load_pretrain_pairs(shared_data, "fr-en", "dev")
    # early stopping on Tatoeba's dev, not on Multi30k val
    assert pretraining_dev(shared_data, "tatoeba")["fr-en"] == (dev["fr"], dev["en"])
    assert not set(dev["en"][:300]) & set(text["en"])
    shared = pretraining_text(shared_data, "tatoeba", train, 1000)  # a stated Multi30k share
    part = pretrain_part(train, pretrain_lines=1000)
    assert shared["fr-en"][0][-1000:] == part["fr"] and shared["en-de"][1][-1000:] == part["de"]
    in_domain = pretraining_text(shared_data, "multi30k", train)
    assert len(in_domain["fr-en"][0]) == 14_500
    assert pretraining_dev(shared_data, "multi30k")["en"] == load_multi30k(shared_data, "val")["en"]
    with pytest.raises(ValueError, match="pair: expected one of fr-en, en-de"):
        load_pretrain_pairs(shared_data, "de-en")
    with pytest.raises(ValueError, match="corpus"):
        pretraining_text(shared_data, "iwslt", train)


def test_game_half_has_no_english_and_misses_the_pretraining_lines(shared_data):
    train = load_multi30k(shared_data, "train")
    pairs = game_pairs(train)
    assert len(pairs) == 14_500 and all(len(p) == 2 for p in pairs)
    english = set(pretrain_part(train)["en"])
    _, game_idx = split_train(len(train["fr"]))
    assert {train["fr"][i] for i in game_idx[:50]} == {fr for fr, _ in pairs[:50]}
    assert not any(de in english for _, de in pairs)  # the pair carries German, not English
    # Lowercased as the paper preprocesses Multi30k.
    assert all(fr == fr.lower() for fr, _ in pairs[:100])


def test_misaligned_files_are_refused_naming_the_folder(tmp_path):
    import gzip

    folder = tmp_path / "multi30k"
    folder.mkdir()
    for lang, n in (("fr", 3), ("en", 3), ("de", 2)):
        with gzip.open(folder / f"val.{lang}.gz", "wt") as f:
            f.write("\n".join(f"line {i}" for i in range(n)) + "\n")
    with pytest.raises(Exception, match=r"multi30k.*not aligned.*'de': 2"):
        load_multi30k(tmp_path, "val")


def test_length_batches_cover_every_index_once_with_little_padding():
    lengths = [(7 * i) % 31 + 1 for i in range(1000)]
    batches = length_grouped_batches(lengths, 16, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches == length_grouped_batches(lengths, 16, seed=3)
    assert batches != length_grouped_batches(lengths, 16, seed=4)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 3  # a random batch of 16 spans ~28 of the 31 lengths
    # Ungrouped (group=False): the seeded shuffle cut as it is.
    order = list(range(1000))
    random.Random(3).shuffle(order)
    assert length_grouped_batches(lengths, 16, seed=3, group=False) == [order[i:i + 16] for i in range(0, 1000, 16)]


def test_tokenizer_round_trips_text_and_ends_with_eos():
    texts = ["un homme fait du vélo .", "a man rides a bike .", "ein mann fährt fahrrad ."] * 20
    tok = train_tokenizer(texts, 120)
    ids = tok("a man rides a bike .")["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "a man rides a bike ."


# -------------------------------------------------------------------------------------------- tiny agents
@pytest.fixture(scope="session")
def agents(tmp_path_factory) -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline datasets not found at {SHARED_DATA} (set ELASTIC_RESET_DATA to the data folder)")
    out = tmp_path_factory.mktemp("agents") / "translation-game"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=lambda _: None)
    torch.set_num_threads(threads)
    return out


def game_config(agents: Path, *overrides: str):
    settings = [f"model.name={agents / 'fr-en'}", f"task.data_dir={SHARED_DATA}", "steps=4", "checkpoint_every=2",
                "eval.every=2", "eval.num_prompts=8", "eval.num_test_prompts=8", "eval.batch_size=8",
                "algo.prompts_per_step=8", "algo.minibatch_size=8", "sampling.max_new_tokens=12", "progress=false",
                "threads=1", "method.reset_every=2", "method.multitask_batch=4"]
    config = config_from_dict(yaml.safe_load(CONFIG.read_text()), [*settings, *overrides])
    config.task.options["agents"] = str(agents)
    return config


def test_build_writes_three_models_with_the_shared_tokenizer(agents):
    assert {p.name for p in agents.iterdir()} == {"fr-en", "en-de", "en-lm", "build_metrics.json"}
    vocab = {(agents / name / "tokenizer.json").read_text() for name in ("fr-en", "en-de", "en-lm")}
    assert len(vocab) == 1


class _Interrupted(Exception):
    pass


def _interrupt_at(text: str):
    """A build log that stops the build where a line containing ``text`` would be printed."""
    def log(line: str) -> None:
        if text in line:
            raise _Interrupted(line)
    return log


def test_an_interrupted_build_resumes_to_the_agents_of_an_uninterrupted_one(agents, tmp_path):
    out = tmp_path / "translation-game"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the fixture's build: the same arithmetic
    try:
        # Stopped while printing the LM's 2nd epoch (its perplexity improves every epoch, so the agent kept is the
        # one trained on after the resume): the translators are finished, the LM after epoch 1.
        with pytest.raises(_Interrupted):
            build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=_interrupt_at("en-lm epoch 2"))
        assert not out.exists()
        lines = []
        build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=lines.append, resume=True)
    finally:
        torch.set_num_threads(threads)
    assert "build translation-agents: fr-en resumed after epoch 2 (finished)" in lines
    assert "build translation-agents: en-de resumed after epoch 2 (finished)" in lines
    assert "build translation-agents: en-lm resumed after epoch 1" in lines
    assert not (tmp_path / "translation-game.checkpoints").exists()
    for name in ("fr-en", "en-de", "en-lm"):
        resumed, whole = (load_file(folder / name / "model.safetensors") for folder in (out, agents))
        assert resumed.keys() == whole.keys()
        assert all(torch.equal(resumed[k], whole[k]) for k in whole), name
    built = [json.loads((folder / "build_metrics.json").read_text()) for folder in (out, agents)]
    assert built[0]["pretrained"] == built[1]["pretrained"]


def test_agents_trained_side_by_side_are_those_trained_in_turn(agents, tmp_path):
    out, lines = tmp_path / "translation-game", []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the fixture's build; each of the three processes gets one thread too
    try:
        metrics = build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=lines.append, jobs=3)
    finally:
        torch.set_num_threads(threads)
    # The processes trained them: this one only read their finished checkpoints.
    for name in ("fr-en", "en-de", "en-lm"):
        assert f"build translation-agents: {name} resumed after epoch 2 (finished)" in lines
        side, turn = (load_file(folder / name / "model.safetensors") for folder in (out, agents))
        assert side.keys() == turn.keys()
        assert all(torch.equal(side[k], turn[k]) for k in turn), name
    assert metrics["jobs"] == 3
    assert metrics["pretrained"] == json.loads((agents / "build_metrics.json").read_text())["pretrained"]


def test_a_build_left_unfinished_is_continued_only_with_resume_and_its_own_settings(tmp_path):
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline datasets not found at {SHARED_DATA} (set ELASTIC_RESET_DATA to the data folder)")
    out = tmp_path / "translation-game"
    with pytest.raises(_Interrupted):
        build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=_interrupt_at("joint vocabulary"))
    with pytest.raises(FileExistsError, match="--resume"):
        build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=lambda _: None)
    with pytest.raises(ConfigError, match="^max_epochs: .* started with 2, not 3"):
        build_agents(SHARED_DATA, out, replace(TINY_AGENTS, max_epochs=3), limit=300, log=lambda _: None,
                     resume=True)
    with pytest.raises(ConfigError, match="^limit: "):
        build_agents(SHARED_DATA, out, TINY_AGENTS, limit=200, log=lambda _: None, resume=True)
    (tmp_path / "translation-game.checkpoints" / "fr-en.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunFileError, match="fr-en.pt: not a checkpoint this build wrote"):
        build_agents(SHARED_DATA, out, TINY_AGENTS, limit=300, log=lambda _: None, resume=True)


def _speaker_nll(folder: Path, pairs: list[tuple[str, str]]) -> float:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from elastic_reset.lm.scoring import token_nll

    model = AutoModelForSeq2SeqLM.from_pretrained(folder / "fr-en").eval()
    with torch.no_grad():
        nll, mask = token_nll(model, AutoTokenizer.from_pretrained(folder / "fr-en"), pairs, max_tokens=64)
    return float(nll.sum() / mask.sum())


def test_adapting_agents_on_a_share_of_multi30k_fits_the_share_and_moves_the_game_off_it(agents, tmp_path):
    out = tmp_path / "adapted"
    before = (agents / "build_metrics.json").read_text()
    metrics = adapt_agents(SHARED_DATA, agents, out, AdaptConfig(lines=256, epochs=2), limit=64, log=lambda _: None)
    assert (agents / "build_metrics.json").read_text() == before  # the source is left as it was
    assert metrics["split"]["pretrain_lines"] == 256
    assert metrics["adapted"]["pretrained_before"] == json.loads(before)["pretrained"]
    train = load_multi30k(SHARED_DATA, "train")
    share = pretrain_part(train, pretrain_lines=256)
    pairs = list(zip(share["fr"], share["en"]))
    assert _speaker_nll(out, pairs) < _speaker_nll(agents, pairs) - 0.1
    task = get_task("translation_game", str(SHARED_DATA), agents=str(out))
    assert set(task.train_prompts) == {fr for fr, _ in game_pairs(train, pretrain_lines=256)}
    assert len(task.pretrain_texts) == 165_479 + 256  # S2P rehearses what the agents learned from: Tatoeba, the share
    with pytest.raises(ConfigError, match="^--adapt: .* expected a build on tatoeba alone"):
        adapt_agents(SHARED_DATA, out, tmp_path / "twice", AdaptConfig(lines=256), log=lambda _: None)


def test_adapt_options_are_checked_before_anything_trains(agents, tmp_path):
    with pytest.raises(ConfigError, match="^--out: .* is the folder being adapted"):
        build_translation_agents(SHARED_DATA, agents, pretrain_lines=256, adapt=agents, force=True)
    with pytest.raises(ConfigError, match="^--pretrain-lines: --adapt needs"):
        build_translation_agents(SHARED_DATA, tmp_path / "a", adapt=agents)
    with pytest.raises(ConfigError, match="^--adapt: takes"):
        build_translation_agents(SHARED_DATA, tmp_path / "a", pretrain_lines=256, adapt=agents, resume=True)
    with pytest.raises(ConfigError, match="^--adapt: takes"):
        build_translation_agents(SHARED_DATA, tmp_path / "a", pretrain_lines=256, adapt=agents, jobs=2)
    with pytest.raises(ConfigError, match="^--jobs: expected"):
        build_agents(SHARED_DATA, tmp_path / "b", TINY_AGENTS, limit=300, log=lambda _: None, jobs=0)


def test_task_plays_on_the_lines_the_agents_were_not_pretrained_on(agents, tmp_path):
    import json
    import shutil

    train = load_multi30k(SHARED_DATA, "train")
    everything = get_task("translation_game", str(SHARED_DATA), agents=str(agents))  # pretrained on Tatoeba
    assert set(everything.train_prompts) == set(train["fr"])  # the whole of Multi30k train is the game's
    assert len(everything.pretrain_texts) == 165_479 and everything.pretrain_texts[0][0] != train["fr"][0]
    other = tmp_path / "agents"
    shutil.copytree(agents, other)
    metrics = json.loads((other / "build_metrics.json").read_text())
    metrics["split"]["pretrain_lines"] = 4000
    metrics["corpus"] = "multi30k"
    (other / "build_metrics.json").write_text(json.dumps(metrics))
    task = get_task("translation_game", str(SHARED_DATA), agents=str(other))
    assert set(task.train_prompts) == {fr for fr, _ in game_pairs(train, pretrain_lines=4000)}
    assert len(task.pretrain_texts) == 4000
    del metrics["corpus"], metrics["split"]["pretrain_lines"]  # an older build: the in-domain half
    (other / "build_metrics.json").write_text(json.dumps(metrics))
    assert len(get_task("translation_game", str(SHARED_DATA), agents=str(other)).train_prompts) == 14_490
    # Disjoint lines; a French sentence can still occur on a line of each part (Multi30k repeats a few).
    assert len(set(task.train_prompts) & {fr for fr, _ in task.pretrain_texts}) < 20


def test_task_metrics_report_each_bleu_with_its_length_ratio(agents):
    val = load_multi30k(SHARED_DATA, "val")
    task = get_task("translation_game", str(SHARED_DATA), agents=str(agents))
    prompts, english = val["fr"][:20], val["en"][:20]
    exact = task.metrics_fn(prompts, english)
    assert exact["drift_bleu"] == pytest.approx(100.0) and exact["drift_length_ratio"] == pytest.approx(1.0)
    doubled = task.metrics_fn(prompts, [f"{e} {e}" for e in english])  # a longer message: no brevity penalty
    assert doubled["drift_length_ratio"] == pytest.approx(2.0, rel=0.01) and doubled["task_length_ratio"] > 0


def test_listener_update_lowers_its_loss_on_the_batch(agents):
    task = get_task("translation_game", str(SHARED_DATA), agents=str(agents), listener_lr=3e-3)
    prompts = task.train_prompts[:8]
    messages = ["a man is riding a bike .", "two dogs play in the snow ."] * 4
    before = -sum(task.reward_fn(prompts, messages)) / 8
    for _ in range(5):
        task.reward_fn.learn(prompts, messages)
    after = -sum(task.reward_fn(prompts, messages)) / 8
    assert after < before - 0.1


def test_frozen_speaker_never_changes_while_the_listener_learns(agents, tmp_path):
    trainer = RLTrainer(game_config(agents, "method.name=frozen"), tmp_path / "run")
    speaker = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    listener = {n: p.detach().clone() for n, p in trainer.task.reward_fn.model.named_parameters()}
    records = trainer.train()
    assert all(torch.equal(p, speaker[n]) for n, p in trainer.model.named_parameters())
    assert any(not torch.equal(p, listener[n]) for n, p in trainer.task.reward_fn.model.named_parameters())
    assert all("reward_model/loss" in r for r in records if "reward" in r)


def test_speaker_gradient_is_the_reinforce_gradient_only(agents, tmp_path, monkeypatch):
    # The listener reads text: its loss has no path to the speaker. With the REINFORCE loss switched off (advantages
    # zero and no entropy bonus), an iteration leaves the speaker without any gradient at all.
    trainer = RLTrainer(game_config(agents, "method.name=none", "algo.entropy_coef=0.0", "algo.max_grad_norm=null"),
                        tmp_path / "run")
    monkeypatch.setattr(trainer.estimator, "advantages", lambda scores, keep, mask, *a: (torch.zeros_like(mask), None))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    record = trainer.train_step()
    assert record["grad_norm"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


@pytest.mark.parametrize("method", [
    ["method.name=none"],
    ["method.name=kl"],
    ["method.name=kl", "kl.reference=lm"],
    ["method.name=multitask"],
    ["method.name=reset_to_init", "kl.coef=0.001"],
    ["method.name=reset_to_ema", "kl.coef=0.001"],
    ["method.name=elastic_reset", "kl.coef=0.001"],
])
def test_each_method_plays_a_few_iterations(agents, tmp_path, method):
    records = RLTrainer(game_config(agents, *method), tmp_path / "run").train()
    evals = [r for r in records if "eval/task_bleu" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(0 <= r["eval/drift_bleu"] <= 100 and "eval/perplexity" not in r for r in evals)
    assert [r["step"] for r in records if "test/task_bleu" in r] == [4]
    if "method.name=multitask" in method:
        assert all(r["multitask/nll"] > 0 for r in records if "reward" in r)
    if any("reset" in m for m in method):
        assert [r["step"] for r in records if "reset" in r] == [2, 4]


def test_kl_to_the_english_lm_scores_the_message_alone(agents, tmp_path):
    trainer = RLTrainer(game_config(agents, "method.name=kl", "kl.reference=lm"), tmp_path / "run")
    prompts = trainer.task.train_prompts[:3]
    rollout = trainer.policy.sample(prompts, torch.Generator().manual_seed(0), greedy=trainer.config.eval.greedy)
    got = trainer._reference_logprobs(rollout)
    lm = trainer.reference_lm
    for i in range(3):
        n = int(rollout.response_mask[i].sum())
        ids = torch.cat([torch.tensor([trainer.tokenizer.bos_token_id]), rollout.response_ids[i, :n]])
        logp = torch.log_softmax(lm(input_ids=ids[None]).logits[0, :-1].float(), -1)
        expected = logp.gather(-1, ids[1:, None]).squeeze(-1)
        assert torch.allclose(got[i, :n], expected, atol=1e-5)
        assert torch.all(got[i, n:] == 0)


def test_encoder_decoder_task_with_perplexity_drift_is_refused(agents, tmp_path):
    from elastic_reset.tasks.base import Task

    task = get_task("translation_game", str(SHARED_DATA), agents=str(agents))
    plain = Task(name="t", train_prompts=task.train_prompts, eval_prompts=task.eval_prompts,
                 reward_fn=task.reward_fn, reference_texts=["some text"])
    with pytest.raises(ConfigError, match="perplexity.*encoder-decoder"):
        RLTrainer(game_config(agents), tmp_path / "run", task=plain)
    assert not (tmp_path / "run").exists()


def test_resume_after_sigkill_is_exact_with_the_listener_learning(agents, tmp_path):
    settings = [f"model.name={agents / 'fr-en'}", f"task.data_dir={SHARED_DATA}", "steps=6", "checkpoint_every=2",
                "eval.every=3", "eval.num_prompts=8", "eval.num_test_prompts=8", "eval.batch_size=8",
                "algo.prompts_per_step=8", "algo.minibatch_size=8", "sampling.max_new_tokens=12", "progress=false",
                "threads=1", "method.name=elastic_reset", "kl.coef=0.001", "method.reset_every=3"]
    config = yaml.safe_load(CONFIG.read_text())
    config["task"]["options"]["agents"] = str(agents)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    sets = [a for s in settings for a in ("--set", s)]

    def cli(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "elastic_reset.cli", "train", str(path), "--out", str(out), *sets, *extra]

    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    # The uninterrupted run goes on beside the one that is killed (one thread each, 2 cores).
    with open(tmp_path / "full.log", "w") as log:
        uninterrupted = subprocess.Popen(cli(tmp_path / "full"), stdout=subprocess.DEVNULL, stderr=log, env=env)
    proc = subprocess.Popen(cli(tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    sigkill_after_step(proc, metrics, 3, timeout=300)
    assert uninterrupted.wait() == 0, (tmp_path / "full.log").read_text()
    subprocess.run(cli(tmp_path / "killed", "--resume"), check=True, capture_output=True, env=env)

    def strip(records):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]

    full, resumed = read_metrics(tmp_path / "full" / "metrics.jsonl"), read_metrics(metrics)
    assert strip(resumed) == strip(full)
    losses = [r["reward_model/loss"] for r in full if "reward_model/loss" in r]
    assert len(losses) == 6 and len(set(losses)) == 6  # the listener trained at every iteration
    # A report on the game's runs needs no --score/--drift: the run says its task is scored in BLEU.
    run = load_run(tmp_path / "full")
    assert (run.score, run.drift) == ("task_bleu", "drift_bleu") and run.rewards.size == 3


def test_reinforce_raises_a_reward_through_the_encoder_decoder_speaker(agents, tmp_path, monkeypatch):
    # The game's policy path (encoder once, cached decoder steps, teacher-forced log-probs of the sampled tokens)
    # learns: the tiny FR→EN speaker with the listener swapped for a toy reward (the share of "e" among the
    # message's characters), measured on held-out val prompts. Flipping the policy loss's sign makes it fail.
    from elastic_reset.rewards.listener import ListenerReward

    monkeypatch.setattr(ListenerReward, "__call__",
                        lambda self, prompts, texts: [t.count("e") / max(len(t), 1) for t in texts])
    config = game_config(agents, "method.name=none", "algo.lr=1e-2", "kl.coef=0.0", "task.options.listener_lr=0",
                         "steps=30", "eval.every=30", "checkpoint_every=0")
    trainer = RLTrainer(config, tmp_path / "run")
    listener = {n: p.detach().clone() for n, p in trainer.task.reward_fn.model.named_parameters()}
    records = trainer.train()
    assert all(torch.equal(p, listener[n]) for n, p in trainer.task.reward_fn.model.named_parameters())  # lr 0
    start, end = (next(r["eval/reward"] for r in records if r.get("step") == s and "eval/reward" in r)
                  for s in (0, 30))
    assert end > start + 0.15, f"held-out reward {start:.3f} -> {end:.3f} in 30 iterations"


def test_the_speaker_decodes_through_static_steps_as_through_its_dynamic_cache(agents):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from elastic_reset.rl.sampling import SamplingConfig, sample

    speaker, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(agents / "fr-en").eval(), AutoTokenizer.from_pretrained(
        agents / "fr-en")
    enc = tokenizer(load_multi30k(SHARED_DATA, "val")["fr"][:6], return_tensors="pt", padding=True)
    out = [sample(speaker, enc.input_ids, enc.attention_mask, SamplingConfig(max_new_tokens=16, cuda_graphs=graphs),
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                  generator=torch.Generator().manual_seed(0)) for graphs in (False, True)]
    assert torch.equal(out[0].response_ids, out[1].response_ids)
    torch.testing.assert_close(out[0].logprobs, out[1].logprobs, atol=1e-5, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_the_game_plays_on_cuda_with_the_listener_beside_the_speaker(agents, tmp_path):
    trainer = RLTrainer(game_config(agents, "model.device=cuda", "method.name=elastic_reset", "kl.coef=0.001"),
                        tmp_path / "run")
    records = trainer.train()
    assert next(trainer.model.parameters()).is_cuda and next(trainer.task.reward_fn.model.parameters()).is_cuda
    assert [r["step"] for r in records if "test/task_bleu" in r] == [4]
