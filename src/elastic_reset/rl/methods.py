"""Drift-control methods as small pieces that hook into one training loop.

The loop calls, in order: ``setup`` once; per iteration ``sampling_mask`` (NLPO) before the rollout;
``extra_loss`` inside each optimizer step (multitask); ``on_gradients`` once the step's gradients are in ``.grad``
and before clipping and the optimizer step (gradient regularisation); ``on_optimizer_step`` after each optimizer step;
``on_epoch_end`` after each pass over the rollout batch; ``on_batch`` once the update is done, with the kept samples
(a reward that learns); ``on_iteration_end`` once the iteration is done. A method sees the trainer only through
:class:`PolicyHandle` (the policy, its optimizer, the task's pretraining text and an NLL function), given at
``setup``, and the trainer sees a method only through these hooks and its capability flags (``uses_kl``,
``updates_policy``, ``keeps_ema``), from which the run config's rules are derived too. What combines with any method
(Selective Rehearsal, a reward that learns) is a component (``rl/components.py``) on the same :class:`LoopHooks`.

Each method has its own config class (its ``Config``), beside it here: the run config's ``method`` section is the
union of them, chosen by ``method.name``. A new method is a subclass with its ``Config`` and one line in
:data:`METHOD_CLASSES`, not flags scattered through the loop and the config.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from elastic_reset.core import Anchor, ElasticReset, KLBudget, Plateau, ResetEvent
from elastic_reset.errors import ConfigError
from elastic_reset.rl.sections import Section


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


@dataclass
class SamplingMask:
    """NLPO's restriction of sampling: only tokens within ``model``'s top-``top_p`` set (at least
    ``min_tokens_to_keep`` of them)."""

    model: torch.nn.Module
    top_p: float
    min_tokens_to_keep: int


class LoopHooks:
    """The loop's hooks, in the order it calls them (the module's docstring); each does nothing here. A run's method
    and its components (``rl/components.py``) are called in turn, the method first."""

    def extra_loss(self) -> tuple[torch.Tensor, dict[str, float]] | None:
        """A term added to each forward's loss of an optimizer step, and its statistics; None: none."""
        return None

    def on_optimizer_step(self) -> None:
        pass

    def on_batch(self, prompts: list[str], completions: list[str]) -> dict[str, float]:
        """Called once the iteration's update is done, with its kept samples; returns entries for its metrics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class DriftMethod(LoopHooks):
    """The base of every drift-control method: its hooks do nothing, its flags say what the loop must do."""

    Config: ClassVar[type[Section]]
    """The method's settings (the ``method`` section of a run config whose ``name`` is one of its names)."""

    uses_kl = True
    """Whether the KL penalty enters the reward (method ``none`` runs β = 0 whatever ``kl.coef`` says)."""
    updates_policy = True
    """Whether the policy is updated at all (``frozen``: no, only a learning reward learns)."""
    keeps_ema = False
    """Whether the method keeps an EMA of the policy: it is then evaluated (``eval_ema/*``) and may be the KL
    reference (``kl.reference: ema``) through :meth:`ema_weights`."""

    def __init__(self, config: Section):
        self.config = config

    def setup(self, policy: PolicyHandle) -> None:
        pass

    def sampling_mask(self) -> SamplingMask | None:
        return None

    def on_gradients(self, params: list[torch.nn.Parameter], recompute: Callable[[], None]) -> dict[str, float]:
        """Called with the step's gradients in ``params``' ``.grad`` (averaged over ranks), before clipping and the
        optimizer step; may rewrite them. ``recompute()`` runs the step's loss again at the parameters' current
        values on the same samples (the extra loss drawn again) and leaves its gradients in ``.grad``. Returns
        entries for the step's statistics."""
        return {}

    def on_epoch_end(self) -> None:
        pass

    def on_iteration_end(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Called after iteration ``step`` (1-based) with its metrics so far and those of the latest evaluation
        not seen yet (``eval/...``); returns entries for its metrics record."""
        return {}

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """The policy holds the EMA weights inside the block (methods with ``keeps_ema``)."""
        raise ConfigError(f"method.name: {self.config.name!r} keeps no EMA of the policy")
        yield  # pragma: no cover

    def kl_reference(self) -> contextlib.AbstractContextManager | None:
        """A block in which the policy holds the method's own KL reference weights, or None: the run's
        (``kl.reference``)."""
        return None


@dataclass
class NoControlConfig(Section):
    name: Literal["none"] = "none"
    """Plain RL: no KL penalty in the reward (whatever ``kl.coef`` says), no resets."""


class NoControl(DriftMethod):
    """Plain RL: no KL penalty in the reward, no resets (method ``none``)."""

    Config = NoControlConfig
    uses_kl = False


@dataclass
class KLPenaltyConfig(Section):
    name: Literal["kl"] = "kl"
    """The KL penalty of the ``kl`` section alone (paper eq. 1)."""


class KLPenalty(DriftMethod):
    """The standard baseline: a KL penalty to the reference in the reward (paper eq. 1)."""

    Config = KLPenaltyConfig


@dataclass
class EMAResetConfig(Section):
    name: Literal["elastic_reset", "reset_to_init", "reset_to_ema", "ema_only"] = "elastic_reset"
    """``elastic_reset`` (paper §3), or an ablation (§6): ``reset_to_init``, ``reset_to_ema``, ``ema_only``."""
    decay: Annotated[float, Field(gt=0, lt=1)] = 0.995
    """EMA decay η."""
    reset_every: PositiveInt = 17
    """Reset every this many training iterations (the ``step`` of metrics.jsonl); never at step 0."""
    ema_update: Literal["step", "epoch", "iteration"] = "step"
    """When the EMA is updated: ``step`` (every optimizer step, the paper's text), ``epoch`` (every pass over the
    rollout batch, the authors' StackLLaMA code), or ``iteration`` (once per rollout, the authors' IMDB code)."""
    ema_device: Literal["cpu", "model"] = "cpu"
    """Where the EMA and θ0 live: ``cpu`` (the paper's choice, §2 and §8: cheap, no GPU memory; pinned, with
    asynchronous copies, when the policy is on a GPU) or ``model`` (the policy's device: no transfers)."""
    reset_optimizer: bool = False
    """Also drop the optimizer state of reset weights (the authors' code keeps it)."""


@dataclass
class AnchorMethodConfig(Section):
    name: Literal["anchor"] = "anchor"
    """One of the anchor family (``core/anchor.py``), on top of the KL penalty."""
    preset: Literal["elastic_reset", "reset_to_ema", "reset_to_init", "ref_sync", "ref_reset", "ema_anchor",
                    "liti"] = "ref_sync"
    """The published method: ``elastic_reset`` and its ablations ``reset_to_ema``, ``reset_to_init`` (Noukhovitch
    et al. 2023); ``ref_sync`` (TR-DPO: the KL reference ← α·θ + (1 − α)·reference); ``ref_reset`` (ProRL: reference
    ← θ and the optimizer's state dropped); ``ema_anchor`` (the KL to an EMA of the policy: WARP, EMA-PG); ``liti``
    (WARP: θ0 ← (1 − η)·θ0 + η·θ, then θ ← θ0)."""
    every: PositiveInt | None = 17
    """Pull every this many iterations; None to pull on ``kl_budget`` or ``plateau`` instead."""
    kl_budget: PositiveFloat | None = None
    """Pull when the iteration's ``kl`` (to the KL reference) exceeds this, at most once every ``cooldown``
    iterations."""
    cooldown: PositiveInt = 1
    """Iterations between two pulls of ``kl_budget``."""
    plateau: PositiveInt | None = None
    """Pull when ``eval/reward`` has not improved for this many evaluations (at the end of the iteration after the
    evaluation that shows it)."""
    alpha: Annotated[float, Field(ge=0, le=1)] = 0.6
    """``ref_sync``'s α (TR-DPO, TRL's default 0.6; 1 is the hard update)."""
    eta: Annotated[float, Field(ge=0, le=1)] = 0.5
    """``liti``'s η, the step of θ0 towards θ."""
    decay: Annotated[float, Field(gt=0, lt=1)] = 0.995
    """EMA decay (``elastic_reset``, ``reset_to_ema``, ``ema_anchor``), updated once per iteration."""
    ema_device: Literal["cpu", "model"] = "cpu"
    """Where the copies live (as Elastic Reset's ``ema_device``)."""


class AnchorMethod(KLPenalty):
    """The anchor family in the engine (:class:`~elastic_reset.core.Anchor`), the one drift method class that runs
    any preset (Elastic Reset's face, :class:`EMAReset`, too): its pulls count iterations, its triggers read the
    iteration's metrics, and a preset whose KL reference is its own copy (``ref_sync``, ``ref_reset``: the
    reference copy; ``ema_anchor``: the EMA) is swapped into the policy for the reference forward. With LoRA the
    anchor covers the adapters, so the reference is the base with the reference adapters: a hard copy is exact, a
    soft mix (α < 1) mixes A and B separately, which is not the mix of the products B·A."""

    Config = AnchorMethodConfig
    STATE_KEY = "anchor"
    """The key of the anchor's state in the method's checkpoint entry."""
    anchor: Anchor

    def setup(self, policy: PolicyHandle) -> None:
        self.anchor = self.build(policy)

    def build(self, policy: PolicyHandle) -> Anchor:
        c = self.config
        trigger = (KLBudget(c.kl_budget, "kl", c.cooldown) if c.kl_budget is not None else
                   Plateau("eval/reward", c.plateau) if c.plateau is not None else None)
        settings: dict[str, Any] = {
            "device": "cpu" if c.ema_device == "cpu" else next(policy.model.parameters()).device,
            **({"trigger": trigger} if trigger is not None else {"every": c.every} if c.preset != "ema_anchor"
               else {}),
            **({"decay": c.decay} if c.preset in ("elastic_reset", "reset_to_ema", "ema_anchor") else {}),
            **({"alpha": c.alpha} if c.preset == "ref_sync" else {"eta": c.eta} if c.preset == "liti" else {}),
            **({"optimizer": policy.optimizer} if c.preset == "ref_reset" else {}),
        }
        return Anchor.preset(c.preset, policy.model, **settings)

    def on_iteration_end(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        event = self.anchor.step(metrics)
        if event is None:
            return {}
        return {"reset": {"index": event.index, "mode": event.mode, "cause": event.cause,
                          "distance": event.distance}}

    def kl_reference(self) -> contextlib.AbstractContextManager | None:
        reference = self.anchor.kl_reference
        return None if reference == "init" else self.anchor.weights(reference)

    def state_dict(self) -> dict[str, Any]:
        return {self.STATE_KEY: self.anchor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.anchor.load_state_dict(state[self.STATE_KEY])


class EMAReset(AnchorMethod):
    """Elastic Reset and its ablations (paper §3, §6 "Ablations"), on top of the KL penalty: the anchor family's
    method with the paper's settings (:class:`~elastic_reset.core.ElasticReset`, an anchor preset by mode).

    ``method.ema_update`` chooses the EMA's clock: every optimizer step (the paper's text), every epoch over the
    rollout batch (the authors' StackLLaMA code) or once per iteration (the authors' IMDB code: there η^17 ≈ 0.92
    of θ0 remains in the EMA at a reset, so a reset lands close to the initial model). Resets always count
    iterations (``method.reset_every``). The value head is excluded: the value function is never reset (§6,
    Appendix E.1).
    """

    Config = EMAResetConfig
    STATE_KEY = "ema"
    MODE = {"elastic_reset": "elastic", "reset_to_ema": "ema", "reset_to_init": "init", "ema_only": "none"}
    keeps_ema = True
    anchor: ElasticReset

    def build(self, policy: PolicyHandle) -> ElasticReset:
        c = self.config
        return ElasticReset(
            policy.model, decay=c.decay, mode=self.MODE[c.name],
            reset_every=None if c.name == "ema_only" else c.reset_every,
            optimizer=policy.optimizer, reset_optimizer_state=c.reset_optimizer,
            device="cpu" if c.ema_device == "cpu" else next(policy.model.parameters()).device,
        )

    @property
    def ema(self) -> ElasticReset:
        """The EMA / reset controller (paper §3)."""
        return self.anchor

    def on_optimizer_step(self) -> None:
        if self.config.ema_update == "step":
            self.anchor.update()

    def on_epoch_end(self) -> None:
        if self.config.ema_update == "epoch":
            self.anchor.update()

    def on_iteration_end(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        event: ResetEvent | None = self.ema.step(update_ema=self.config.ema_update == "iteration")
        if event is None:
            return {}
        return {"reset": {"index": event.index, "mode": event.mode, "distance": event.distance}}

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        with self.anchor.ema_weights():
            yield


@dataclass
class NLPOConfig(Section):
    name: Literal["nlpo"] = "nlpo"
    """NLPO (Ramamurthy et al. 2022), as the paper ran it through RL4LMs."""
    nlpo_top_p: Annotated[float, Field(gt=0, le=1)] = 0.9
    """The policy samples only within the mask model's top-p set (RL4LMs ``top_mask``)."""
    nlpo_min_tokens: PositiveInt = 100
    """The mask set keeps at least this many tokens (RL4LMs ``min_tokens_to_keep``)."""
    nlpo_update_every: PositiveInt = 50
    """The mask model is set to the policy every this many iterations."""


class NLPO(KLPenalty):
    """NLPO (Ramamurthy et al. 2022), as the paper ran it through RL4LMs: the policy samples only within the
    top-p set of a delayed *mask model*, which starts as the initial policy and is set to the current policy
    every ``nlpo_update_every`` iterations. The update uses the same masked distribution."""

    Config = NLPOConfig

    def setup(self, policy: PolicyHandle) -> None:
        self.mask_model = copy.deepcopy(policy.model)
        self.mask_model.requires_grad_(False)
        self.mask_model.eval()
        # The policy's trainable tensors and their twins in the mask model, in the same order.
        mask_params = dict(self.mask_model.named_parameters())
        named = [(n, p) for n, p in policy.model.named_parameters() if p.requires_grad]
        self._sources = [p for _, p in named]
        self._targets = [mask_params[n] for n, _ in named]

    def sampling_mask(self) -> SamplingMask:
        return SamplingMask(self.mask_model, self.config.nlpo_top_p, self.config.nlpo_min_tokens)

    def on_iteration_end(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
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


@dataclass
class MultitaskConfig(Section):
    name: Literal["multitask"] = "multitask"
    """Multitask / S2P: RL plus a supervised loss on the task's pretraining text."""
    multitask_coef: NonNegativeFloat = 1.0
    """Weight λ of the supervised NLL loss on pretraining text."""
    multitask_batch: PositiveInt = 4
    """Pretraining texts per optimizer step."""


class Multitask(KLPenalty):
    """Multitask / S2P: a supervised NLL loss on pretraining text, weight λ, added to each optimizer step's loss
    (the paper's Translation Game baseline; Lowe et al. 2021 call it S2P)."""

    Config = MultitaskConfig

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


@dataclass
class SelectiveRehearsalConfig(Section):
    name: Literal["selective_rehearsal"] = "selective_rehearsal"
    """PPO + KL with Selective Rehearsal (paper 2 §3.2): the run config's ``rehearsal`` section (its defaults when
    absent); any other method takes that section too (Elastic Reset + rehearsal)."""


class SelectiveRehearsal(KLPenalty):
    """The KL penalty plus Selective Rehearsal, which the trainer runs from the ``rehearsal`` section
    (``rl/rehearsal.py``): a name for the paper's PPO-SR in grids and figures."""

    Config = SelectiveRehearsalConfig


@dataclass
class FrozenConfig(Section):
    name: Literal["frozen"] = "frozen"
    """The policy never updates, while a learning reward still learns from its samples (paper §4)."""


class Frozen(DriftMethod):
    """The policy stays as it was: no update at all. With a learning reward (the Translation Game's listener) this
    is the paper's FROZEN ENGLISH lower bound (§4): only the listener adapts to the frozen speaker."""

    Config = FrozenConfig
    uses_kl = False
    updates_policy = False


@dataclass
class GradientRegularizationConfig(Section):
    name: Literal["gradient_reg"] = "gradient_reg"
    """Gradient regularisation (Ackermann, Noukhovitch, Ishida, Sugiyama 2026, arXiv 2602.18037): the loss plus
    γ/2·‖∇L‖², on top of the ``kl`` section's penalty (``kl.coef: 0``: GR alone, as that paper's runs)."""
    strength: NonNegativeFloat = 1e-2
    """γ, the penalty's weight (the paper's RLHF script: 1e-2; 0 is the plain update, bit for bit)."""
    eps: PositiveFloat = 1e-3
    """ε, the finite-difference step along the gradient (their default 1e-3)."""
    g1_clip: PositiveFloat = 10.0
    """The gradient at θ is clipped to this norm before the perturbation and the combination (theirs: 10)."""
    g2_clip: PositiveFloat = 10.0
    """The gradient at the perturbed weights likewise (theirs: 10)."""


class GradientRegularization(KLPenalty):
    """Gradient regularisation with a forward finite difference (Ackermann et al. 2026, after Karakida et al. 2023).

    The objective is L(θ) + γ/2·‖∇L(θ)‖², whose gradient g + γ·H·g (H the Hessian of L, g = ∇L) is estimated
    without a Hessian: g₁ = ∇L(θ), g₂ = ∇L(θ + ε·g₁) on the *same* sampled actions and advantages (the rollout is
    not drawn again), then g₁ + (γ/ε)·(g₂ − g₁). One more forward and backward per optimizer step. As the authors'
    TRL code: both gradients are clipped (``g1_clip``, ``g2_clip``), the perturbation is done in fp32, and the
    input and output embeddings are left out of the penalty (they keep g₁; the authors' code leaves them g₂); a
    value head keeps g₁ too (the penalty is on the policy). With LoRA only the adapters are trained, so only they
    are perturbed. The KL penalty, if any, is in the reward as for ``kl``.
    """

    Config = GradientRegularizationConfig

    def setup(self, policy: PolicyHandle) -> None:
        model = policy.model
        left_out = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings())
                    if m is not None and isinstance(getattr(m, "weight", None), torch.nn.Parameter)}
        self.penalised = {id(p) for p in model.parameters() if p.requires_grad and id(p) not in left_out}

    def on_gradients(self, params: list[torch.nn.Parameter], recompute: Callable[[], None]) -> dict[str, float]:
        c = self.config
        if c.strength == 0:
            return {}
        params = [p for p in params if p.grad is not None]
        g1 = [p.grad.detach().clone() for p in params]
        g1_norm = _clip_(g1, c.g1_clip)
        moved = [(p, g) for p, g in zip(params, g1) if id(p) in self.penalised]
        theta = [p.detach().clone() for p, _ in moved]
        with torch.no_grad():
            torch._foreach_add_([p for p, _ in moved], [g.to(p.dtype) for p, g in moved], alpha=c.eps)
        try:
            recompute()
            g2 = [torch.zeros_like(g) if p.grad is None else p.grad.detach().clone() for p, g in zip(params, g1)]
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in moved], theta)
        g2_norm = _clip_(g2, c.g2_clip)
        for p, a, b in zip(params, g1, g2):
            if id(p) in self.penalised:
                a.add_(b - a, alpha=c.strength / c.eps)
            p.grad = a
        return {"grad_reg/g1_norm": g1_norm, "grad_reg/g2_norm": g2_norm}


def _clip_(grads: list[torch.Tensor], max_norm: float) -> float:
    """Scale ``grads`` in place to a total norm of at most ``max_norm``; returns the norm before."""
    norm = torch.nn.utils.get_total_norm(grads)
    scale = max_norm / (float(norm) + 1e-6)
    if scale < 1:
        torch._foreach_mul_(grads, scale)
    return float(norm)


_CLASSES: list[type[DriftMethod]] = [NoControl, KLPenalty, EMAReset, AnchorMethod, NLPO, Multitask,
                                      SelectiveRehearsal, Frozen, GradientRegularization]
"""Every method; a new one is one more entry."""

METHOD_CLASSES: dict[str, type[DriftMethod]] = {
    name: cls for cls in _CLASSES for name in typing.get_args(typing.get_type_hints(cls.Config)["name"])}
"""``method.name`` → its class (a class may serve several names: Elastic Reset's ablations)."""
METHODS: tuple[str, ...] = tuple(METHOD_CLASSES)

MethodConfig = Annotated[Union[tuple(cls.Config for cls in _CLASSES)], Field(discriminator="name")]
"""The ``method`` section of a run config: the config of the method ``name`` names."""


def method_keys() -> dict[str, set[str]]:
    """``method.name`` → the keys of its config (to tell another method's setting from a typo)."""
    return {name: {f.name for f in dataclasses.fields(cls.Config)} for name, cls in METHOD_CLASSES.items()}


def build_method(config: Section) -> DriftMethod:
    return METHOD_CLASSES[config.name](config)
