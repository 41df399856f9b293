"""Tests of the algorithm core (:class:`elastic_reset.ElasticReset`) against independent reference computations.

Each test checks one numeric fact. The references are plain python/torch loops written from the algorithm in
the paper (Elastic Reset, §3), never from the implementation:

    θ̄ starts at θ0;  after every step: θ̄ ← (1 − η)·θ + η·θ̄;  at steps n, 2n, ... (never step 0):
    elastic: θ ← θ̄, θ̄ ← θ0;   ema: θ ← θ̄;   init: θ ← θ0, θ̄ ← θ0;   none: no reset.

A "simulated optimizer" adds random perturbations to the parameters between steps.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from elastic_reset import MODES, ElasticReset, ResetEvent

HYPOTHESIS = settings(max_examples=25, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------------------ helpers
def perturb(params, gen: torch.Generator, scale: float = 0.1) -> list[torch.Tensor]:
    """One simulated optimizer step: add fp32 Gaussian noise in place. Returns the noise."""
    deltas = [torch.randn(p.shape, generator=gen) * scale for p in params]
    with torch.no_grad():
        for p, d in zip(params, deltas):
            p.add_(d.to(p.dtype))
    return deltas


def reference_step(theta, ema, theta0, decay, mode, is_reset):
    """The algorithm, written out: EMA update, then (maybe) the mode's reset. Returns (theta, ema)."""
    ema = [(1.0 - decay) * t + decay * e for t, e in zip(theta, ema)]
    if is_reset:
        if mode == "elastic":
            theta, ema = [e.clone() for e in ema], [t.clone() for t in theta0]
        elif mode == "ema":
            theta = [e.clone() for e in ema]
        elif mode == "init":
            theta, ema = [t.clone() for t in theta0], [t.clone() for t in theta0]
    return theta, ema


def l2(xs, ys) -> float:
    return math.sqrt(sum(float(((x.double() - y.double()) ** 2).sum()) for x, y in zip(xs, ys)))


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def assert_all_equal(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.dtype == y.dtype and torch.equal(x, y)


def assert_all_close(xs, ys, **tol):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x, y, **tol)


class PolicyWithValueHead(nn.Module):
    """A body plus a value head: the head must be excluded from resets."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5))
        self.v_head = nn.Linear(5, 1)

    def forward(self, x):
        h = self.body(x)
        return h, self.v_head(h).squeeze(-1)


shapes_st = st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple), min_size=1, max_size=3)


# ------------------------------------------------------------------------------------- 1. modes vs reference
@pytest.mark.parametrize("mode", MODES)
@HYPOTHESIS
@given(shapes=shapes_st, decay=st.floats(0.01, 0.999), reset_every=st.integers(1, 6),
       steps=st.integers(0, 20), seed=st.integers(0, 2**31 - 1))
def test_mode_matches_reference_loop(mode, shapes, decay, reset_every, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    theta0 = snapshot(params)
    # reset_every is given in mode "none" too: it must still never reset.
    er = ElasticReset(params, decay=decay, reset_every=reset_every, mode=mode)
    theta, ema = [t.clone() for t in theta0], [t.clone() for t in theta0]
    resets = 0
    for step in range(1, steps + 1):
        deltas = perturb(params, gen)
        theta = [t + d for t, d in zip(theta, deltas)]
        is_reset = mode != "none" and step % reset_every == 0
        ema_before_reset = [(1.0 - decay) * t + decay * e for t, e in zip(theta, ema)]
        distance = l2(theta, ema_before_reset)
        theta, ema = reference_step(theta, ema, theta0, decay, mode, is_reset)

        event = er.step()

        resets += is_reset
        assert (event is not None) == is_reset, f"step {step}"
        if is_reset:
            assert (event.step, event.index, event.mode) == (step, resets, mode)
            assert event.distance == pytest.approx(distance, rel=1e-5, abs=1e-5)
        assert er.num_steps == step and er.num_resets == resets
        assert_all_close([p.detach() for p in params], theta)
        assert_all_close(er.ema, ema)
        assert_all_equal(er.init, theta0)  # θ0 is never touched


@pytest.mark.parametrize("decay,n", [(0.995, 17), (0.9, 5), (0.5, 3)])
def test_elastic_reset_lands_at_eta_pow_n_of_init(decay, n):
    """With θ held at θ0 + c, after n steps θ̄ = θ0 + (1 − ηⁿ)·c: θ0 keeps weight ηⁿ (0.995^17 ≈ 0.92 in the
    authors' IMDB config), and the reset puts θ exactly there and the EMA back at θ0."""
    w = nn.Parameter(torch.randn(7, 3))
    theta0 = w.detach().clone()
    c = torch.randn(7, 3)
    er = ElasticReset([w], decay=decay, reset_every=n)
    with torch.no_grad():
        w.add_(c)
    for k in range(1, n):
        assert er.step() is None
        torch.testing.assert_close(er.ema[0], theta0 + (1 - decay**k) * c)
    event = er.step()
    assert event is not None and event.step == n
    torch.testing.assert_close(w.detach(), theta0 + (1 - decay**n) * c)
    assert torch.equal(er.ema[0], theta0)
    assert event.distance == pytest.approx(decay**n * float(c.norm()), rel=1e-5)


def test_decay_weights_the_ema_not_the_policy():
    """η = 0.9: one step moves θ̄ only 10 % of the way to θ (a swapped η would move it 90 %)."""
    w = nn.Parameter(torch.zeros(4))
    er = ElasticReset([w], decay=0.9, mode="none")
    with torch.no_grad():
        w.fill_(1.0)
    er.step()
    torch.testing.assert_close(er.ema[0], torch.full((4,), 0.1))


def test_named_pairs_and_module_names_are_used():
    m = PolicyWithValueHead()
    er = ElasticReset(m, reset_every=2)
    assert er.names == [n for n, _ in m.named_parameters()]
    assert list(er.ema_state()) == er.names
    for (name, p), (ename, e) in zip(m.named_parameters(), er.ema_state().items()):
        assert name == ename and torch.equal(e, p.detach())
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.zeros(3))
    er2 = ElasticReset([("a", a), ("b", b)], mode="none")
    assert er2.names == ["a", "b"]
    er3 = ElasticReset([a, b], mode="none")
    assert er3.names == ["param_0", "param_1"]


