"""Evaluation: drift metrics (perplexity on held-out text, KL to the initial model)."""
