"""The anchor API: each preset against a hand-written rule, triggers, exact state, bad settings."""

from __future__ import annotations

import pytest
import torch

from elastic_reset.core import ElasticReset
from elastic_reset.core.anchor import PRESETS, Anchor, Pull
from elastic_reset.core.triggers import Every, KLBudget, Plateau


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(3, generator=g)), torch.nn.Parameter(torch.randn(2, 2, generator=g))]


def _train(params, step):
    """A deterministic stand-in for an optimizer step: move every weight by a step-dependent amount."""
    with torch.no_grad():
        for i, p in enumerate(params):
            p.add_(0.1 * (step + 1) * (i + 1) + 0.01 * torch.arange(p.numel(), dtype=p.dtype).view_as(p))


def _run(anchor, params, steps):
    events = []
    for t in range(steps):
        _train(params, t)
        events.append(anchor.step())
    return events


def test_elastic_reset_preset_equals_the_elastic_reset_class():
    a, b = _params(), _params()
    anchor = Anchor.preset("elastic_reset", a, decay=0.9, every=3)
    er = ElasticReset(b, decay=0.9, reset_every=3)
    for t in range(8):
        _train(a, t), _train(b, t)
        assert (anchor.step() is None) == (er.step() is None)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(anchor.copy("ema").values(), er.ema))


@pytest.mark.parametrize("name,settings", [("ref_sync", {"alpha": 0.6}), ("ref_sync", {"alpha": 1.0}),
                                           ("ref_reset", {}), ("reset_to_init", {}), ("reset_to_ema", {"decay": 0.8}),
                                           ("liti", {"eta": 0.3}), ("ema_anchor", {"decay": 0.8})])
def test_each_preset_follows_its_published_rule(name, settings):
    params = _params()
    init = [p.detach().clone() for p in params]
    every = None if name == "ema_anchor" else 2
    anchor = Anchor.preset(name, params, **settings, **({"every": every} if every else {}),
                           **({"optimizer": torch.optim.SGD(params, lr=0.1)} if name == "ref_reset" else {}))
    # The rule by hand, on plain tensors.
    theta, theta0 = [p.detach().clone() for p in params], [t.clone() for t in init]
    ref, ema = [t.clone() for t in init], [t.clone() for t in init]
    decay = settings.get("decay")
    for t in range(5):
        _train(params, t)
        anchor.step()
        _train(theta, t)
        if decay is not None:
            ema = [decay * e + (1 - decay) * x for e, x in zip(ema, theta)]
        if every and (t + 1) % every == 0:
            if name == "ref_sync":
                a = settings["alpha"]
                ref = [a * x + (1 - a) * r for x, r in zip(theta, ref)]
            elif name == "ref_reset":
                ref = [x.clone() for x in theta]
            elif name == "reset_to_init":
                theta = [x.clone() for x in theta0]
            elif name == "reset_to_ema":
                theta = [e.clone() for e in ema]
            elif name == "liti":
                theta0 = [(1 - settings["eta"]) * z + settings["eta"] * x for z, x in zip(theta0, theta)]
                theta = [z.clone() for z in theta0]
        for got, want in zip(params, theta):
            torch.testing.assert_close(got.detach(), want)
    if name in ("ref_sync", "ref_reset"):
        for got, want in zip(anchor.copy("reference").values(), ref):
            torch.testing.assert_close(got, want)
        assert anchor.kl_reference == "reference"
    if name == "liti":
        for got, want in zip(anchor.copy("init").values(), theta0):
            torch.testing.assert_close(got, want)
    if name == "ema_anchor":
        assert anchor.kl_reference == "ema" and anchor.num_pulls == 0
        for got, want in zip(anchor.copy("ema").values(), ema):
            torch.testing.assert_close(got, want)


def test_ref_reset_drops_the_optimizer_state_and_ref_sync_keeps_it():
    for name, dropped in (("ref_reset", True), ("ref_sync", False)):
        params = _params()
        opt = torch.optim.Adam(params, lr=0.1)
        anchor = Anchor.preset(name, params, every=1, optimizer=opt)
        sum(p.sum() for p in params).backward()
        opt.step()
        assert len(opt.state) == 2
        anchor.step()
        assert (len(opt.state) == 0) == dropped


