"""VADER lexicon sentiment as a reward (Hutto & Gilbert 2014): fast (≈36k sentences/s) and easy to hack, which is
exactly what a drift demo needs: repeating "great great great" scores well while the language degrades."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _analyzer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_positive(prompts: list[str], completions: list[str]) -> list[float]:
    """Positivity of each completion in [0, 1]: (VADER compound + 1) / 2, so 0.5 is neutral."""
    analyzer = _analyzer()
    return [(analyzer.polarity_scores(c)["compound"] + 1.0) / 2.0 for c in completions]
