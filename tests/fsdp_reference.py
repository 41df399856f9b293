"""The run tests/fsdp_worker.py shards, in one process (the reference the sharded result must equal)."""

import torch

from elastic_reset.core import Anchor, ElasticReset

STEPS = 5


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    # 7 rows: two ranks hold shards of 4 and 3 (uneven, as FSDP2 pads them internally).
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)


def make_reset(model) -> ElasticReset:
    return ElasticReset(model, decay=0.7, reset_every=2, mode="elastic")


def train(model, rows: slice = slice(None)) -> tuple[list[float], ElasticReset, torch.optim.Optimizer]:
    """SGD on ``rows`` of the batch with Elastic Reset; returns ‖θ − θ̄‖ after each step (before a reset's copy),
    the ElasticReset and the optimizer."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    er = make_reset(model)
    x, y = (t[rows] for t in batch())
    distances = []
    for _ in range(STEPS):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        event = er.step()
        distances.append(er.distance() if event is None else event.distance)
    return distances, er, optimizer


def train_anchor(model, rows: slice = slice(None)) -> tuple[list[float], list[float]]:
    """The same SGD with WARP's LITI (θ0 ← (1 − η)·θ0 + η·θ, then θ ← θ0, every 2 steps) beside a TR-DPO reference
    sync: returns ‖θ − θ0‖ after each step and ‖θ − ref‖ of the sync's copy (collectives under FSDP2)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    liti = Anchor.preset("liti", model, eta=0.5, every=2)
    sync = Anchor.preset("ref_sync", model, alpha=0.5, every=3)
    x, y = (t[rows] for t in batch())
    to_init, to_ref = [], []
    for _ in range(STEPS):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        liti.step()
        sync.step()
        to_init.append(liti.distance("policy", "init"))
        to_ref.append(sync.distance("policy", "reference"))
    return to_init, to_ref


def assert_anchors_match(result: dict) -> None:
    """A multi-process worker's ``anchor_weights`` (gathered) and ``anchor_distances`` equal :func:`train_anchor`'s
    in one process."""
    import pytest

    model = make_model()
    to_init, to_ref = train_anchor(model)
    for name, tensor in model.named_parameters():
        torch.testing.assert_close(result["anchor_weights"][name], tensor.detach(), rtol=1e-5, atol=1e-6)
    assert result["anchor_distances"][0] == pytest.approx(to_init, rel=1e-5)
    assert result["anchor_distances"][1] == pytest.approx(to_ref, rel=1e-5)