def test_module_covers_only_trainable_parameters():
    m = PolicyWithValueHead()
    m.body[0].weight.requires_grad_(False)
    er = ElasticReset(m, reset_every=1)
    assert "body.0.weight" not in er.names
    assert er.names == [n for n, p in m.named_parameters() if p.requires_grad]
    frozen_before = m.body[0].weight.detach().clone()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    er.step()  # resets every step
    assert torch.equal(m.body[0].weight.detach(), frozen_before + 1.0)  # not reset


# ------------------------------------------------------------------------------------- 2. events and schedule
def test_no_reset_at_step_zero_and_first_reset_at_n():
    w = nn.Parameter(torch.randn(5))
    er = ElasticReset([w], decay=0.9, reset_every=3)
    assert not er.should_reset(0)
    assert er.num_steps == 0 and er.num_resets == 0
    assert [er.should_reset(s) for s in range(1, 10)] == [s % 3 == 0 for s in range(1, 10)]
    gen = torch.Generator().manual_seed(1)
    events = []
    for _ in range(9):
        perturb([w], gen)
        events.append(er.step())
    assert [e is not None for e in events] == [False, False, True] * 3
    assert [(e.step, e.index, e.mode) for e in events if e] == [(3, 1, "elastic"), (6, 2, "elastic"),
                                                               (9, 3, "elastic")]


def test_reset_every_one_always_a_step_towards_init():
    """n = 1 in elastic mode: every step θ ← θ0 + (1 − η)(θ − θ0), and θ̄ stays θ0."""
    w = nn.Parameter(torch.randn(6))
    theta0 = w.detach().clone()
    er = ElasticReset([w], decay=0.8, reset_every=1)
    gen = torch.Generator().manual_seed(2)
    for step in range(1, 5):
        perturb([w], gen)
        before = w.detach().clone()
        event = er.step()
        assert event is not None and event.index == step
        torch.testing.assert_close(w.detach(), theta0 + 0.2 * (before - theta0))
        assert torch.equal(er.ema[0], theta0)


def test_event_distance_is_norm_before_reset_over_all_tensors():
    params = [nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(5)), nn.Parameter(torch.randn(()))]
    er = ElasticReset(params, decay=0.7, reset_every=4, mode="ema")
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        perturb(params, gen)
        assert er.step() is None
    perturb(params, gen)
    theta = snapshot(params)
    expected_ema = [0.3 * t + 0.7 * e for t, e in zip(theta, er.ema)]
    expected = l2(theta, expected_ema)
    event = er.step()
    assert isinstance(event, ResetEvent) and isinstance(event.distance, float)
    assert event.distance == pytest.approx(expected, rel=1e-6)
    assert event.distance > 0.0
    # er.distance() agrees with an independent norm, and is 0 right after a reset to the EMA.
    assert er.distance() == pytest.approx(0.0, abs=1e-7)
    perturb(params, gen)
    assert er.distance() == pytest.approx(l2(snapshot(params), er.ema), rel=1e-6)


