"""elastic-reset: RL fine-tuning of language models with Elastic Reset (Noukhovitch et al., NeurIPS 2023)."""

from elastic_reset.core import MODES, Anchor, ElasticReset, ResetEvent

__version__ = "0.1.0"
__all__ = ["MODES", "Anchor", "ElasticReset", "ResetEvent", "__version__"]
