"""`elastic-reset demo` end to end on the tiny local model (the real one loads SmolLM2 and takes minutes)."""

import json

from elastic_reset.demo import run_demo


def test_demo_runs_both_methods_draws_the_frontier_and_marks_resets(tmp_path, capsys):
    results = run_demo(tmp_path, steps=3, model="tiny-llama")
    assert set(results) == {"none", "elastic_reset"}
    assert any("reset" in r for r in results["elastic_reset"]) and not any("reset" in r for r in results["none"])
    out = capsys.readouterr().out
    assert " R" in out and "reward" in out and "Dominance" in out
    assert "wall time, none:" in out and "wall time, elastic_reset:" in out
    for name in ("pareto.png", "pareto_curves.png"):
        assert str((tmp_path / name).resolve()) in out and (tmp_path / name).stat().st_size > 1000
    # Drift is scored on the initial policy's own samples, the same texts for both methods.
    texts = [json.loads((tmp_path / m / "seed0" / "reference_texts.json").read_text()) for m in results]
    assert texts[0] == texts[1] and len(texts[0]) == 24
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["command"].startswith("elastic-reset demo") and set(summary["methods"]) == set(results)
