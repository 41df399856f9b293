"""`elastic-reset demo` end to end on the tiny local model (the real one loads SmolLM2 and takes minutes)."""

from elastic_reset.demo import run_demo


def test_demo_runs_both_methods_and_marks_resets(tmp_path, capsys):
    results = run_demo(tmp_path, steps=3, model="tiny-llama")
    assert set(results) == {"kl", "elastic_reset"}
    assert any("reset" in r for r in results["elastic_reset"]) and not any("reset" in r for r in results["kl"])
    out = capsys.readouterr().out
    assert " R" in out and "reward" in out and str(tmp_path.resolve()) in out