def test_the_kl_budget_trigger_fires_past_its_budget_with_a_cooldown():
    trigger = KLBudget(1.0, key="kl", cooldown=3)
    anchor = Anchor.preset("elastic_reset", _params(), decay=0.9, trigger=trigger)
    kls = [0.5, 1.5, 2.0, 2.0, 2.0, 0.9, 1.2]
    events = [anchor.step({"kl": kl}) for kl in kls]
    assert [e.step for e in events if e] == [2, 5]
    assert events[1].cause == "kl 1.5 > budget 1" and events[1].index == 1
    assert anchor.step({}) is None  # a step that does not log the KL decides nothing


def test_the_plateau_trigger_counts_readings_not_steps_and_restarts_after_a_pull():
    trigger = Plateau("eval/reward", patience=2, min_delta=0.01)
    anchor = Anchor.preset("reset_to_init", _params(), trigger=trigger)
    logged = [{"eval/reward": 0.5}, {}, {"eval/reward": 0.6}, {"eval/reward": 0.605}, {},
              {"eval/reward": 0.59}, {"eval/reward": 0.2}, {"eval/reward": 0.3}]
    fired = [i + 1 for i, m in enumerate(logged) if anchor.step(m)]
    assert fired == [6]  # 0.605 and 0.59 do not beat 0.6 by 0.01; after the pull 0.2 and 0.3 are new bests
    assert trigger.best == pytest.approx(0.3) and trigger.stale == 0


def test_a_trigger_of_ones_own_is_a_callable():
    anchor = Anchor.preset("ref_sync", _params(), alpha=0.5, trigger=lambda step, m: "odd" if step % 2 else None)
    assert [bool(anchor.step()) for _ in range(4)] == [True, False, True, False]


