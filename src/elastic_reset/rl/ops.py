"""Small, explicit numeric helpers of the RL engine: masked statistics, KL estimators and controllers, GAE,
per-token rewards, the PPO losses, entropies and log-probabilities, RLOO advantages, a REINFORCE baseline.

They follow OpenAI's lm-human-preferences (Ziegler et al. 2019) as reimplemented in PyTorch by Huang et al.
("The N Implementation Details of RLHF with PPO", lm-human-preference-details), CleanRL's PPO, and TRL's PPO.

Conventions (shared by every function here):

- Per-token tensors are ``[B, T]`` over the RESPONSE tokens only (the prompt is not part of them).
- ``mask`` is a ``[B, T]`` float or bool tensor; nonzero marks a real response token. A response may end early
  (EOS); the tokens after it are padding (mask 0), so masks are right-padded: ``1 … 1 0 … 0``. The EOS token
  itself is a real token.
- Padding never contributes to anything: every reduction selects with ``torch.where`` rather than multiplying
  by the mask, so NaN/inf garbage in padded slots cannot leak (``nan * 0`` is ``nan``), and inputs are
  sanitised at padded slots before any ``exp`` so that gradients stay finite too.
- Half-precision inputs (bf16/fp16) are upcast: every result here is at least fp32.
- Errors are ``ValueError("<argument name>: <what is wrong>")``. Shapes, masks and values measured at run time
  (a KL, a mean reward, a checkpoint's state) are checked here; settings (clip ranges, coefficients, decays, γ, λ,
  RLOO's k) are not: the run config (``rl/config.py``) validated them before training started.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "MovingAverageBaseline",
    "gae",
    "high_entropy_mask",
    "kl_estimate",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "reduce_loss",
    "rloo_advantages",
    "token_rewards",
    "value_loss",
    "whiten",
    "whiten_with",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
"""The per-token KL estimators :func:`kl_estimate` knows (Schulman, "Approximating KL divergence", 2020)."""

# --------------------------------------------------------------------------------------------------- helpers
def _float(x: torch.Tensor) -> torch.Tensor:
    """Upcast half precision to fp32 (sums of thousands of bf16 terms lose most of their digits); keep fp32/64."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) or not x.is_floating_point() else x


def _check_same_shape(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)} does not match {ref_name}'s {tuple(ref.shape)}")


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_right_padded(mask: torch.Tensor) -> torch.Tensor:
    """Return the bool mask after checking it is [B, T] and right-padded (no real token after a padded one).

    GAE and :func:`token_rewards` rely on it: the token before the first padded slot is the episode's last.
    (One host sync; these run once per rollout, not per minibatch.)
    """
    if mask.dim() != 2:
        raise ValueError(f"mask: expected a [batch, T] tensor, got shape {tuple(mask.shape)}")
    m = _as_bool(mask)
    if m.shape[1] > 1 and bool((m[:, 1:] & ~m[:, :-1]).any()):
        raise ValueError("mask: expected right padding (1 ... 1 0 ... 0 per row); found a real token after padding")
    return m


def _scalar(name: str, value: Any) -> float:
    """A Python float from a number or a one-element tensor; NaN/inf refused (it would poison the state)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------------ masked statistics
def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ_{mask≠0} x, over all elements (``dim=None``) or along ``dim``.

    Padded slots are dropped with ``torch.where``, so NaN/inf there does not leak (and gets no gradient).
    """
    _check_same_shape("mask", mask, "x", x)
    selected = torch.where(_as_bool(mask), _float(x), 0.0)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ_{mask≠0} x / #{mask≠0}, over all elements (``dim=None``: one token-level mean, as lm-human-preferences
    and TRL average their losses) or along ``dim`` (e.g. ``dim=1``: a per-sequence mean).

    A selection with no real token gives 0, not NaN (its count is clamped to 1): an empty row then adds nothing.
    """
    _check_same_shape("mask", mask, "x", x)
    m = _as_bool(mask)
    total = masked_sum(x, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the real tokens: mean_{mask}((x − mean_{mask} x)²), times n/(n−1) if ``unbiased`` (Bessel).

    As in lm-human-preference-details / TRL's ``masked_var``. Needs n ≥ 2 real tokens when unbiased (n ≥ 1
    otherwise); the check syncs with the device once.
    """
    _check_same_shape("mask", mask, "x", x)
    m = _as_bool(mask)
    n = int(m.sum())
    if n < (2 if unbiased else 1):
        raise ValueError(f"mask: {n} real token(s); the {'unbiased ' if unbiased else ''}variance needs more")
    xf = _float(x)
    mean = masked_mean(xf, m)
    var = masked_mean((xf - mean) ** 2, m)
    return var * (n / (n - 1)) if unbiased else var


