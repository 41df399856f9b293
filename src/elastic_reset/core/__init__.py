"""The algorithm core: no dependency on tasks, the RL engine or the CLI."""

from elastic_reset.core.elastic_reset import MODES, ElasticReset, ResetEvent

__all__ = ["MODES", "ElasticReset", "ResetEvent"]
