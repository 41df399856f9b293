"""The base of every run-config section: a stdlib dataclass that pydantic validates strictly.

It lives apart from :mod:`~elastic_reset.rl.config` so that a drift method's own config class can sit beside the
method in :mod:`~elastic_reset.rl.methods`, which the run config then imports.
"""

from __future__ import annotations

from pydantic import ConfigDict, GetCoreSchemaHandler
from pydantic_core import CoreSchema


class Section:
    """Base of the config dataclasses: pydantic builds them from mappings, refuses unknown keys and NaN/inf, and
    converts nothing (strict: no "1" for 1, no true for 1, no 1 for true; an int is still a valid float)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type, handler: GetCoreSchemaHandler) -> CoreSchema:
        # Strict mode also refuses a mapping for a stdlib dataclass (it wants an instance: `dataclass_exact_type`),
        # and YAML gives mappings. Lift just that check; the fields stay strict under the config above.
        schema = handler(source)
        handler.resolve_ref_schema(schema)["strict"] = False
        return schema
