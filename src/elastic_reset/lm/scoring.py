"""Teacher-forced scoring: log-probs, entropies and hidden states of given responses, in one forward.

The bottom of the package's model code: the RL engine (the policy update, the KL reference) and the drift metrics
(perplexity) both score text through here. :func:`forward_response` is the teacher-forced twin of
:func:`elastic_reset.rl.sampling.sample` (with grad, for the update): for a model without dropout its ``logprobs``
equal the sampler's (fp32; bf16 autocast agrees to bf16 noise), under the same distribution: the policy at
temperature T, before any truncation, or NLPO's masked distribution when an action mask is given.
:func:`token_nll` (one batch, per token) and :func:`sequence_nll` (batched, per text) are the one teacher-forced
NLL of given text: perplexity, the multitask loss, pretraining and the Translation Game's listener all use them.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch

# resolve_device lives in lm.device; importable from here too, where the RL engine has always found it.
from elastic_reset.lm.device import resolve_device as resolve_device
from elastic_reset.lm.rollout import Rollout

NEG_INF = float("-inf")


@dataclass
class ResponseOutput:
    """What :func:`forward_response` returns, one entry per response token."""

    logprobs: torch.Tensor
    """``[B, Tr]`` float32, with grad: log-prob of each response token at temperature T (under the masked
    distribution if an action mask was given); 0 at padding."""
    entropy: torch.Tensor
    """``[B, Tr]`` float32: entropy of the same distribution at each position; 0 at padding. Without grad unless
    ``entropy_grad=True`` (for an entropy bonus)."""
    hidden: torch.Tensor | None = None
    """``[B, Tr, H]``: the last hidden state at the position that PREDICTS each response token, so a value head on
    it gives V(s_t) for the state before token t. Only with ``return_hidden=True``."""
    logits: torch.Tensor | None = None
    """``[B, Tr, V]`` float32 logits (divided by T, masked if an action mask was given). Only with
    ``return_logits=True`` (B × Tr × V floats: large for a big vocabulary)."""


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore padding: ``cumsum(mask) − 1`` (padding positions get 1, as Hugging Face does)."""
    mask = mask.long()
    return (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)


def unwrap_model(model):
    get_base = getattr(model, "get_base_model", None)  # peft's PeftModel
    return get_base() if callable(get_base) else model