def test_custom_schedule_drives_resets():
    calls = []
    reset_steps = {2, 3, 7, 11}

    def schedule(step):
        calls.append(step)
        return step in reset_steps

    w = nn.Parameter(torch.randn(4))
    theta0 = w.detach().clone()
    er = ElasticReset([w], decay=0.9, schedule=schedule, mode="init")
    gen = torch.Generator().manual_seed(4)
    fired = []
    for _ in range(12):
        perturb([w], gen)
        event = er.step()
        if event is not None:
            fired.append((event.step, event.index))
            assert torch.equal(w.detach(), theta0)
    assert calls == list(range(1, 13))  # 1-based, once per step, never step 0
    assert fired == [(2, 1), (3, 2), (7, 3), (11, 4)]


def test_schedule_true_everywhere_still_never_resets_at_step_zero():
    w = nn.Parameter(torch.randn(3))
    er = ElasticReset([w], schedule=lambda s: True)
    assert er.should_reset(0) is False
    event = er.step()  # the first reset comes after the first step
    assert event is not None and event.step == 1 and er.num_resets == 1


def test_update_ema_false_only_counts():
    w = nn.Parameter(torch.randn(5))
    theta0 = w.detach().clone()
    er = ElasticReset([w], decay=0.9, reset_every=3)
    gen = torch.Generator().manual_seed(5)
    for step in (1, 2):
        perturb([w], gen)
        assert er.step(update_ema=False) is None
        assert er.num_steps == step
        assert torch.equal(er.ema[0], theta0)  # never updated
    perturb([w], gen)
    event = er.step(update_ema=False)  # the schedule still counts this step: reset to the (unchanged) EMA = θ0
    assert event is not None and event.step == 3
    assert torch.equal(w.detach(), theta0)
    # update() alone updates the EMA without counting a step.
    perturb([w], gen)
    theta = w.detach().clone()
    er.update()
    assert er.num_steps == 3
    torch.testing.assert_close(er.ema[0], 0.1 * theta + 0.9 * theta0)


def test_manual_reset_and_mode_none():
    w = nn.Parameter(torch.randn(3))
    er = ElasticReset([w], decay=0.5, reset_every=100)
    with torch.no_grad():
        w.add_(2.0)
    er.step()
    ema = er.ema[0].clone()
    event = er.reset()  # outside the schedule
    assert (event.step, event.index) == (1, 1)
    assert torch.equal(w.detach(), ema)
    none = ElasticReset([nn.Parameter(torch.randn(3))], mode="none")
    for _ in range(5):
        assert none.step() is None
    with pytest.raises(RuntimeError, match="none"):
        none.reset()


# -------------------------------------------------------------------------------------------- 3. LoRA, exclude
@pytest.fixture(scope="module")
def lora_model_factory():
    from peft import LoraConfig

    from elastic_reset.lm.lora import add_lora
    from elastic_reset.models import tiny_causal_lm

    def make():
        base = tiny_causal_lm(hidden=32, layers=2, seed=0)
        return add_lora(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         target_modules=["q_proj", "v_proj"]))
    return make


def test_lora_covers_exactly_the_adapter_weights(lora_model_factory):
    model = lora_model_factory()
    er = ElasticReset(model, decay=0.9, reset_every=2)
    expected = [n for n, _ in model.named_parameters() if "lora_" in n]
    assert er.names == expected
    assert len(expected) == 2 * 2 * 2  # layers × {q,v} × {A,B}
    assert all(".q_proj." in n or ".v_proj." in n for n in er.names)
    assert sum(e.numel() for e in er.ema) == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("mode", ["elastic", "init"])
def test_lora_reset_never_touches_base_weights(lora_model_factory, mode):
    model = lora_model_factory()
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    base = [(n, p) for n, p in model.named_parameters() if "lora_" not in n]
    er = ElasticReset(model, decay=0.9, reset_every=2, mode=mode)
    gen = torch.Generator().manual_seed(6)
    for step in range(1, 7):
        perturb(lora, gen)
        if step % 2 == 0:
            # Move the base weights too just before a reset: a reset must leave them as they are.
            perturb([p for _, p in base], gen, scale=0.01)
        base_before = snapshot([p for _, p in base])
        lora_before = snapshot(lora)
        event = er.step()
        assert (event is not None) == (step % 2 == 0)
        assert_all_equal(snapshot([p for _, p in base]), base_before)
        if event is not None:
            assert not any(torch.equal(a, b) for a, b in zip(snapshot(lora), lora_before))


