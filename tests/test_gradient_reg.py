"""Gradient regularisation (method ``gradient_reg``): its finite difference against autograd's Hessian-vector
product, the plain update at γ = 0, and resume."""

from __future__ import annotations

import pytest
import torch

from elastic_reset.models import tiny_causal_lm
from elastic_reset.rl.methods import GradientRegularization, PolicyHandle
from elastic_reset.rl.trainer import RLTrainer
from helpers import tiny_config, without_times

IDS = torch.tensor([[5, 17, 80, 33, 9, 41], [7, 7, 120, 3, 64, 2]])
ADVANTAGES = torch.tensor([[0.5, -1.0, 2.0, 0.3, -0.7], [1.2, 0.1, -0.4, 0.9, -1.5]], dtype=torch.float64)


def policy_loss(model):
    """A policy-gradient-shaped loss: −Σ advantage · log π(token), on fixed sequences (the same actions)."""
    logp = torch.log_softmax(model(IDS).logits[:, :-1], -1).gather(-1, IDS[:, 1:, None])[..., 0]
    return -(ADVANTAGES * logp).mean()


def finite_difference_gradient(model, gamma, eps):
    method = GradientRegularization(GradientRegularization.Config(strength=gamma, eps=eps, g1_clip=1e9, g2_clip=1e9))
    method.setup(PolicyHandle(model, None, [], lambda batch: torch.zeros(())))
    params = [p for p in model.parameters() if p.requires_grad]

    def recompute():
        model.zero_grad(set_to_none=True)
        policy_loss(model).backward()

    recompute()
    stats = method.on_gradients(params, recompute)
    return [p.grad.clone() for p in params], stats, method


def test_the_finite_difference_matches_the_exact_gradient_of_the_penalty():
    model = tiny_causal_lm(hidden=32, seed=3).double()
    model.set_attn_implementation("eager")  # SDPA's CPU kernel has no second derivative
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    gamma = 0.5
    _, _, method = finite_difference_gradient(model, gamma, 1e-3)
    # Exact, by autograd's Hessian-vector product: with P the penalised weights (all but the embedding), the
    # gradient of L + γ/2·‖∇_P L‖² on P is g + γ·H_PP·g_P; the embedding keeps g.
    grads = torch.autograd.grad(policy_loss(model), params, create_graph=True)
    hvp = torch.autograd.grad(sum((g * g.detach()).sum() for p, g in zip(params, grads) if id(p) in method.penalised),
                              params)
    exact = [g.detach() + (gamma * h if id(p) in method.penalised else 0) for p, g, h in zip(params, grads, hvp)]
    embedding = model.get_input_embeddings().weight
    assert id(embedding) not in method.penalised and len(method.penalised) == len(params) - 1  # tied: one matrix

    def error(eps):
        fd, stats, _ = finite_difference_gradient(model, gamma, eps)
        assert all(torch.equal(p, b) for p, b in zip(params, before))  # the weights are put back exactly
        assert stats["grad_reg/g1_norm"] > 0 and stats["grad_reg/g2_norm"] > 0
        return max(float((a - b).abs().max()) for a, b in zip(fd, exact)) / max(float(e.abs().max()) for e in exact)

    # First order in ε: here 0.2, 0.02, 0.002 (smaller ε meets the fp32 rotary tables inside the float64 model).
    errors = [error(eps) for eps in (1e-2, 1e-3, 1e-4)]
    assert errors[0] > 5 * errors[1] > 25 * errors[2] and errors[2] < 5e-3
    plain = [g.detach() for g in grads]
    assert max(float((a - b).abs().max()) for a, b in zip(exact, plain)) > 100 * errors[2]  # the penalty is felt


def test_zero_strength_is_the_plain_update_bit_for_bit(tmp_path):
    kl = without_times(RLTrainer(tiny_config("method.name=kl"), tmp_path / "kl").train())
    zero = without_times(RLTrainer(tiny_config("method.name=gradient_reg", "method.strength=0"),
                                   tmp_path / "zero").train())
    assert zero == kl
    penalised = without_times(RLTrainer(tiny_config("method.name=gradient_reg", "method.strength=0.5"),
                                        tmp_path / "on").train())
    assert penalised[-1]["policy_loss"] != kl[-1]["policy_loss"] and "grad_reg/g2_norm" in penalised[-1]


@pytest.mark.parametrize("estimator", ["rloo", "ppo"])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, estimator):
    sets = ("method.name=gradient_reg", "method.strength=0.5", f"algo.name={estimator}", "checkpoint_every=2")
    full = without_times(RLTrainer(tiny_config(*sets, "steps=4"), tmp_path / "full").train())
    RLTrainer(tiny_config(*sets, "steps=2"), tmp_path / "cut").train()
    resumed = RLTrainer(tiny_config(*sets, "steps=4"), tmp_path / "cut", resume=True).train()
    assert without_times(resumed) == full[2:]


def test_with_lora_only_the_adapters_are_perturbed_and_the_run_trains(tmp_path):
    trainer = RLTrainer(tiny_config("method.name=gradient_reg", "method.strength=0.5", "model.lora={r: 2, alpha: 4}"),
                        tmp_path)
    adapters = {id(p) for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainer.method.penalised == adapters and all("lora" in n for n, p in trainer.model.named_parameters()
                                                        if id(p) in adapters)
    record = trainer.train_step()
    trainer.close()
    assert record["grad_reg/g1_norm"] > 0 and record["grad_reg/g2_norm"] != record["grad_reg/g1_norm"]
