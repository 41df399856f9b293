"""The policy-gradient algorithms (``algo.name``), one class each: how scores become advantages, and a minibatch a
loss. The trainer picks one at set-up and never asks which it has.

- ``ppo``: per-token rewards (the KL penalty at every token, the score at the last), GAE over a value head that
  shares the policy's trunk, the clipped ratio objective and a clipped value loss.
- ``reinforce``: the sequence return minus a moving-average baseline.
- ``rloo``: the sequence return minus the mean of the other samples of its prompt (GRPO's, with
  ``scale_rewards``).

Every one makes ``algo.epochs`` passes; the loss is the plain policy gradient or the clipped ratio
(``algo.ratio``), reduced as ``algo.loss_aggregation`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from elastic_reset.lm.scoring import ResponseOutput
from elastic_reset.rl import ops
from elastic_reset.rl.config import AlgoConfig
from elastic_reset.rl.distributed import DataParallel
from elastic_reset.rl.policy import ValueHead


@dataclass
class Minibatch:
    """What one optimizer step's loss needs, row-aligned with its rollout."""

    mask: torch.Tensor
    """``[B, Tr]`` float: the response tokens that count (a dropped sample's are 0)."""
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    """Log-probs of the policy that sampled the batch (PPO's ratio denominator)."""
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def select(self, idx: torch.Tensor) -> Minibatch:
        return Minibatch(*(None if t is None else t[idx] for t in
                           (self.mask, self.advantages, self.old_logprobs, self.old_values, self.returns)))


class Estimator:
    """Base: sequence-level advantages (``reinforce``, ``rloo`` override :meth:`sequence_advantages`)."""

    value_head: ValueHead | None = None
    """PPO's value head (the only algorithm with a critic); it is never reset by a drift method."""

    def __init__(self, config: AlgoConfig, dp: DataParallel, max_new_tokens: int):
        self.config = config
        self.dp = dp
        self.max_new_tokens = max_new_tokens
        """The constant of ``loss_aggregation: constant``."""

    @property
    def epochs(self) -> int:
        """Passes over each rollout batch."""
        return self.config.epochs

    def values(self, out: ResponseOutput) -> torch.Tensor | None:
        """V(s_t) from a forward's hidden states (None without a critic)."""
        return None if self.value_head is None else self.value_head(out.hidden)

    def kept(self, keep: torch.Tensor) -> torch.Tensor:
        """Which samples enter the update, given which have a valid reward."""
        return keep

    def sequence_advantages(self, seq_return: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def advantages(self, scores: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor,
                   kl_tok: torch.Tensor, beta: float, old_values: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token advantages (0 outside ``mask``) and the value targets (PPO; else None), from the scores and the
        per-token KL penalty (paper eq. 1: R = r − β·log π/π_ref). Called once per iteration."""
        seq_return = scores - beta * kl_tok.sum(dim=1)
        advantages = self.sequence_advantages(seq_return, keep)[:, None].expand_as(mask).clone()
        return self._finish(advantages, mask), None

    def _finish(self, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.config.whiten_advantages:
            advantages = self.dp.whiten(advantages, mask)
        return torch.where(mask > 0, advantages, 0.0)

    def loss(self, out: ResponseOutput, mb: Minibatch, step_tokens: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The minibatch's policy-gradient loss (before the entropy bonus and a method's extra loss).
        ``step_tokens``: the mean real tokens of this rank's minibatches in the iteration (``batch_token``)."""
        c = self.config
        if c.ratio == "none":
            loss, stats = ops.policy_gradient_loss(out.logprobs, mb.advantages, mb.mask, c.loss_aggregation,
                                                   self.max_new_tokens, step_tokens), {}
        else:
            loss, stats = ops.ppo_policy_loss(
                out.logprobs, mb.old_logprobs, mb.advantages, mb.mask, c.clip_range, clip_range_high=c.clip_range_high,
                level=c.ratio, how=c.loss_aggregation, max_len=self.max_new_tokens, step_tokens=step_tokens,
                ratio_max=c.ratio_max,
                surrogate=c.surrogate, off_policy_mask=c.off_policy_mask,
                sapo_temperatures=(c.sapo_temperature_pos, c.sapo_temperature_neg),
                vespo=(c.vespo_k_pos, c.vespo_lambda_pos, c.vespo_k_neg, c.vespo_lambda_neg))
        return loss, {**stats, "policy_loss": float(loss.detach())}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Reinforce(Estimator):
    """REINFORCE with a moving-average baseline. The baseline is used before it sees the batch (the first batch is
    centred on its own mean), then moves toward the batch's mean: it is this estimator's state, checkpointed."""

    def __init__(self, config: AlgoConfig, dp: DataParallel, max_new_tokens: int):
        super().__init__(config, dp, max_new_tokens)
        self.baseline = ops.MovingAverageBaseline(config.baseline_decay)

    def sequence_advantages(self, seq_return: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch_mean = self.dp.mean_of(seq_return[keep])
        base = self.baseline.value
        advantages = seq_return - (batch_mean if base is None else base)
        self.baseline.update(batch_mean)
        return advantages

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])


class RLOO(Estimator):
    """REINFORCE leave-one-out: each sample's baseline is the mean return of the other samples of its prompt."""

    def kept(self, keep: torch.Tensor) -> torch.Tensor:
        """A whole group or none: a dropped sample would poison its group's leave-one-out baseline."""
        k = self.config.samples_per_prompt
        return keep.view(-1, k).all(dim=1, keepdim=True).expand(-1, k).reshape(-1)

    def sequence_advantages(self, seq_return: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        k = self.config.samples_per_prompt
        advantages = ops.rloo_advantages(seq_return, k, self.config.baseline)
        if self.config.scale_rewards == "group":  # GRPO's: by the std of the prompt's group (TRL: unbiased, + 1e-4)
            advantages = (advantages.view(-1, k) / (seq_return.float().view(-1, k).std(dim=1, keepdim=True)
                                                    + 1e-4)).reshape(-1)
        return advantages


class PPO(Estimator):
    """PPO with a value head on the policy's trunk and GAE (``algo.gamma``, ``algo.lam``)."""

    def __init__(self, config: AlgoConfig, dp: DataParallel, max_new_tokens: int, hidden_size: int,
                 device: torch.device):
        super().__init__(config, dp, max_new_tokens)
        self.value_head = ValueHead(hidden_size).to(device)

    def advantages(self, scores, keep, mask, response_mask, kl_tok, beta, old_values):
        # Over every response (a dropped one has score 0 here); `mask` then keeps dropped ones out of the loss.
        full = response_mask.float()
        rewards = ops.token_rewards(scores, beta * kl_tok, full)
        advantages, returns = ops.gae(rewards, old_values, full, self.config.gamma, self.config.lam)
        return self._finish(advantages, mask), returns

    def loss(self, out, mb, step_tokens=None):
        c = self.config
        loss, st = super().loss(out, mb, step_tokens)
        vloss, vst = ops.value_loss(self.value_head(out.hidden), mb.old_values, mb.returns, mb.mask,
                                    c.clip_range_value)
        return loss + c.vf_coef * vloss, {**st, **vst, "value_loss": float(vloss.detach())}


def build_estimator(config: AlgoConfig, dp: DataParallel, max_new_tokens: int, hidden_size: int,
                    device: torch.device) -> Estimator:
    if config.name == "ppo":
        return PPO(config, dp, max_new_tokens, hidden_size, device)
    return {"reinforce": Reinforce, "rloo": RLOO}[config.name](config, dp, max_new_tokens)