def test_lora_init_reset_gives_back_the_base_model(lora_model_factory):
    """LoRA B starts at 0, so a reset-to-init makes the adapted model compute exactly the base model."""
    model = lora_model_factory()
    model.eval()
    ids = torch.randint(3, 259, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(input_ids=ids).logits
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    er = ElasticReset(model, reset_every=3, mode="init")
    gen = torch.Generator().manual_seed(8)
    for _ in range(2):
        perturb(lora, gen)
        er.step()
    with torch.no_grad():
        drifted = model(input_ids=ids).logits
    assert not torch.allclose(drifted, base_logits, atol=1e-4)
    perturb(lora, gen)
    assert er.step() is not None
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, base_logits, rtol=0, atol=0)


@pytest.mark.parametrize("exclude,dropped", [
    ("v_head", {"v_head.weight", "v_head.bias"}),
    (["v_head", r"^body\.2\.bias$"], {"v_head.weight", "v_head.bias", "body.2.bias"}),
    (("v_head",), {"v_head.weight", "v_head.bias"}),
    (r"head|\.2\.bias$", {"v_head.weight", "v_head.bias", "body.2.bias"}),  # searched, not matched at the start
    (lambda name: name.startswith("v_head."), {"v_head.weight", "v_head.bias"}),
])
def test_exclude_drops_value_head(exclude, dropped):
    m = PolicyWithValueHead()
    all_names = [n for n, _ in m.named_parameters()]
    er = ElasticReset(m, decay=0.5, reset_every=2, exclude=exclude)
    assert er.names == [n for n in all_names if n not in dropped]
    params = dict(m.named_parameters())
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    gen = torch.Generator().manual_seed(9)
    ema = dict(theta0)
    for _ in range(2):
        perturb(list(params.values()), gen)
        ema = {n: 0.5 * params[n].detach() + 0.5 * e for n, e in ema.items()}
        kept = {n: params[n].detach().clone() for n in dropped}
        event = er.step()
    assert event is not None
    for n in dropped:
        assert torch.equal(params[n].detach(), kept[n])  # excluded: untouched by the reset
    for n in er.names:
        torch.testing.assert_close(params[n].detach(), ema[n])  # covered: reset to the EMA
        assert torch.equal(er.ema_state()[n], theta0[n])


# ----------------------------------------------------------------------------------------- 4. bf16 + fp32 EMA
@pytest.mark.parametrize("mode", ["elastic", "ema"])
def test_bf16_model_fp32_ema(mode):
    torch.manual_seed(10)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(torch.bfloat16)
    params = list(m.parameters())
    decay, n = 0.95, 4
    er = ElasticReset(m, decay=decay, reset_every=n, mode=mode)
    assert all(t.dtype == torch.float32 for t in er.ema + er.init)
    theta0 = [p.detach().float() for p in params]  # bf16 → fp32 is exact
    assert_all_equal(er.init, theta0)
    ema_ref = [t.clone() for t in theta0]
    gen = torch.Generator().manual_seed(11)
    for step in range(1, 2 * n + 1):
        perturb(params, gen, scale=0.05)
        ema_ref = [(1 - decay) * p.detach().float() + decay * e for p, e in zip(params, ema_ref)]
        if step % n:
            assert er.step() is None
            assert_all_close(er.ema, ema_ref)
        else:
            er.update()
            assert_all_close(er.ema, ema_ref)
            ema_now = [e.clone() for e in er.ema]
            assert er.step(update_ema=False) is not None
            # θ ← θ̄, rounded to bf16; params stay bf16.
            assert_all_equal(snapshot(params), [e.to(torch.bfloat16) for e in ema_now])
            if mode == "elastic":
                assert_all_equal(er.ema, theta0)
                ema_ref = [t.clone() for t in theta0]
            else:
                assert_all_equal(er.ema, ema_now)
                ema_ref = ema_now


def test_fp32_ema_keeps_sub_bf16_updates():
    """θ moves by one bf16 ulp at 1.0; the fp32 EMA moves by (1 − η)·2⁻⁷, which bf16 would round away."""
    w = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    er = ElasticReset([w], decay=0.995, mode="none")
    with torch.no_grad():
        w.fill_(1.0 + 2**-7)
    er.step()
    expected = torch.full((3,), (1 - 0.995) * (1 + 2**-7) + 0.995 * 1.0)
    torch.testing.assert_close(er.ema[0], expected)
    assert (er.ema[0] > 1.0).all()
    assert (er.ema[0].to(torch.bfloat16) == 1.0).all()


