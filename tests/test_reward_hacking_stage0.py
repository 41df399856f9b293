"""The reward-hacking study's stage-0 rule (experiments/reward_hacking/stage0.py), run as a user runs it, on
synthetic cells whose answer is known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "reward_hacking" / "stage0.py"


def write_cell(results: Path, name: str, golds: list[float], proxies: list[float]) -> None:
    cell = results / "runs" / name / "seed0"
    cell.mkdir(parents=True)
    rows = [{"step": 5 * i, "eval/gold": g, "eval/reward": p, "eval/proxy_gold_agreement": 0.7}
            for i, (g, p) in enumerate(zip(golds, proxies))]
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cell / "done").write_text("")


RISING = [0.5, 0.6, 0.7, 0.8, 0.9]
HACKED = [0.5, 0.7, 0.9, 0.85, 0.84]  # peaks at 0.9, then falls 0.06
UP = [1.0, 2.0, 3.0, 4.0, 5.0]


def stage0(results: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(SCRIPT), str(results)], capture_output=True, text=True)
    return done.returncode, json.loads((results / "stage0.json").read_text())


def test_the_largest_hacked_rm_is_the_grids_proxy(tmp_path):
    for n in (500, 1000, 2000):
        write_cell(tmp_path, f"rm_{n}", RISING if n == 2000 else HACKED, UP)
        write_cell(tmp_path, f"am_{n}", RISING, UP)
    code, out = stage0(tmp_path)
    assert code == 0 and out["choice"] == 1000
    assert out["cells"]["rm_500"]["hacked"] and not out["cells"]["rm_2000"]["hacked"]
    assert abs(out["cells"]["rm_1000"]["drop"] - 0.06) < 1e-9
    assert (tmp_path / "stage0.png").is_file()


def test_a_fall_short_of_the_drop_or_with_a_falling_proxy_is_not_hacking_and_the_grid_stops(tmp_path):
    for n in (500, 1000, 2000):
        golds = {500: [0.5, 0.7, 0.9, 0.87, 0.86], 1000: HACKED, 2000: RISING}[n]  # 500 falls 0.04 only
        proxies = [1.0, 2.0, 3.0, 2.5, 2.0] if n == 1000 else UP  # 1000's proxy falls with the gold
        write_cell(tmp_path, f"rm_{n}", golds, proxies)
        write_cell(tmp_path, f"am_{n}", HACKED, UP)  # the AM's cells do not choose the grid's proxy
    code, out = stage0(tmp_path)
    assert code == 3 and out["choice"] is None
    assert "no proxy of the ladder is hacked" in (tmp_path / "stage0.md").read_text()


def test_missing_cells_are_pending(tmp_path):
    write_cell(tmp_path, "rm_500", HACKED, UP)
    code, out = stage0(tmp_path)
    assert code == 0 and out["choice"] is None and out["said"] == "pending: rm_1000, rm_2000, am_500, am_1000, am_2000"