def test_state_dict_continues_bit_for_bit_with_the_triggers_memory():
    a, b = _params(), _params()
    first = Anchor.preset("elastic_reset", a, decay=0.9, trigger=Plateau("r", patience=2))
    for t, r in enumerate([0.1, 0.2, 0.2]):
        _train(a, t), first.step({"r": r})
    state = first.state_dict()
    with torch.no_grad():
        for x, y in zip(b, a):
            x.copy_(y)
    second = Anchor.preset("elastic_reset", b, decay=0.9, trigger=Plateau("r", patience=2))
    second.load_state_dict(state)
    for t, r in enumerate([0.2, 0.1, 0.5], start=3):
        _train(a, t), _train(b, t)
        assert (first.step({"r": r}) is None) == (second.step({"r": r}) is None)
    assert first.num_pulls == second.num_pulls == 1
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_kl_reference_is_swapped_in_and_out_exactly():
    params = _params()
    anchor = Anchor.preset("ref_sync", params, alpha=0.5, every=1)
    _train(params, 0)
    before = [p.detach().clone() for p in params]
    with anchor.weights("reference"):
        assert all(torch.equal(p, r) for p, r in zip(params, anchor.copy("reference").values()))
    assert all(torch.equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("build,match", [
    (lambda p: Anchor(p, [Pull("reference", "policy", 1.5)], every=1), r"weight \(α, η\)"),
    (lambda p: Anchor(p, [Pull("policy", "ema")], every=1), "decay: a pull reads or writes the EMA"),
    (lambda p: Anchor(p, [Pull("reference", "policy")]), "trigger: pulls need a trigger"),
    (lambda p: Anchor.preset("ref_reset", p, every=1), "optimizer: reset_optimizer=True"),
    (lambda p: Anchor.preset("ref_sync", p, alpha=-0.1, every=1), r"weight \(α, η\)"),
    (lambda p: Anchor.preset("trust_region", p), "preset: expected one of"),
    (lambda p: Anchor(p, [Pull("policy", "policy")], every=1), "target and source are both"),
    (lambda p: KLBudget(float("nan")), "budget"),
])
def test_bad_settings_are_refused_by_name(build, match):
    with pytest.raises(ValueError, match=match):
        build(_params())


def test_every_preset_is_named_after_itself():
    assert set(PRESETS) == {"elastic_reset", "reset_to_ema", "reset_to_init", "ref_sync", "ref_reset", "ema_anchor",
                            "liti"}
    assert Every(4)(8, {}) == "every 4 steps" and Every(4)(6, {}) is None


# ------------------------------------------------------------------------------------------------- in the engine
@pytest.mark.parametrize("lora", [False, True])
def test_a_hard_reference_reset_every_iteration_keeps_the_kl_to_the_reference_at_zero(tmp_path, lora):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    model = {"model": {"lora": {"r": 4, "alpha": 8}}} if lora else {}  # LoRA: the reference adapters swapped in
    trainer = RLTrainer(tiny_config("steps=4", "method.name=anchor", "method.preset=ref_reset", "method.every=1",
                                    **model), tmp_path / "reset")
    assert all("lora_" in n for n in trainer.method.anchor.names) == lora
    reset = trainer.train()
    plain = RLTrainer(tiny_config("steps=4", "method.name=kl", **model), tmp_path / "kl").train()
    # The KL of iteration t is taken before its update: the reference was reset to the policy at the end of t - 1.
    assert all(abs(r["kl"]) < 1e-5 for r in reset) and all(r["reset"]["cause"] == "every 1 steps" for r in reset)
    assert all(abs(r["kl"]) > 1e-3 for r in plain[1:])  # the per-sample estimate: either sign


def test_a_kl_budget_resets_the_policy_when_the_kl_passes_it(tmp_path):
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    config = tiny_config("steps=6", "method.name=anchor", "method.preset=reset_to_init", "method.every=null",
                         "method.kl_budget=1e-6", "method.cooldown=2", "algo.lr=0.05")
    records = RLTrainer(config, tmp_path).train()
    expected, last = [], -10
    for r in records:  # the rule, by hand, on the logged KL (a per-sample estimate: it may be negative)
        if r["kl"] > 1e-6 and r["step"] - last >= 2:
            expected.append(r["step"])
            last = r["step"]
    assert [r["step"] for r in records if "reset" in r] == expected == [2, 4, 6]  # after a reset: KL 0
    assert all("> budget 1e-06" in r["reset"]["cause"] for r in records if "reset" in r)


@pytest.mark.parametrize("overrides,match", [
    (["method.kl_budget=0.5"], "method.every: one trigger"),
    (["method.every=null", "method.plateau=2", "eval.every=0"], "method.plateau: reads eval/reward"),
    (["method.preset=ref_sync", "kl.reference=lm"], "kl.reference: preset .ref_sync. brings its own"),
    (["method.alpha=1.5"], "method.alpha"),
])
def test_the_engine_refuses_an_anchor_setting_that_cannot_work(overrides, match):
    from elastic_reset.rl.config import ConfigError
    from helpers import tiny_config

    with pytest.raises(ConfigError, match=match):
        tiny_config("method.name=anchor", *overrides)


def test_the_engine_offers_every_preset():
    import typing

    from elastic_reset.rl.methods import AnchorMethodConfig

    assert set(typing.get_args(typing.get_type_hints(AnchorMethodConfig)["preset"])) == set(PRESETS)


def test_an_external_reference_is_written_in_place_and_must_match_the_covered_shapes():
    params = _params()
    reference = [torch.zeros_like(p, dtype=torch.float64) for p in params]  # the caller's, in its own dtype
    anchor = Anchor.preset("ref_reset", params, every=1, optimizer=torch.optim.SGD(params, lr=0.1),
                           reference=reference)
    _train(params, 0)
    anchor.step()
    assert all(torch.equal(r, p.detach().double()) for r, p in zip(reference, params))
    assert anchor.distance("policy", "reference") == 0.0
    with pytest.raises(ValueError, match="reference: expected 2 tensors shaped"):
        Anchor.preset("ref_sync", params, every=1, reference=[torch.zeros(3)])
    partitioned = [torch.nn.Parameter(torch.zeros(0)) for _ in params]
    for t in partitioned:
        t.ds_id = 0  # DeepSpeed ZeRO-3's mark: TRL partitions the reference model so under ZeRO-3
    with pytest.raises(ValueError, match="reference: the reference model is partitioned by DeepSpeed ZeRO-3"):
        Anchor.preset("ref_sync", params, every=1, reference=partitioned)


# ------------------------------------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("lora", [False, True])
def test_a_sweep_at_lambda_1_is_the_runs_last_evaluation_and_at_0_the_initial_model(tmp_path, lora):
    import json

    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.sweep import SWEEP_FILE, sweep_run
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    model = {"model": {"lora": {"r": 4, "alpha": 8}}} if lora else {}
    config = tiny_config("steps=3", "method.name=kl", "algo.lr=0.05", "eval.every=3", "eval.num_prompts=4",
                         "eval.num_texts=4", "eval.ema=false", **model)
    last = [r for r in RLTrainer(config, tmp_path).train() if "eval/reward" in r][-1]
    at = {r["lambda"]: r for r in sweep_run(tmp_path, [0.0, 1.0, 1.5])}
    for key in ("eval/reward", "eval/kl_init", "eval/perplexity"):
        assert at[1.0][key] == pytest.approx(last[key], rel=1e-5, abs=1e-6), key
    assert abs(at[0.0]["eval/kl_init"]) < 1e-5 < abs(last["eval/kl_init"])  # θ0 itself: no KL to the initial model
    assert at[1.5]["eval/kl_init"] != at[1.0]["eval/kl_init"]  # ExPO's extrapolation is another point
    if lora:  # W0 + λ·ΔW: the merged delta of every adapted layer scales by λ (not λ², as scaling A and B would)
        from elastic_reset.rl.sweep import interpolated

        trainer = RLTrainer(load_config(tmp_path / "config.yaml"), tmp_path, resume=True)
        layers = [m for m in trainer.model.modules() if hasattr(m, "get_delta_weight") and hasattr(m, "lora_A")]
        before = [m.get_delta_weight("default").clone() for m in layers]
        with interpolated(trainer, 0.5):
            for m, d in zip(layers, before):
                torch.testing.assert_close(m.get_delta_weight("default"), 0.5 * d)
        trainer.close()
        assert layers and all(torch.equal(m.get_delta_weight("default"), d) for m, d in zip(layers, before))
    sweep_run(tmp_path, [1.5])  # the same point again replaces its record
    saved = [json.loads(line) for line in (tmp_path / SWEEP_FILE).read_text().splitlines()]
    assert sorted(r["lambda"] for r in saved) == [0.0, 1.0, 1.5] and all(r["step"] == 3 for r in saved)
    from elastic_reset.evaluation.figures import plot_pareto
    from elastic_reset.evaluation.runs import load_run

    run = load_run(tmp_path)  # the report reads the points, marked apart from the run's own evaluations
    assert sorted(p[0] for p in run.sweep) == [0.0, 1.0, 1.5] and len(run.steps) == 2
    assert plot_pareto({"kl": [run]}, tmp_path / "pareto.png").stat().st_size > 1000


def test_a_lora_sweep_toward_the_ema_is_exact_with_a_second_adapter(tmp_path):
    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.sweep import EMA_ADAPTER, interpolated, sweep_run
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import tiny_config

    config = tiny_config("steps=4", "method.name=elastic_reset", "method.reset_every=100", "method.decay=0.5",
                         "algo.lr=0.05", "eval.every=4", "eval.num_prompts=4", "eval.num_texts=4",
                         model={"lora": {"r": 4, "alpha": 8}})
    last = [r for r in RLTrainer(config, tmp_path).train() if "eval_ema/reward" in r][-1]
    # λ = 0 toward the EMA is the EMA model, which the run evaluated as eval_ema/* at the same step
    at = {r["lambda"]: r for r in sweep_run(tmp_path, [0.0, 1.0], toward="ema")}
    for key in ("reward", "kl_init", "perplexity"):
        assert at[0.0][f"eval/{key}"] == pytest.approx(last[f"eval_ema/{key}"], rel=1e-4, abs=1e-6), key
        assert at[1.0][f"eval/{key}"] == pytest.approx(last[f"eval/{key}"], rel=1e-4, abs=1e-6), key
    trainer = RLTrainer(load_config(tmp_path / "config.yaml"), tmp_path, resume=True)
    layers = [m for m in trainer.model.modules() if hasattr(m, "get_delta_weight") and hasattr(m, "lora_A")]
    names = {id(m): n for n, m in trainer.model.named_modules()}
    ema = trainer.method.ema.ema_state()
    policy = [m.get_delta_weight("default").clone() for m in layers]
    averaged = [m.scaling["default"] * ema[f"{names[id(m)]}.lora_B.default.weight"]
                @ ema[f"{names[id(m)]}.lora_A.default.weight"] for m in layers]
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    with interpolated(trainer, 1.5, "ema"):  # θ̄ + λ(θ − θ̄), rank 2r: the two active adapters' deltas sum to it
        for m, d, a in zip(layers, policy, averaged):
            assert m.active_adapters == ["default", EMA_ADAPTER]
            torch.testing.assert_close(m.get_delta_weight("default") + m.get_delta_weight(EMA_ADAPTER),
                                       a + 1.5 * (d - a))
    assert all(m.active_adapters == ["default"] and EMA_ADAPTER not in m.lora_A for m in layers)
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == trainable
    assert layers and all(torch.equal(m.get_delta_weight("default"), d) for m, d in zip(layers, policy))
    trainer.close()