def test_dtype_argument_sets_the_copies_dtype():
    w = nn.Parameter(torch.randn(4))
    er = ElasticReset([w], decay=0.9, mode="none", dtype=torch.float64)
    assert er.ema[0].dtype == er.init[0].dtype == torch.float64
    theta0 = w.detach().double()
    with torch.no_grad():
        w.add_(1.0)
    er.step()
    torch.testing.assert_close(er.ema[0], 0.1 * w.detach().double() + 0.9 * theta0)


# ------------------------------------------------------------------------------------------- 5. ema_weights()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ema_weights_swaps_in_and_restores_exactly(dtype):
    torch.manual_seed(12)
    m = PolicyWithValueHead().to(dtype)
    er = ElasticReset(m, decay=0.8, reset_every=100, exclude="v_head")
    params = [p for n, p in m.named_parameters() if not n.startswith("v_head")]
    gen = torch.Generator().manual_seed(13)
    for _ in range(3):
        perturb(list(m.parameters()), gen)
        er.step()
    before = snapshot(m.parameters())
    ema_before = [e.clone() for e in er.ema]
    x = torch.randn(2, 6, dtype=dtype)
    with er.ema_weights():
        assert_all_equal(snapshot(params), [e.to(dtype) for e in er.ema])
        assert torch.equal(m.v_head.weight.detach(), before[-2])  # not covered: not swapped
        inside_out = m(x)[0]
    after = snapshot(m.parameters())
    assert_all_equal(after, before)
    assert_all_equal(er.ema, ema_before)
    assert er.num_steps == 3 and er.num_resets == 0
    # Outside the context the model computes with its own weights again.
    assert not torch.equal(m(x)[0], inside_out)


def test_ema_weights_restores_on_exception():
    m = PolicyWithValueHead()
    er = ElasticReset(m, decay=0.8, reset_every=100)
    gen = torch.Generator().manual_seed(14)
    for _ in range(2):
        perturb(list(m.parameters()), gen)
        er.step()
    before = snapshot(m.parameters())
    with pytest.raises(KeyError, match="boom"):
        with er.ema_weights():
            assert not torch.equal(next(m.parameters()).detach(), before[0])
            raise KeyError("boom")
    assert_all_equal(snapshot(m.parameters()), before)


# --------------------------------------------------------------------------------------- 6. state_dict resume
def _run(model, er, gen, steps):
    events, weights = [], []
    for _ in range(steps):
        perturb(list(model.parameters()), gen)
        events.append(er.step())
        weights.append(snapshot(model.parameters()))
    return events, weights


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [2, 3, 4, 7])  # before a reset, exactly at one, just after, after two
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_mid_schedule(tmp_path, mode, k, dtype):
    torch.manual_seed(15)
    model_a = PolicyWithValueHead().to(dtype)
    er_a = ElasticReset(model_a, decay=0.9, reset_every=3, mode=mode, exclude="v_head")
    gen = torch.Generator().manual_seed(16)
    _run(model_a, er_a, gen, k)  # k steps, then the state is saved mid-schedule

    path = tmp_path / "er.pt"
    torch.save(er_a.state_dict(), path)
    state = torch.load(path, weights_only=True)  # loadable without unpickling arbitrary objects
    model_b = copy.deepcopy(model_a)
    # Built with other settings (and θ0 = the current weights): the state must restore all of it.
    er_b = ElasticReset(model_b, decay=0.5, reset_every=7, mode=mode, exclude="v_head")
    er_b.load_state_dict(state)
    assert (er_b.num_steps, er_b.num_resets, er_b.decay, er_b.reset_every) == (k, er_a.num_resets, 0.9, 3)
    assert_all_equal(er_b.ema, er_a.ema)
    assert_all_equal(er_b.init, er_a.init)

    gen_a = torch.Generator().manual_seed(17)
    gen_b = torch.Generator().manual_seed(17)
    events_a, weights_a = _run(model_a, er_a, gen_a, 8)
    events_b, weights_b = _run(model_b, er_b, gen_b, 8)
    assert events_a == events_b  # same steps, indices, modes, and bit-identical distances
    for wa, wb in zip(weights_a, weights_b):
        assert_all_equal(wa, wb)
    assert_all_equal(er_a.ema, er_b.ema)
    expected_resets = [s for s in range(k + 1, k + 9) if s % 3 == 0] if mode != "none" else []
    assert [e.step for e in events_a if e] == expected_resets
    assert [e.index for e in events_a if e] == list(range(er_a.num_resets - len(expected_resets) + 1,
                                                         er_a.num_resets + 1))