def is_encoder_decoder(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


_KEEP_CACHE: dict[type, bool] = {}


def accepts_logits_to_keep(model) -> bool:
    cls = type(unwrap_model(model))
    if cls not in _KEEP_CACHE:
        try:
            _KEEP_CACHE[cls] = "logits_to_keep" in inspect.signature(unwrap_model(model).forward).parameters
        except (TypeError, ValueError):
            _KEEP_CACHE[cls] = False
    return _KEEP_CACHE[cls]


def contiguous_head_input(model) -> None:
    """Give the model's output head (the LM head) contiguous inputs, with a forward pre-hook. Idempotent.

    transformers slices the hidden states before the head (``logits_to_keep``: the response positions only); a
    sliced 3-D input is not contiguous, and ``F.linear`` then multiplies by the weight expanded per sequence, as a
    batched matmul, instead of one matmul, which is slower for a large head (see BENCHMARKS.md). The copy
    (B x T x hidden) is small next to the head.
    """
    head = model.get_output_embeddings()
    if head is None or getattr(head, "_contiguous_input_hook", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    head._contiguous_input_hook = True


def device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def autocast(model, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on the model's device type; a no-op context for ``dtype=None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_of(model).type, dtype=dtype)


def decoder_start_id(model) -> int:
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if start is None:
        raise ValueError("encoder-decoder model has no decoder_start_token_id in its config or generation_config")
    return int(start)


def check_query(model, query_ids: torch.Tensor, query_mask: torch.Tensor) -> None:
    if query_ids.ndim != 2 or query_mask.shape != query_ids.shape:
        raise ValueError(f"query_ids and query_mask: expected two [B, Tq] tensors, got shapes "
                         f"{tuple(query_ids.shape)} and {tuple(query_mask.shape)}")
    if query_ids.shape[1] == 0 or bool((query_mask.sum(-1) == 0).any()):
        raise ValueError("query_mask: every prompt needs at least one token (start decoder-only prompts with BOS)")
    if not is_encoder_decoder(model) and not bool(query_mask[:, -1].bool().all()):
        raise ValueError("query_ids: decoder-only prompts must be LEFT-padded (the last column of query_mask is 0)")


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)`` at ``token_ids``, position by position: ``[..., V]`` and ``[...]`` give ``[...]``.

    One fused cross-entropy, forward and backward: several times faster than logsumexp − gather on a CPU (see
    BENCHMARKS.md)."""
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, -2), token_ids.flatten(), reduction="none")
    return -nll.view_as(token_ids)


def pad_rows(rows: list[list[int]], pad_token_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as one ``[B, T]`` batch padded on ``side`` (``right`` or ``left``) and its attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def right_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as one right-padded ``[B, T]`` batch and its attention mask."""
    return pad_rows(rows, pad_token_id, "right")


def _decoder_batch(tokenizer, texts, max_tokens: int, prepend_bos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder-only batch: ``[B, T]`` ids and attention mask, padded on the tokenizer's side."""
    if isinstance(texts, torch.Tensor):  # a block of token ids, no padding
        ids = texts.long()
        return ids, torch.ones_like(ids)
    if all(isinstance(t, str) for t in texts):
        rows = tokenizer([t + tokenizer.eos_token for t in texts], truncation=True, max_length=max_tokens,
                         add_special_tokens=False)["input_ids"]
    elif all(isinstance(t, (list, tuple)) and all(isinstance(i, int) for i in t) for t in texts):
        rows = [list(t) for t in texts]
    else:
        raise ValueError("texts: a decoder-only model scores strings or token-id lists")
    if prepend_bos:
        rows = [[tokenizer.bos_token_id, *row] for row in rows]
    if tokenizer is None:
        return pad_rows(rows, 0, "right")
    return pad_rows(rows, tokenizer.pad_token_id, tokenizer.padding_side)


def token_nll(model, tokenizer, texts, *, max_tokens: int = 128, autocast_dtype: torch.dtype | None = None,
              prepend_bos: bool = False, return_logits: bool = False):
    """Per-token NLL ``[B, T]`` of one batch, teacher-forced, and the ``[B, T]`` float mask of the scored tokens.
    Keeps the graph (the multitask loss, pretraining and a learning reward train through it); with
    ``return_logits``, also the ``[B, T, V]`` logits that predicted each token (for label smoothing).

    Decoder-only models score ``texts``, each either a string or a list of token ids:

    - a string is truncated to ``max_tokens`` tokens with an EOS after it (so the model is also scored on ending
      it; the EOS is lost when the text is longer), no other special token; ``prepend_bos`` puts BOS first, so
      that the first token is scored too (conditioned on BOS alone);
    - token ids (a list per text, or one ``[B, T]`` tensor without padding) are scored as given.

    Rows are padded on the tokenizer's side, positions come from the attention mask, and a token is scored when it
    and its predecessor are real (the first token has no context).

    Encoder-decoder models score ``texts`` as (source, target) pairs: the target's tokens and its EOS (as the
    tokenizer encodes them, each side truncated to ``max_tokens``) given the source. The tokenizer must pad right.
    """
    if is_encoder_decoder(model):
        return _seq2seq_token_nll(model, tokenizer, texts, max_tokens, autocast_dtype, return_logits)
    ids, mask = (t.to(device_of(model)) for t in _decoder_batch(tokenizer, texts, max_tokens, prepend_bos))
    with autocast(model, autocast_dtype):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logits = logits[:, :-1]
    nll = -token_logprobs(logits.float(), ids[:, 1:])
    scored = (mask[:, 1:] * mask[:, :-1]).float()
    return (nll * scored, scored, logits) if return_logits else (nll * scored, scored)


def _seq2seq_token_nll(model, tokenizer, pairs, max_tokens: int, autocast_dtype, return_logits: bool):
    if not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        raise ValueError("texts: an encoder-decoder model scores (source, target) pairs")
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    device = device_of(model)
    enc = tokenizer(sources, return_tensors="pt", padding=True, truncation=True, max_length=max_tokens).to(device)
    labels = tokenizer(text_target=targets, return_tensors="pt", padding=True, truncation=True,
                       max_length=max_tokens).to(device)
    if tokenizer.padding_side != "right":
        raise ValueError("token_nll: expected a right-padding tokenizer (encoder-decoder inputs are right-padded)")
    start = torch.full_like(labels.input_ids[:, :1], decoder_start_id(model))
    decoder_ids = torch.cat([start, labels.input_ids[:, :-1]], dim=1)
    with autocast(model, autocast_dtype):
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, decoder_input_ids=decoder_ids,
                       decoder_attention_mask=labels.attention_mask).logits
    mask = labels.attention_mask.float()
    nll = -token_logprobs(logits.float(), labels.input_ids) * mask
    return (nll, mask, logits) if return_logits else (nll, mask)


def sequence_nll(model, tokenizer, texts, *, batch_size: int | None = 16, max_tokens: int = 128,
                 autocast_dtype: torch.dtype | None = None, prepend_bos: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL ``[N]`` (float32) and number of scored tokens ``[N]`` (long) of each of ``texts``, scored as
    :func:`token_nll` does, ``batch_size`` at a time (None: one batch). Keeps the graph unless called under
    ``no_grad``. Perplexity is ``exp(nll.sum() / tokens.sum())``."""
    step = len(texts) if batch_size is None else batch_size
    device = device_of(model)
    sums, counts = [torch.zeros(0, device=device)], [torch.zeros(0, dtype=torch.long, device=device)]
    for start in range(0, len(texts), max(step, 1)):
        nll, scored = token_nll(model, tokenizer, texts[start:start + step], max_tokens=max_tokens,
                                autocast_dtype=autocast_dtype, prepend_bos=prepend_bos)
        sums.append(nll.sum(-1))
        counts.append(scored.sum(-1).long())
    return torch.cat(sums), torch.cat(counts)


def seq2seq_nll(model, tokenizer, sources: list[str], targets: list[str], *, max_tokens: int = 64,
                autocast_dtype: torch.dtype | None = None, return_logits: bool = False):
    """:func:`token_nll` of an encoder-decoder model on the pairs ``zip(sources, targets)`` (kept for callers that
    pass sources and targets apart)."""
    return token_nll(model, tokenizer, list(zip(sources, targets)), max_tokens=max_tokens,
                     autocast_dtype=autocast_dtype, return_logits=return_logits)


def label_smoothed_loss(nll: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Mean per-token cross-entropy with label smoothing ε (the target gets 1 − ε, every token ε / V), from
    :func:`token_nll`'s ``(nll, mask, logits)``: (1 − ε)·NLL + ε·(mean over the vocabulary of −log p)."""
    smooth = -torch.log_softmax(logits.float(), -1).mean(-1) * mask
    return ((1 - epsilon) * nll.sum() + epsilon * smooth.sum()) / mask.sum().clamp(min=1)


def forward_response(model, rollout: Rollout, *, temperature: float = 1.0, autocast_dtype: torch.dtype | None = None,
                     return_hidden: bool = False, action_mask: torch.Tensor | None = None, return_logits: bool = False,
                     entropy_grad: bool = False, compute_entropy: bool = True) -> ResponseOutput:
    """One teacher-forced forward over ``rollout``'s prompts + responses, with grad: per response token its
    log-prob, the entropy of the distribution it was drawn from, and optionally the hidden state that predicts it.
    The action mask is never taken from the rollout implicitly: pass ``action_mask=rollout.action_mask`` for
    NLPO's masked distribution.

    Decoder-only: the input is the left-padded prompt followed by the response minus its last token (nothing is
    predicted from the last one), the attention mask is ``cat(query_mask, response_mask)`` (EOS included, padding
    after it masked), positions come from its cumsum, and the logits are those at positions Tq−1 … Tq+Tr−2.
    Encoder-decoder: the encoder reads the prompt and the decoder ``[decoder_start] + response[:, :-1]``.

    Args:
        temperature: the sampling temperature: logits are divided by it, so the log-probs match :func:`sample`'s.
        autocast_dtype: run the forward under ``torch.autocast`` (e.g. bf16); the log-probs are fp32 either way.
        return_hidden: also return the last hidden state at each predicting position (for a value head).
        action_mask: ``[B, Tr, V]`` bool; logits outside it are −inf before the log-softmax (NLPO). Positions whose
            mask is all False are left unrestricted rather than producing NaN.
        return_logits: also return the ``[B, Tr, V]`` fp32 logits (large).
        entropy_grad: compute the entropy with grad (for an entropy bonus); by default it is detached, which saves
            a vocabulary-sized backward.
        compute_entropy: False skips the entropy (``entropy`` is then None): two vocabulary-sized passes saved
            for forwards that only need log-probs (the KL reference, PPO's old log-probs).
    """
    query_ids, query_mask = rollout.query_ids, rollout.query_mask
    response_ids, response_mask = rollout.response_ids, rollout.response_mask
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature!r}")
    check_query(model, query_ids, query_mask)
    batch, tq = query_ids.shape
    tr = response_ids.shape[1]
    if response_ids.shape[0] != batch or response_mask.shape != response_ids.shape or tr == 0:
        raise ValueError(f"response_ids/response_mask: expected [B={batch}, Tr>0], got {tuple(response_ids.shape)} "
                         f"and {tuple(response_mask.shape)}")

    with autocast(model, autocast_dtype):
        if is_encoder_decoder(model):
            start = torch.full((batch, 1), decoder_start_id(model), dtype=torch.long, device=response_ids.device)
            out = model(input_ids=query_ids, attention_mask=query_mask,
                        decoder_input_ids=torch.cat([start, response_ids[:, :-1]], dim=1),
                        output_hidden_states=return_hidden, use_cache=False)
            logits = out.logits
            hidden = out.decoder_hidden_states[-1] if return_hidden else None
        else:
            input_ids = torch.cat([query_ids, response_ids[:, :-1]], dim=1)
            attn = torch.cat([query_mask.long(), response_mask[:, :-1].long()], dim=1)
            extra = {"logits_to_keep": tr} if accepts_logits_to_keep(model) else {}
            out = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                        output_hidden_states=return_hidden, use_cache=False, **extra)
            logits = out.logits[:, -tr:]
            hidden = out.hidden_states[-1][:, tq - 1:] if return_hidden else None

    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if action_mask is not None:
        if action_mask.shape != logits.shape:
            raise ValueError(f"action_mask: expected shape {tuple(logits.shape)}, got {tuple(action_mask.shape)}")
        allowed = action_mask.bool()
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        logits = logits.masked_fill(~allowed, NEG_INF)
    valid = response_mask.bool()
    logprobs = token_logprobs(logits, response_ids)

    entropy = None
    if compute_entropy:
        # H = lse − Σ p·z with p = exp(z − lse), the normaliser recovered from the log-prob: lse = z_token − log p.
        # The dot product runs as a batched matmul. Every vocabulary-sized tensor is a fresh allocation that costs
        # page faults (BENCHMARKS.md, "The allocator"), so the detached default computes p in place, and only the
        # entropy bonus (entropy_grad) pays for a differentiable one.
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            z = logits if entropy_grad else logits.detach()
            lse = z.gather(-1, response_ids[..., None]).squeeze(-1) - (logprobs if entropy_grad else logprobs.detach())
            probs = torch.exp(z - lse[..., None]) if entropy_grad else (z - lse[..., None]).exp_()
            finite = z if action_mask is None else z.masked_fill(probs == 0, 0.0)  # −inf · 0 would be NaN
            expected = (probs.unsqueeze(-2) @ finite.unsqueeze(-1)).squeeze(-1).squeeze(-1)
            entropy = torch.where(valid, lse - expected, 0.0)
    logprobs = torch.where(valid, logprobs, 0.0)

    return ResponseOutput(logprobs=logprobs, entropy=entropy, hidden=hidden,
                          logits=logits if return_logits else None)
