"""The algorithm core: no dependency on tasks, the RL engine or the CLI."""

from elastic_reset.core.anchor import PRESETS, Anchor, AnchorEvent, Pull
from elastic_reset.core.elastic_reset import MODES, ElasticReset, ResetEvent
from elastic_reset.core.triggers import Every, KLBudget, Plateau

__all__ = ["MODES", "PRESETS", "Anchor", "AnchorEvent", "ElasticReset", "Every", "KLBudget", "Plateau", "Pull",
           "ResetEvent"]
