"""JSON Lines: one object per line, read with the file and line of each, so a caller's error can name them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from elastic_reset.errors import DataFileError


def json_objects(lines: Iterable[str], source: object) -> Iterator[tuple[str, dict]]:
    """``(where, object)`` for each non-blank line, ``where`` being ``SOURCE:LINE``; a line that is not a JSON object
    is a one-line :class:`DataFileError` naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFileError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, row
