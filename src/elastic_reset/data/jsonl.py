"""JSON Lines: one object per line, read with the file and line of each, so a caller's error can name them."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator

from elastic_reset.errors import DataFileError


def json_objects(lines: Iterable[str], source: object) -> Iterator[tuple[str, dict]]:
    """``(where, object)`` for each non-blank line, ``where`` being ``SOURCE:LINE``; a line that is not a JSON object
    is a one-line :class:`DataFileError` naming it, and so is text that is not UTF-8 or a ``.gz`` that is not gzip
    (``lines`` being an open file)."""
    lines, number = iter(lines), 0
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as err:  # decoded a block at a time: the bad byte is after the last line read
            raise DataFileError(f"{source}: not UTF-8 text after line {number} ({err.reason}, byte "
                                f"{err.object[err.start:err.start + 1]!r}); save the file as UTF-8") from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise DataFileError(f"{source}: not a readable gzip file ({err}); a .gz name must hold gzip data") from None
        number += 1
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
