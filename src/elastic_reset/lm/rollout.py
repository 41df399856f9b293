"""A batch of prompts with the responses sampled for them: what the sampler returns and the scorer reads back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch


@dataclass
class Rollout:
    """A batch of prompts and the responses sampled for them, with what the RL update needs. Row i of every tensor
    belongs to prompt i. Built outside inference mode, so every tensor can enter an autograd graph."""

    query_ids: torch.Tensor
    """``[B, Tq]`` long: the prompts, LEFT-padded for decoder-only models; for encoder-decoder models the encoder
    input as given."""
    query_mask: torch.Tensor
    """``[B, Tq]`` long: 1 for prompt tokens, 0 for padding."""
    response_ids: torch.Tensor
    """``[B, Tr]`` long: the sampled tokens, right-padded with ``pad_token_id`` after EOS. Tr is the longest
    response (at most ``max_new_tokens``)."""
    response_mask: torch.Tensor
    """``[B, Tr]`` float: 1 for generated tokens up to and INCLUDING the EOS, 0 after it."""
    logprobs: torch.Tensor
    """``[B, Tr]`` float32: log-prob of each sampled token under the policy at temperature T, BEFORE EOS
    suppression, top-k, top-p and the NLPO mask (the distribution :func:`forward_response` computes); 0 at padding."""
    action_mask: torch.Tensor | None = None
    """``[B, Tr, V]`` bool, only when a mask model was used (NLPO): True for the tokens the policy was allowed to
    sample at that position. All True at padding positions (no restriction where nothing was sampled)."""

    def _map(self, fn) -> Rollout:
        return Rollout(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                          for f in fields(self)})

    def to(self, device: torch.device | str) -> Rollout:
        """A copy with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    def select(self, indices: torch.Tensor | Sequence[int] | slice) -> Rollout:
        """The rollout restricted to the given rows (a minibatch), in the given order."""
        if not isinstance(indices, slice) and not torch.is_tensor(indices):
            indices = torch.as_tensor(list(indices), dtype=torch.long)
        if torch.is_tensor(indices):
            indices = indices.to(self.query_ids.device)
        return self._map(lambda t: t[indices])

    @property
    def response_lengths(self) -> torch.Tensor:
        """``[B]`` long: the number of generated tokens in each response (EOS included)."""
        return self.response_mask.sum(-1).long()

    def response_id_lists(self) -> list[list[int]]:
        """Each response's tokens (EOS included, no padding) as a list of ids: TRL's ``completion_ids``."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.response_ids, self.response_mask)]
