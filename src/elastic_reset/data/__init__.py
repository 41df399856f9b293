"""Readers of the datasets the project trains and evaluates on, and their seeded splits; no model, no torch.

- :mod:`~elastic_reset.data.imdb`: IMDB reviews (cleaned), the task's prompt and reference splits, the
  classifier's and the policy's training text.
- :mod:`~elastic_reset.data.translation`: Multi30k (lowercased, aligned) and its pretraining / game split.
- :mod:`~elastic_reset.data.preferences`: preference pairs (HH-RLHF, Stack Exchange, JSONL files) and their
  prompt-disjoint split.
- :mod:`~elastic_reset.data.prompts`: a user's prompts (JSONL, JSON, CSV, plain text, a ``datasets`` dataset), text
  or chat messages, with their rows' other columns.

Builds (``pretrain/``, ``reward_models/``) and tasks (``tasks/``) read their data through these modules.
"""