def whiten(
    x: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x − μ) / sqrt(σ² + eps) with μ, σ² the masked mean and unbiased variance; plus μ if not ``shift_mean``.

    lm-human-preferences whitens advantages with ``shift_mean=True`` and rewards with ``shift_mean=False``
    (only the scale is normalised, so the reward keeps its sign/level). Padded slots of the result are 0.
    ``mask=None`` whitens over all elements.
    """
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else _as_bool(mask)
    _check_same_shape("mask", m, "x", x)
    # Zero the padding first: NaN there would otherwise reach the gradient through (x − μ)·s (0·NaN = NaN).
    xf = torch.where(m, _float(x), 0.0)
    return whiten_with(xf, m, masked_mean(xf, m), masked_var(xf, m, unbiased=True), shift_mean, eps)


def whiten_with(
    x: torch.Tensor,
    mask: torch.Tensor,
    mean: torch.Tensor | float,
    var: torch.Tensor | float,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """:func:`whiten` with a given mean μ and variance σ²: (x − μ) / sqrt(σ² + eps), plus μ if not ``shift_mean``,
    0 at padding. The data-parallel whitening (``rl/distributed.py``) passes the whole batch's μ and σ²."""
    _check_same_shape("mask", mask, "x", x)
    m = _as_bool(mask)
    xf = torch.where(m, _float(x), 0.0)
    out = (xf - mean) * torch.rsqrt(torch.as_tensor(var + eps, dtype=xf.dtype, device=xf.device))
    if not shift_mean:
        out = out + mean
    # Padding gets 0 rather than a whitened garbage value, so a later unmasked op cannot pick it up by accident.
    return torch.where(m, out, 0.0)


# --------------------------------------------------------------------------------------------------------- KL
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from tokens sampled from π (Schulman, "Approximating KL divergence").

    With log r = ref_logp − logp (r = π_ref(y)/π(y), y ~ π):

    - ``"k1"`` = −log r = logp − ref_logp: unbiased, high variance, can be negative per token. The penalty of
      Ziegler et al. 2019 / lm-human-preferences / TRL's PPO.
    - ``"k2"`` = ½(log r)²: biased, low variance, ≥ 0.
    - ``"k3"`` = (r − 1) − log r: unbiased and ≥ 0 (log r ≤ r − 1), lower variance than k1 when π ≈ π_ref;
      GRPO's penalty. It blows up when π_ref(y) ≫ π(y) (r is exponentiated).

    Returned per token (``[B, T]``), fp32 at least; the caller masks/sums.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator: expected one of {KL_ESTIMATORS}, got {estimator!r}")
    _check_same_shape("ref_logp", ref_logp, "logp", logp)
    log_r = _float(ref_logp) - _float(logp)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    # expm1 keeps the digits of r − 1 when r ≈ 1 (the usual case); the clamp removes the last-ulp negatives of
    # rounding, since the exact value is ≥ 0 (its gradient there, r − 1, is ~0 anyway).
    return (torch.expm1(log_r) - log_r).clamp(min=0.0)


class _KLController:
    """The checkpointable part of a KL controller: its current coefficient β (``value``). Target and horizon are
    configuration and come from the config on resume."""

    value: float

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = _load_coef(state)


