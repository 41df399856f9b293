"""The pairwise losses of a reward model (Bradley–Terry) and of the Advantage Model (Peng et al. 2023, §3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

AM_MARGIN = 2.5
"""m(x) of the Advantage Model's bounding loss: the constant 2.5 of all of Peng et al.'s experiments (§3.1, note 3)."""


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """−log σ(r(x, y_c) − r(x, y_r)), averaged over the batch (Peng et al. eq. 1; Ouyang et al. 2022)."""
    return -F.logsigmoid(chosen - rejected).mean()


def advantage(reward: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """a(x, y) = r(x, y) − e(x): the reward over the expected reward of the prompt (eq. 5 and 8 with K = 0: our
    pairs carry no log-probabilities of the policies that sampled them, so no importance weights)."""
    return reward - expected


def advantage_model_loss(a_chosen: torch.Tensor, a_rejected: torch.Tensor, margin: float | torch.Tensor = AM_MARGIN
                         ) -> torch.Tensor:
    """Eq. 6: −[log σ(a_c − a_r) + log σ(m − a_c) + log σ(m + a_r)], averaged over the batch: the ranking loss
    plus a bounding loss that keeps the chosen advantage below m and the rejected one above −m."""
    ranking = F.logsigmoid(a_chosen - a_rejected)
    bounding = F.logsigmoid(margin - a_chosen) + F.logsigmoid(margin + a_rejected)
    return -(ranking + bounding).mean()