def test_state_dict_is_a_snapshot_once_saved(tmp_path):
    w = nn.Parameter(torch.randn(4))
    er = ElasticReset([w], decay=0.5, mode="none")
    er.step()
    torch.save(er.state_dict(), tmp_path / "s.pt")
    saved_ema = er.ema[0].clone()
    with torch.no_grad():
        w.add_(3.0)
    er.step()
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(loaded["copies"]["ema"][0], saved_ema)
    assert loaded["num_steps"] == 1


def test_state_dict_with_schedule_resumes(tmp_path):
    sched = lambda s: s in (4, 9)  # noqa: E731
    w = nn.Parameter(torch.randn(5))
    er_a = ElasticReset([("w", w)], decay=0.8, schedule=sched)
    gen = torch.Generator().manual_seed(18)
    for _ in range(5):
        perturb([w], gen)
        er_a.step()
    torch.save(er_a.state_dict(), tmp_path / "s.pt")
    w_b = nn.Parameter(w.detach().clone())
    er_b = ElasticReset([("w", w_b)], decay=0.8, schedule=sched)
    er_b.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    ga, gb = torch.Generator().manual_seed(19), torch.Generator().manual_seed(19)
    for _ in range(6):
        perturb([w], ga)
        perturb([w_b], gb)
        ea, eb = er_a.step(), er_b.step()
        assert ea == eb
        assert torch.equal(w, w_b)
    assert er_b.num_resets == 2