class AdaptiveKLController(_KLController):
    """The adaptive KL coefficient β of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences", §2.2), as in lm-human-preferences and TRL:

        e = clip(KL / target − 1, −0.2, 0.2);   β ← β · (1 + e · n_steps / horizon)

    ``KL`` is the measured KL of the last rollout (lm-human-preferences: the per-sequence sum of the k1 estimate,
    averaged over sequences) and ``n_steps`` the number of samples (sequences) it came from. The clip bounds the
    change per update, so β moves at most by a factor (1 ± 0.2·n_steps/horizon).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Move β towards the KL target; returns the new β."""
        kl = _scalar("current_kl", current_kl)
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
            raise ValueError(f"n_steps: expected an integer >= 0, got {n_steps!r}")
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value

    def __repr__(self) -> str:
        return f"AdaptiveKLController(value={self.value:g}, target={self.target:g}, horizon={self.horizon:g})"


class FixedKLController(_KLController):
    """A constant KL coefficient β with :class:`AdaptiveKLController`'s interface (``update`` does nothing)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """No-op (β is fixed); returns β."""
        return self.value

    def __repr__(self) -> str:
        return f"FixedKLController(value={self.value:g})"


class AdaptiveEntropyCoef:
    """TRL's adaptive entropy bonus (``use_adaptive_entropy``): after each optimizer step the coefficient moves by
    ``delta``, up when that step's mean token entropy was at or below ``target`` and down otherwise, within
    [``low``, ``high``]; the bonus (:attr:`applied`) acts only while the last step's entropy was at or below the
    target, so not at the first step."""

    def __init__(self, coef: float, target: float, delta: float, low: float, high: float) -> None:
        self.coef, self.target, self.delta, self.low, self.high = map(float, (coef, target, delta, low, high))
        self.last = math.inf

    @property
    def applied(self) -> float:
        return self.coef if self.last <= self.target else 0.0

    def update(self, entropy: float) -> float:
        """After an optimizer step whose mean token entropy was ``entropy``; returns the new coefficient."""
        up = entropy <= self.target
        self.coef = min(self.coef + self.delta, self.high) if up else max(self.coef - self.delta, self.low)
        self.last = float(entropy)
        return self.coef

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last": self.last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.coef, self.last = float(state["coef"]), float(state["last"])


def _load_coef(state: Mapping[str, Any]) -> float:
    if not isinstance(state, Mapping) or "value" not in state:
        raise ValueError("state: expected a mapping with key 'value' (from state_dict())")
    value = _scalar("state['value']", state["value"])
    if value < 0:
        raise ValueError(f"state['value']: expected a KL coefficient >= 0, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------- rewards and GAE
def token_rewards(score: torch.Tensor, kl_penalty: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards: r_t = −kl_penalty_t, plus the sequence's ``score`` at its LAST real token.

    ``kl_penalty`` is β·KL_t per token, already multiplied by the caller (``[B, T]``); ``score`` is the reward
    model's score per sequence (``[B]``). As in Ziegler et al. 2019 / lm-human-preferences / TRL's PPO: the
    task reward is sparse (end of episode), the KL penalty is dense. Padded slots are 0. Every response needs
    at least one real token (the score must land somewhere).
    """
    m = _check_right_padded(mask)
    _check_same_shape("kl_penalty", kl_penalty, "mask", mask)
    if score.shape != (m.shape[0],):
        raise ValueError(f"score: expected shape ({m.shape[0]},) (one per response), got {tuple(score.shape)}")
    lengths = m.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("mask: a response has no real token, so its score has nowhere to go")
    rewards = torch.where(m, -_float(kl_penalty), 0.0)
    last = (lengths - 1).unsqueeze(1)  # right padding: the last real token is at length − 1
    return rewards.scatter_add(1, last, _float(score).to(rewards.dtype).unsqueeze(1))


