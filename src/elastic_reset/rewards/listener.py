"""The Translation Game's reward: the EN→DE listener (Elastic Reset §4; Lee et al. 2019; Lu et al. 2020).

The FR→EN speaker (the policy) writes an English message for a French sentence; the reward is how well the
listener recovers the true German from it: the mean log-probability per German token (EOS included) of the
reference, teacher-forced. That is SIL's game reward (−NLL of the German) normalised by length, so that long and
short sentences weigh alike in a batch. The listener trains on the same batch with cross-entropy on (sampled
English, true German) (paper §4: "the EN→DE reward model is simply trained using cross-entropy"), so the reward
moves as the game goes: the engine calls :meth:`ListenerReward.learn` once per iteration and checkpoints its state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from elastic_reset.errors import ConfigError, RewardError
from elastic_reset.lm.greedy import greedy_translate
from elastic_reset.lm.scoring import seq2seq_nll
from elastic_reset.rewards.learned import LearnedReward


class ListenerReward(LearnedReward):
    """Args:
        path: a Hugging Face encoder-decoder folder (the listener) with its tokenizer.
        german_of: the true German of every French prompt the game can be asked about.
        lr: the listener's AdamW learning rate; 0 keeps the listener fixed (a plain reward model: the speaker
            alone adapts, an ablation of the game's co-adaptation).
        max_tokens: tokens kept per message / reference.
    """

    def __init__(self, path: str | Path, german_of: dict[str, str], lr: float, max_tokens: int = 64):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"task.options.agents: no listener model at {path}")
        self.model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()  # no dropout: the reward of a message must not depend on a draw
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.german_of = german_of
        self.max_tokens = max_tokens
        self.lr = lr
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)

    def _references(self, prompts: list[str]) -> list[str]:
        missing = [p for p in prompts if p not in self.german_of]
        if missing:
            raise RewardError(f"listener reward: no German reference for prompt {missing[0]!r}")
        return [self.german_of[p] for p in prompts]

    def _nll(self, prompts: list[str], completions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return seq2seq_nll(self.model, self.tokenizer, completions, self._references(prompts),
                           max_tokens=self.max_tokens)

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        nll, mask = self._nll(prompts, completions)
        return (-(nll.sum(1) / mask.sum(1))).tolist()

    def learn(self, prompts: list[str], completions: list[str]) -> dict[str, float]:
        if self.lr == 0:
            return {}
        nll, mask = self._nll(prompts, completions)
        loss = nll.sum() / mask.sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def translate(self, english: list[str]) -> list[str]:
        """The listener's greedy German for ``english`` (the second leg of FR→EN→DE BLEU)."""
        return greedy_translate(self.model, self.tokenizer, english, max_tokens=self.max_tokens)

    def to(self, device) -> ListenerReward:
        self.model.to(device)  # before its first step: AdamW creates its moments beside the weights
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