# ------------------------------------------------------------------------------- 7. optimizer state at reset
def _train_steps(model, opt, er, gen, steps):
    events = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen)
        h, v = model(x)
        loss = (h**2).mean() + ((v - torch.randn(8, generator=gen)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        events.append(er.step())
    return events


def test_reset_optimizer_state_drops_adam_state_of_reset_params():
    torch.manual_seed(20)
    m = PolicyWithValueHead()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    er = ElasticReset(m, decay=0.9, reset_every=3, exclude="v_head", optimizer=opt, reset_optimizer_state=True)
    gen = torch.Generator().manual_seed(21)
    events = _train_steps(m, opt, er, gen, 3)
    assert events[-1] is not None
    covered = [p for n, p in m.named_parameters() if not n.startswith("v_head")]
    for p in covered:
        assert len(opt.state.get(p, {})) == 0
    for p in m.v_head.parameters():
        assert int(opt.state[p]["step"]) == 3  # the value head keeps its moments

    # The next step of a reset tensor is a fresh Adam's first step: θ − lr·g/(|g| + eps).
    before = snapshot(covered)
    x = torch.randn(8, 6, generator=gen)
    h, v = m(x)
    loss = (h**2).mean() + (v**2).mean()
    opt.zero_grad()
    loss.backward()
    grads = [p.grad.detach().clone() for p in covered]
    opt.step()
    for p, b, g in zip(covered, before, grads):
        torch.testing.assert_close(p.detach(), b - 1e-2 * g / (g.abs() + 1e-8))
        assert int(opt.state[p]["step"]) == 1


def test_optimizer_state_kept_by_default():
    torch.manual_seed(22)
    m = PolicyWithValueHead()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    er = ElasticReset(m, decay=0.9, reset_every=3, exclude="v_head", optimizer=opt)
    gen = torch.Generator().manual_seed(23)
    _train_steps(m, opt, er, gen, 2)
    # Third step by hand, to snapshot the optimizer state between opt.step() and the reset.
    x = torch.randn(8, 6, generator=gen)
    h, v = m(x)
    opt.zero_grad()
    ((h**2).mean() + (v**2).mean()).backward()
    opt.step()
    state_before = {p: {k: t.clone() for k, t in opt.state[p].items()} for p in m.parameters()}
    assert er.step() is not None
    for p in m.parameters():
        assert set(opt.state[p]) == set(state_before[p])
        for key, t in state_before[p].items():
            assert torch.equal(opt.state[p][key], t)


# --------------------------------------------------------------------------------------------- 8. bad inputs
def _w():
    return [nn.Parameter(torch.randn(3))]


@pytest.mark.parametrize("decay", [0, 1, 0.0, 1.0, -0.1, 1.5, True, False, float("nan"), float("inf"), "0.9",
                                   None])
def test_bad_decay(decay):
    with pytest.raises(ValueError, match="decay"):
        ElasticReset(_w(), decay=decay, reset_every=3)


@pytest.mark.parametrize("reset_every", [0, -1, 2.0, 2.5, True, "3"])
def test_bad_reset_every(reset_every):
    with pytest.raises(ValueError, match="reset_every"):
        ElasticReset(_w(), reset_every=reset_every)


def test_no_parameters():
    frozen = PolicyWithValueHead().requires_grad_(False)
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset([], reset_every=2)
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset(frozen, reset_every=2)
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset(PolicyWithValueHead(), reset_every=2, exclude=".")
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset(PolicyWithValueHead(), reset_every=2, exclude=lambda n: True)
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset(torch.randn(3), reset_every=2)  # a single tensor, not an iterable of them
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset([torch.randn(3), 1.0], reset_every=2)
    w = nn.Parameter(torch.randn(2))
    with pytest.raises(ValueError, match="model_or_params"):
        ElasticReset([("a", w), ("a", nn.Parameter(torch.randn(2)))], reset_every=2)


@pytest.mark.parametrize("mode", ["elastc", "EMA", "", None])
def test_unknown_mode(mode):
    with pytest.raises(ValueError, match="mode"):
        ElasticReset(_w(), reset_every=3, mode=mode)


@pytest.mark.parametrize("mode", ["elastic", "ema", "init"])
def test_resetting_mode_needs_reset_every(mode):
    with pytest.raises(ValueError, match="reset_every"):
        ElasticReset(_w(), mode=mode)
    ElasticReset(_w(), mode="none")  # fine: "none" never resets


def test_schedule_arguments():
    with pytest.raises(ValueError, match="reset_every"):
        ElasticReset(_w(), reset_every=3, schedule=lambda s: s % 3 == 0)
    with pytest.raises(ValueError, match="schedule"):
        ElasticReset(_w(), schedule=5)


def test_reset_optimizer_state_needs_optimizer():
    with pytest.raises(ValueError, match="optimizer"):
        ElasticReset(_w(), reset_every=3, reset_optimizer_state=True)


def _saved_state():
    m = PolicyWithValueHead()
    er = ElasticReset(m, decay=0.9, reset_every=3)
    perturb(list(m.parameters()), torch.Generator().manual_seed(24))
    er.step()
    return m, er, er.state_dict()


def _assert_load_refused(er, state, match):
    ema, init, counters = [e.clone() for e in er.ema], [t.clone() for t in er.init], (er.num_steps, er.num_resets)
    with pytest.raises(ValueError, match=match):
        er.load_state_dict(state)
    # A refused load changes nothing.
    assert_all_equal(er.ema, ema)
    assert_all_equal(er.init, init)
    assert (er.num_steps, er.num_resets) == counters


def test_load_state_dict_rejects_mismatched_shapes():
    _, _, state = _saved_state()
    other = ElasticReset(nn.ModuleDict({"body": nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 5)),
                                        "v_head": nn.Linear(5, 1)}), reset_every=3)
    assert other.names == state["names"]
    _assert_load_refused(other, state, r"state\['copies'\]\['(ema|init)'\].*body\.0\.weight")
    state = dict(state, copies={**state["copies"], "init": [t[..., :1] if t.dim() else t
                                                            for t in state["copies"]["init"]]})
    _, er, _ = _saved_state()
    _assert_load_refused(er, state, r"state\['copies'\]\['init'\]")


def test_load_state_dict_rejects_mismatched_names():
    _, er, state = _saved_state()
    renamed = dict(state, names=["x." + n for n in state["names"]])
    _assert_load_refused(er, renamed, r"state\['names'\]")
    reordered = dict(state, names=list(reversed(state["names"])))
    _assert_load_refused(er, reordered, r"state\['names'\]")
    covered_fewer = ElasticReset(PolicyWithValueHead(), reset_every=3, exclude="v_head")
    _assert_load_refused(covered_fewer, state, r"state\['names'\]")


def _legacy(er: ElasticReset) -> dict:
    """The state as ElasticReset wrote it before it was an anchor's preset (its own format)."""
    return {"names": list(er.names), "ema": [t.clone() for t in er.ema], "init": [t.clone() for t in er.init],
            "num_steps": er.num_steps, "num_resets": er.num_resets, "decay": er.decay, "mode": er.mode,
            "reset_every": er.reset_every}