@torch.no_grad()
def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over the response tokens, per sequence:

        δ_t = r_t + γ·V_{t+1} − V_t,    A_t = δ_t + γλ·A_{t+1},    returns_t = A_t + V_t

    where the step after a response's last real token is terminal (V = 0, A = 0): responses of different lengths
    in one batch each end at their own last token, and nothing from the padding flows back into them. A response
    cut at the length limit is treated as terminal too, as lm-human-preferences and TRL do (its score is given at
    that last token). A reverse loop over T, vectorised over the batch (CleanRL / lm-human-preference-details).

    Returns ``(advantages, returns)``, ``[B, T]``, fp32 at least, 0 at padded slots, without gradient (they are
    targets). Whitening the advantages (``whiten(adv, mask)``) is the caller's choice.
    """
    m = _check_right_padded(mask)
    _check_same_shape("rewards", rewards, "mask", mask)
    _check_same_shape("values", values, "mask", mask)
    dtype = torch.promote_types(_float(rewards).dtype, _float(values).dtype)
    # Zero the padded slots first: a padded V_{t+1} is then exactly the terminal value 0, and garbage (even NaN)
    # in padding cannot reach a real token.
    r = torch.where(m, rewards.to(dtype), 0.0)
    v = torch.where(m, values.to(dtype), 0.0)
    batch, steps = r.shape
    advantages = torch.zeros_like(r)
    last_gae = torch.zeros(batch, dtype=dtype, device=r.device)
    next_value = torch.zeros(batch, dtype=dtype, device=r.device)
    for t in reversed(range(steps)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        # At a padded slot A = 0, so the last real token starts its own recursion from A_{t+1} = 0.
        last_gae = torch.where(m[:, t], delta + gamma * lam * last_gae, 0.0)
        advantages[:, t] = last_gae
        next_value = v[:, t]
    returns = torch.where(m, advantages + v, 0.0)
    return advantages, returns


# -------------------------------------------------------------------------------------------------- losses
def reduce_loss(per_token: torch.Tensor, mask: torch.Tensor, how: str = "token",
                max_len: int | None = None, step_tokens: float | None = None) -> torch.Tensor:
    """A minibatch's per-token loss ``[B, T]`` as one number (``algo.loss_aggregation``): ``token``, the mean over
    its real tokens (TRL's ``bnpo``); ``batch_token``, the sum over its real tokens / ``step_tokens``, the mean real
    tokens of a minibatch in the whole batch (TRL's ``dapo``: its ``num_items_in_batch`` per optimizer step and
    process); ``sequence``, each row's mean, then the mean over rows (TRL's ``grpo``); ``sum``, each row's sum,
    then the mean over rows (TRL's ``luspo``); ``constant``, the sum / (B × ``max_len``) (TRL's ``dr_grpo``,
    ``max_len`` its ``max_completion_length``). A row with no real token counts as a row of zeros."""
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "batch_token":
        if not step_tokens or step_tokens <= 0:
            raise ValueError(f"step_tokens: expected a positive number of tokens per minibatch, got {step_tokens}")
        return masked_sum(per_token, mask) / step_tokens
    if how == "sequence":
        return masked_mean(per_token, mask, dim=1).mean()
    if how == "sum":
        return masked_sum(per_token, mask, dim=1).mean()
    if how == "constant":
        if not max_len or max_len < 1:
            raise ValueError(f"max_len: expected a positive number of tokens for the constant, got {max_len}")
        return masked_sum(per_token, mask) / (per_token.shape[0] * max_len)
    raise ValueError(f"how: expected token, batch_token, sequence, sum or constant, got {how!r}")


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, share: float,
                      gather: Callable[[torch.Tensor], torch.Tensor] = lambda x: x) -> torch.Tensor:
    """``mask`` (bool) kept only at the tokens whose entropy is among the highest ``share`` of the real tokens': at
    or above the (1 − share) quantile of their entropies (torch's linear interpolation), as TRL's
    ``top_entropy_quantile`` (Wang et al. 2025, "Beyond the 80/20 rule"). ``gather``: the real tokens' entropies
    of every process, so that the quantile is the whole minibatch's."""
    _check_same_shape("mask", mask, "entropy", entropy)
    m = _as_bool(mask)
    values = gather(_float(entropy).detach()[m])
    if values.numel() == 0:
        return torch.zeros_like(m)
    return m & (_float(entropy).detach() >= torch.quantile(values, 1.0 - share))


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, how: str = "token",
                         max_len: int | None = None, step_tokens: float | None = None) -> torch.Tensor:
    """The plain policy gradient's loss, −A·log π per token, reduced by :func:`reduce_loss` (REINFORCE)."""
    _check_same_shape("advantages", advantages, "logp", logp)
    m = _as_bool(mask)
    return reduce_loss(-torch.where(m, _float(advantages).detach(), 0.0) * _float(logp), m, how, max_len, step_tokens)


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
    clip_range_high: float | None = None,
    level: str = "token",
    how: str = "token",
    max_len: int | None = None,
    step_tokens: float | None = None,
    ratio_max: float | None = None,
    surrogate: str = "clip",
    off_policy_mask: float | None = None,
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017), per token, as in lm-human-preference-details / CleanRL:

        ρ = exp(logp − old_logp);   loss = mean_{mask} max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε_high))

    (the max of the negated objectives is the pessimistic min of the objectives; ε_high = ε unless given: DAPO's
    clip-higher; ``ratio_max`` δ caps the unclipped ρ too: INTELLECT-2's two-sided clipping). ``level="sequence"``:
    one ρ per row, exp of its mean token log-ratio (GSPO, TRL's ``importance_sampling_level``), for each of its
    tokens; ``level="sequence_sum"``: the whole sequence's probability ratio, exp of the sum (with ``how="sequence"``
    the loss of TRL's ``RLOOTrainer``). ``how``/``max_len``/``step_tokens``: the reduction (:func:`reduce_loss`;
    ``token`` is the mean above). ``logp`` carries the gradient; ``old_logp`` (from the rollout) and ``advantages``
    are treated as constants. ``surrogate="cispo"`` (MiniMax-M1's CISPO): −sg(min(ρ, ε_high))·A·logp instead, every
    token's gradient kept (``clipfrac``: the share whose ρ is capped; ``clip_range`` and ``ratio_max`` play no part).
    ``surrogate="sapo"`` (SAPO, TRL's ``loss_type: sapo``): −A·σ(τ(ρ − 1))·4/τ, a soft gate in place of the clip,
    τ the first of ``sapo_temperatures`` where A > 0, the second elsewhere (``clipfrac`` 0; no ε plays a part).
    ``surrogate="vespo"`` (VESPO, TRL's ``loss_type: vespo``): −sg(φ(w))·A·logp, φ(w) = e^λ·w^k·e^(−λw) of the
    whole sequence's ratio w, (k, λ) the first or the last two of ``vespo`` as A ≥ 0 or not.
    ``off_policy_mask`` δ (rows of one advantage each): a row with a negative advantage whose mean token
    log π_old − log π_θ exceeds δ adds nothing to the loss, its tokens still counted by the reduction
    (DeepSeek-V3.2's off-policy sequence mask, TRL's ``off_policy_mask_threshold``; ``masked``: the share of rows
    dropped).

    Stats (detached 0-dim tensors, so that logging syncs once, where the caller chooses):
    ``clipfrac``: share of real tokens where the clipped term is the one used (strictly larger);
    ``approx_kl``: mean_{mask} of k3 = (ρ − 1) − log ρ per token, an estimate of KL(π_old ‖ π_θ) (CleanRL's);
    ``ratio_mean``: mean_{mask} ρ.
    """
    _check_same_shape("old_logp", old_logp, "logp", logp)
    _check_same_shape("advantages", advantages, "logp", logp)
    _check_same_shape("mask", mask, "logp", logp)
    m = _as_bool(mask)
    # Sanitise padding before exp: a huge padded log-ratio would give inf, and inf·0 = NaN in the backward pass.
    log_ratio = torch.where(m, _float(logp) - _float(old_logp).detach(), 0.0)
    adv = torch.where(m, _float(advantages).detach(), 0.0)
    if level == "sequence":
        ratio = torch.exp(masked_mean(log_ratio, m, dim=1))[:, None].expand_as(log_ratio)
    elif level == "sequence_sum":
        ratio = torch.exp(masked_sum(log_ratio, m, dim=1))[:, None].expand_as(log_ratio)
    elif level == "token":
        ratio = torch.exp(log_ratio)
    else:
        raise ValueError(f"level: expected token, sequence or sequence_sum, got {level!r}")
    high = clip_range if clip_range_high is None else clip_range_high
    keep = torch.ones_like(log_ratio[:, :1])
    if off_policy_mask is not None:  # a row's advantage is one number (a token's may be zeroed: its sum's sign)
        gone = masked_mean(-log_ratio.detach(), m, dim=1) > off_policy_mask
        keep = (~(gone & (masked_sum(adv, m, dim=1) < 0))).float()[:, None]
    if surrogate == "cispo":  # the capped ratio weighs REINFORCE's term as a constant (an advantage): none cut off
        loss = policy_gradient_loss(logp, adv * keep * ratio.clamp(max=high), m, how, max_len, step_tokens)
        clipped = ratio > high
    elif surrogate == "sapo":  # its gradient, A·ρ·σ'(τ(ρ − 1))·4, is A·ρ at ρ = 1 and fades smoothly away from it
        tau = torch.where(adv > 0, *(torch.tensor(t, dtype=adv.dtype, device=adv.device) for t in sapo_temperatures))
        loss = reduce_loss(-adv * torch.sigmoid(tau * (ratio - 1)) * 4 / tau * keep, m, how, max_len, step_tokens)
        clipped = torch.zeros_like(m)
    elif surrogate == "vespo":  # a gamma-shaped weight of the whole sequence's ratio, as a constant (no gradient)
        log_w = masked_sum(log_ratio.detach().clamp(-20.0, 20.0), m, dim=1).clamp(math.log(1e-8), 20.0)[:, None]
        positive = masked_sum(adv, m, dim=1)[:, None] >= 0
        k = torch.where(positive, vespo[0], vespo[2])
        lam = torch.where(positive, vespo[1], vespo[3]).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        loss = policy_gradient_loss(logp, adv * keep * phi, m, how, max_len, step_tokens)
        clipped = torch.zeros_like(m)
    elif surrogate == "clip":
        pg_losses = -adv * (ratio if ratio_max is None else ratio.clamp(max=ratio_max))
        pg_losses_clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + high)
        loss = reduce_loss(torch.maximum(pg_losses, pg_losses_clipped) * keep, m, how, max_len, step_tokens)
        clipped = pg_losses_clipped > pg_losses
    else:
        raise ValueError(f"surrogate: expected clip, cispo, sapo or vespo, got {surrogate!r}")
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clipped.float(), m),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
            **({"masked": 1.0 - keep.mean()} if off_policy_mask is not None else {}),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped value loss of lm-human-preferences / CleanRL / TRL:

        V_clip = old_values + clip(values − old_values, −ε, ε)
        loss = ½ · mean_{mask} max((values − R)², (V_clip − R)²)

    ``clip_range_value=None`` disables clipping: ½ · mean_{mask} (values − R)². ``old_values`` (from the rollout)
    and ``returns`` are constants. Stats: ``vf_clipfrac``, the share of real tokens where the clipped loss is
    strictly larger (the one used), a detached 0-dim tensor.
    """
    _check_same_shape("old_values", old_values, "values", values)
    _check_same_shape("returns", returns, "values", values)
    _check_same_shape("mask", mask, "values", values)
    m = _as_bool(mask)
    v = torch.where(m, _float(values), 0.0)
    target = torch.where(m, _float(returns).detach(), 0.0)
    losses = (v - target) ** 2
    if clip_range_value is None:
        loss = 0.5 * masked_mean(losses, m)
        return loss, {"vf_clipfrac": torch.zeros((), dtype=loss.dtype, device=loss.device)}
    eps = float(clip_range_value)
    v_old = torch.where(m, _float(old_values).detach(), 0.0)
    v_clipped = v_old + torch.clamp(v - v_old, -eps, eps)
    losses_clipped = (v_clipped - target) ** 2
    loss = 0.5 * masked_mean(torch.maximum(losses, losses_clipped), m)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((losses_clipped > losses).float(), m)}
    return loss, stats


# ------------------------------------------------------------------------------------ RLOO and REINFORCE
def group_normalized_sum(parts: torch.Tensor, weights: Sequence[float], k: int) -> torch.Tensor:
    """GDPO's reward (Liu et al. 2026; TRL's ``multi_objective_aggregation: normalize_then_sum``): each reward (a
    column of ``parts`` ``[B, F]``, NaN where it gave none) normalised within each group of ``k`` contiguous samples,
    (x − mean) / (std + 1e-4) over the group's samples that have it (std unbiased, as TRL's ``nanstd``), then
    summed with ``weights`` skipping NaN; a sample with no reward at all stays NaN. A reward constant within a
    group, or given by one sample of it, adds 0 there."""
    if parts.dim() != 2 or parts.shape[1] != len(weights):
        raise ValueError(f"parts: expected [samples, {len(weights)} rewards], got shape {tuple(parts.shape)}")
    if parts.shape[0] % k:
        raise ValueError(f"k: {parts.shape[0]} samples are not a whole number of groups of k={k}")
    x = _float(parts).view(-1, k, parts.shape[1])
    mean = torch.nanmean(x, dim=1, keepdim=True)
    count = (~x.isnan()).sum(dim=1, keepdim=True)
    var = torch.nansum((x - mean) ** 2, dim=1, keepdim=True) / (count - 1).clamp(min=1)
    z = torch.nan_to_num((x - mean) / (var.sqrt() + 1e-4), nan=0.0).view_as(parts)
    total = (z * torch.tensor(weights, dtype=z.dtype, device=z.device)).sum(dim=1)
    return torch.where(parts.isnan().all(dim=1), torch.nan, total)


def rloo_advantages(scores: torch.Tensor, k: int, baseline: str = "leave_one_out") -> torch.Tensor:
    """Advantages against a baseline from the other samples of the same prompt. ``leave_one_out`` (REINFORCE
    leave-one-out: Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"; unbiased, the baseline excludes the
    sample):

        A_i = s_i − 1/(k − 1) · Σ_{j≠i} s_j   (j over the other samples of the same prompt)
            = k/(k − 1) · (s_i − mean_j s_j)

    ``group_mean`` (GRPO's, Shao et al. 2024, and TRL's ``GRPOTrainer``): A_i = s_i − mean_j s_j, the sample's own
    score in the mean.

    ``scores`` is ``[B]`` with B = n_prompts·k and the k samples of each prompt CONTIGUOUS (as produced by
    ``prompts.repeat_interleave(k, dim=0)``).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores: expected a 1-D tensor [n_prompts * k], got shape {tuple(scores.shape)}")
    if scores.shape[0] % k != 0:
        raise ValueError(f"k: {scores.shape[0]} scores are not a whole number of groups of k={k}")
    if baseline not in ("leave_one_out", "group_mean"):
        raise ValueError(f"baseline: expected leave_one_out or group_mean, got {baseline!r}")
    s = _float(scores).view(-1, k)
    if baseline == "group_mean":
        return (s - s.mean(dim=1, keepdim=True)).reshape(-1)
    return (s - (s.sum(dim=1, keepdim=True) - s) / (k - 1)).reshape(-1)


class MovingAverageBaseline:
    """An exponential moving average of the mean reward, the baseline of REINFORCE (Williams 1992):

        b ← decay · b + (1 − decay) · mean_reward

    ``value`` is ``None`` until the first :meth:`update`, which sets b to that batch's mean exactly (no zero
    start, hence no bias towards 0 to correct, unlike an EMA initialised at 0). The caller decides what the
    first batch uses: its own mean (typical: ``b = baseline.value if baseline.value is not None else
    rewards.mean()``) or 0. Use the baseline before updating it with the current batch, so that it does not
    depend on the samples it is subtracted from.
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = float(decay)
        self.value: float | None = None
        self.num_updates = 0

    def update(self, batch_mean_reward: float | torch.Tensor) -> float:
        """Fold one batch's mean reward in; returns the new baseline."""
        r = _scalar("batch_mean_reward", batch_mean_reward)
        self.value = r if self.value is None else self.decay * self.value + (1.0 - self.decay) * r
        self.num_updates += 1
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or "value" not in state:
            raise ValueError("state: expected a mapping with key 'value' (from state_dict())")
        value = state["value"]
        self.value = None if value is None else _scalar("state['value']", value)
        self.num_updates = int(state.get("num_updates", 0 if value is None else 1))

    def __repr__(self) -> str:
        return f"MovingAverageBaseline(decay={self.decay:g}, value={self.value!r})"
