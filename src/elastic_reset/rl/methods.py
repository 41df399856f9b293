"""Drift-control methods as small pieces that hook into one training loop.

The loop calls, in order: ``setup`` once; per iteration ``sampling_mask_model`` (NLPO) before the rollout;
``extra_loss`` inside each optimizer step (multitask); ``on_optimizer_step`` after each optimizer step;
``on_epoch_end`` after each pass over the rollout batch; ``on_iteration_end`` once the iteration is done. A method
sees the trainer only through :class:`PolicyHandle` (the policy, its optimizer, the task's pretraining text and an
NLL function), given at ``setup``. A new method is a new subclass and one line in :data:`METHOD_CLASSES`, not flags
scattered through the loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from elastic_reset.core import ElasticReset, ResetEvent
from elastic_reset.errors import ConfigError
from elastic_reset.rl.config import MethodConfig


@dataclass
class PolicyHandle:
    """What a drift-control method may touch of a training run."""

    model: torch.nn.Module
    """The policy being trained (with LoRA: the peft model; its trainable parameters are the adapters)."""
    optimizer: torch.optim.Optimizer
    """The policy's optimizer (a reset may clear its state for the reset weights)."""
    pretrain_texts: list[str] | list[tuple[str, str]]
    """The task's pretraining data (multitask / S2P): texts, or (source, target) pairs for an encoder-decoder
    policy; may be empty."""
    lm_loss: Callable[[list], torch.Tensor]
    """Mean token NLL under the policy of a batch of ``pretrain_texts`` items, with grad."""


class DriftMethod:
    """Plain RL: no KL penalty, no resets (method ``none``)."""

    uses_kl = False
    """Whether the KL penalty enters the reward (method ``none`` runs β = 0 whatever ``kl.coef`` says)."""
    updates_policy = True
    """Whether the policy is updated at all (``frozen``: no, only a learning reward learns)."""
    ema: ElasticReset | None = None
    """The EMA / reset controller, for methods that keep one (evaluated as ``eval_ema/*``)."""

    def __init__(self, config: MethodConfig):
        self.config = config

    def setup(self, policy: PolicyHandle) -> None:
        pass

    def sampling_mask_model(self) -> torch.nn.Module | None:
        return None

    def extra_loss(self) -> tuple[torch.Tensor, dict[str, float]] | None:
        return None

    def on_optimizer_step(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass

    def on_iteration_end(self, step: int) -> dict[str, Any]:
        """Called after iteration ``step`` (1-based); returns entries for its metrics record."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class KLPenalty(DriftMethod):
    """The standard baseline: a KL penalty to the reference in the reward (paper eq. 1)."""

    uses_kl = True


class EMAReset(KLPenalty):
    """Elastic Reset and its ablations (paper §3, §6 "Ablations"), on top of the KL penalty.

    ``method.ema_update`` chooses the EMA's clock: every optimizer step (the paper's text), every epoch over the
    rollout batch (the authors' StackLLaMA code) or once per iteration (the authors' IMDB code: there η^17 ≈ 0.92
    of θ0 remains in the EMA at a reset, so a reset lands close to the initial model). Resets always count
    iterations (``method.reset_every``). The value head is excluded: the value function is never reset (§6,
    Appendix E.1).
    """

    MODE = {"elastic_reset": "elastic", "reset_to_ema": "ema", "reset_to_init": "init", "ema_only": "none"}

    def setup(self, policy: PolicyHandle) -> None:
        c = self.config
        self.ema = ElasticReset(
            policy.model, decay=c.decay, mode=self.MODE[c.name],
            reset_every=None if c.name == "ema_only" else c.reset_every,
            optimizer=policy.optimizer, reset_optimizer_state=c.reset_optimizer,
            device="cpu" if c.ema_device == "cpu" else next(policy.model.parameters()).device,
        )

    def on_optimizer_step(self) -> None:
        if self.config.ema_update == "step":
            self.ema.update()

    def on_epoch_end(self) -> None:
        if self.config.ema_update == "epoch":
            self.ema.update()

    def on_iteration_end(self, step: int) -> dict[str, Any]:
        event: ResetEvent | None = self.ema.step(update_ema=self.config.ema_update == "iteration")
        if event is None:
            return {}
        return {"reset": {"index": event.index, "mode": event.mode, "distance": event.distance}}

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema.load_state_dict(state["ema"])


class NLPO(KLPenalty):
    """NLPO (Ramamurthy et al. 2022), as the paper ran it through RL4LMs: the policy samples only within the
    top-p set of a delayed *mask model*, which starts as the initial policy and is set to the current policy
    every ``nlpo_update_every`` iterations. The update uses the same masked distribution."""

    def setup(self, policy: PolicyHandle) -> None:
        self.mask_model = copy.deepcopy(policy.model)
        self.mask_model.requires_grad_(False)
        self.mask_model.eval()
        # The policy's trainable tensors and their twins in the mask model, in the same order.
        mask_params = dict(self.mask_model.named_parameters())
        named = [(n, p) for n, p in policy.model.named_parameters() if p.requires_grad]
        self._sources = [p for _, p in named]
        self._targets = [mask_params[n] for n, _ in named]

    def sampling_mask_model(self) -> torch.nn.Module:
        return self.mask_model

    def on_iteration_end(self, step: int) -> dict[str, Any]:
        if step % self.config.nlpo_update_every:
            return {}
        with torch.no_grad():
            torch._foreach_copy_(self._targets, [p.detach() for p in self._sources])
        return {"nlpo/mask_update": 1}

    def state_dict(self) -> dict[str, Any]:
        return {"mask": [t.detach().clone() for t in self._targets]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self._targets, state["mask"])


class Multitask(KLPenalty):
    """Multitask / S2P: a supervised NLL loss on pretraining text, weight λ, added to each optimizer step's loss
    (the paper's Translation Game baseline; Lowe et al. 2021 call it S2P)."""

    def setup(self, policy: PolicyHandle) -> None:
        if not policy.pretrain_texts:
            raise ConfigError("method.name: multitask needs pretraining text, and this task has no pretrain_texts")
        self.texts = list(policy.pretrain_texts)
        self.lm_loss = policy.lm_loss
        self.position = 0

    def extra_loss(self) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.config.multitask_batch
        batch = [self.texts[(self.position + i) % len(self.texts)] for i in range(n)]
        self.position = (self.position + n) % len(self.texts)
        nll = self.lm_loss(batch)
        return self.config.multitask_coef * nll, {"multitask/nll": float(nll.detach())}

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class Frozen(DriftMethod):
    """The policy stays as it was: no update at all. With a learning reward (the Translation Game's listener) this
    is the paper's FROZEN ENGLISH lower bound (§4): only the listener adapts to the frozen speaker."""

    updates_policy = False


METHOD_CLASSES: dict[str, type[DriftMethod]] = {
    "none": DriftMethod,
    "kl": KLPenalty,
    "elastic_reset": EMAReset,
    "reset_to_init": EMAReset,
    "reset_to_ema": EMAReset,
    "ema_only": EMAReset,
    "nlpo": NLPO,
    "multitask": Multitask,
    "frozen": Frozen,
}


def build_method(config: MethodConfig) -> DriftMethod:
    return METHOD_CLASSES[config.name](config)