@pytest.mark.parametrize("key", ["names", "copies", "num_steps", "num_pulls"])
def test_load_state_dict_rejects_missing_keys(key):
    _, er, state = _saved_state()
    partial = {k: v for k, v in state.items() if k != key}
    _assert_load_refused(er, partial, f"missing.*{key}")


@pytest.mark.parametrize("key", ["names", "ema", "init", "num_steps", "num_resets", "decay", "mode", "reset_every"])
def test_load_state_dict_rejects_missing_keys_of_the_older_format(key):
    _, er, _ = _saved_state()
    partial = {k: v for k, v in _legacy(er).items() if k != key}
    _assert_load_refused(er, partial, f"missing.*{key}")


def test_load_state_dict_rejects_unknown_mode():
    _, er, state = _saved_state()
    _assert_load_refused(er, dict(state, name="elastc"), r"state\['name'\]")
    _assert_load_refused(er, dict(_legacy(er), mode="elastc"), r"state\['mode'\]")


@pytest.mark.parametrize("key", ["ema", "init"])
def test_load_state_dict_rejects_wrong_number_of_tensors(key):
    """Names match but one tensor is missing: a ValueError naming the key (not a RuntimeError from torch), and
    nothing loaded."""
    _, er, state = _saved_state()
    copies = {**state["copies"], key: list(state["copies"][key])[:-1]}
    _assert_load_refused(er, dict(state, copies=copies), rf"state\['copies'\]\['{key}'\]")


@pytest.mark.parametrize("key,value", [("decay", 1.5), ("decay", 0.0), ("reset_every", 0), ("reset_every", 2.5)])
def test_load_state_dict_validates_like_the_constructor(key, value):
    _, er, state = _saved_state()
    changed = dict(state, trigger={"n": value}) if key == "reset_every" else dict(state, **{key: value})
    _assert_load_refused(er, changed, key)
    _assert_load_refused(er, dict(_legacy(er), **{key: value}), key)


@pytest.mark.parametrize("mode", MODES)
def test_a_state_of_the_older_format_loads_and_continues_bit_for_bit(mode):
    torch.manual_seed(31)
    model_a = PolicyWithValueHead()
    er_a = ElasticReset(model_a, decay=0.9, reset_every=3, mode=mode, exclude="v_head")
    _run(model_a, er_a, torch.Generator().manual_seed(32), 4)
    model_b = copy.deepcopy(model_a)
    er_b = ElasticReset(model_b, decay=0.5, reset_every=7, mode="elastic" if mode != "elastic" else "init",
                        exclude="v_head")
    er_b.load_state_dict(_legacy(er_a))
    assert (er_b.mode, er_b.decay, er_b.reset_every, er_b.num_steps, er_b.num_resets) == (
        mode, 0.9, 3, 4, er_a.num_resets)
    events_a, weights_a = _run(model_a, er_a, torch.Generator().manual_seed(33), 6)
    events_b, weights_b = _run(model_b, er_b, torch.Generator().manual_seed(33), 6)
    assert events_a == events_b
    for wa, wb in zip(weights_a, weights_b):
        assert_all_equal(wa, wb)


def test_elastic_reset_is_an_anchor_with_one_event_type():
    from elastic_reset import Anchor
    from elastic_reset.core import AnchorEvent

    m = PolicyWithValueHead()
    er = ElasticReset(m, decay=0.9, reset_every=2)
    assert isinstance(er, Anchor) and ResetEvent is AnchorEvent
    perturb(list(m.parameters()), torch.Generator().manual_seed(34))
    er.step()
    before = er.distance()
    event = er.step()
    assert (event.mode, event.cause, event.pulls) == ("elastic", "every 2 steps", ("policy <- ema", "ema <- init"))
    assert event.distance == pytest.approx(before, rel=0.5) and er.state_dict()["name"] == "elastic"


def test_load_schedule_state_into_reset_every_controller_is_refused_naming_reset_every():
    """A state saved by a schedule-driven controller has reset_every=None: loading it into a controller built with
    reset_every is refused, naming it (never a controller whose next step() raises a TypeError)."""
    w = nn.Parameter(torch.randn(3))
    state = ElasticReset([("w", w)], schedule=lambda s: s == 2).state_dict()
    er = ElasticReset([("w", nn.Parameter(torch.randn(3)))], reset_every=2)
    with pytest.raises(ValueError, match=r"^state\['reset_every'\]: the state was saved with a callable schedule"):
        er.load_state_dict(state)
    assert er.reset_every == 2 and er.num_steps == 0  # left as it was
