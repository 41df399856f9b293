"""The Translation Game attribution study's verdict script, run as a user runs it, on synthetic cells whose answer is
known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "translation_game" / "attribution.py"


def write_cell(results: Path, arm: str, seed: int, task: float, drift: float, length: float = 20.0) -> None:
    """A finished cell whose last validation point is (task, drift, message length)."""
    cell = results / "runs" / arm / f"seed{seed}"
    cell.mkdir(parents=True)
    rows = [{"step": 0, "eval/task_bleu": 18.9, "eval/drift_bleu": 31.5, "eval/response_length": 20.0},
            {"step": 1000, "eval/task_bleu": task, "eval/drift_bleu": drift, "eval/response_length": length}]
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cell / "done").write_text("")


def verdict(results: Path, first: Path) -> str:
    subprocess.run([sys.executable, str(SCRIPT), str(results), str(first)], check=True, capture_output=True)
    return (results / "verdict.md").read_text()


def test_a_drift_advantage_the_kl_alone_gives_is_the_kls_and_a_collapsed_lm_kl_is_untestable(tmp_path):
    new, first = tmp_path / "new", tmp_path / "first"
    for s in range(5):
        write_cell(first, "elastic_reset", s, 18.5 + 0.1 * s, 24.6 + 0.2 * s)
        write_cell(new, "reinforce_kl", s, 18.45 + 0.1 * s, 24.3 + 0.25 * s)  # within 1 BLEU / 0.3 task
        write_cell(new, "er_eta_0.999", s, 18.4 + 0.1 * s, 27.0 + 0.1 * s)  # +2.4 drift, -0.1 task: helps
    for beta in ("0.01", "0.003"):
        write_cell(new, f"kl_lm_{beta}", 0, 9.0, 10.0, length=8.0)  # both collapse
    text = verdict(new, first)
    assert "the drift advantage is: its KL**" in text
    assert "η 0.999: helps**" in text
    assert "untestable: every candidate collapsed**" in text
    assert json.loads((new / "summary.json").read_text())["kl_lm_chosen"] is None


def test_the_reset_wins_when_er_drifts_less_on_every_seed_one_seed_against_makes_no_win_and_a_kept_beta_is_chosen(
        tmp_path):
    new, first = tmp_path / "new", tmp_path / "first"
    er = [(18.5, 25.0), (18.6, 25.2), (18.4, 24.9), (18.5, 25.1), (18.6, 25.0)]
    for s, (task, drift) in enumerate(er):
        write_cell(first, "elastic_reset", s, task, drift)
        write_cell(new, "reinforce_kl", s, task, drift - 2.5 + 0.1 * s)  # ER +2.1..2.5 drift on every seed
        # the KL-to-LM arm drifts 3 less, except one seed where it drifts 6 more: one seed must not make a win
        write_cell(new, "kl_lm_0.003", s, task, drift + (6.0 if s == 4 else -3.0), length=18.0)
    write_cell(new, "kl_lm_0.01", 0, 9.0, 10.0, length=8.0)  # collapsed: the smaller beta is chosen
    text = verdict(new, first)
    assert "the drift advantage is: the reset's**" in text
    assert "η 0.999: pending**" in text  # no er_eta_0.999 cell yet
    assert "(kl_lm_0.003): not separable at this budget**" in text
    subprocess.run([sys.executable, str(SCRIPT), str(new), str(first)], check=True)  # twice: the same file
    assert (new / "verdict.md").read_text() == text
