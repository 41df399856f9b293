"""Prompts from a file or a ``datasets`` dataset, as rows: what the ``prompts`` task reads (its options name the
source, the column and the split). A prompt is a non-empty string or, in TRL's conversational format, a list of
``{"role", "content"}`` messages; every other column of its row is kept for the reward. Errors name the option or the
file and row; ``datasets`` is imported only for a dataset."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from elastic_reset.data.jsonl import json_objects
from elastic_reset.errors import ConfigError, DataFileError, first_line

TRL_KWARGS = ("completion_ids", "trainer_state", "log_metric", "log_extra")
"""What TRL's ``GRPOTrainer`` passes a reward function besides prompts, completions and the dataset's columns."""
_RESERVED = ("prompts", "completions", *TRL_KWARGS)
"""Keyword names the reward call uses itself: a dataset column with such a name is not passed on (TRL's own values
take its place, as in ``GRPOTrainer``)."""


def read_rows(source: Any, key: str, *, split: str = "train", dataset: bool = False) -> list[dict[str, Any]]:
    """The rows of ``source`` (the value of option ``key``) as dicts; a plain-text file (any suffix but .jsonl,
    .json, .csv, .tsv) gives ``{"text": line}`` per non-blank line. ``dataset``: ``source`` may be a hub name, or,
    from Python, a ``datasets`` object or a list of row dicts."""
    if dataset and not isinstance(source, str):
        return _rows_of(source, split, key, repr(source) if isinstance(source, list) else "the dataset")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{key}: expected a file, folder or dataset name, got {source!r}")
    path = Path(source).expanduser()
    if path.is_file():
        return _read_file(path, key)
    if not path.is_dir() and not dataset:
        raise ConfigError(f"{key}: no such file or folder {source!r}")
    return _read_dataset(source, split, key)


def _read_file(path: Path, key: str) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start})") from None
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [row for _, row in json_objects(text.splitlines(), path)]
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFileError(f"{path} line {err.lineno}: not JSON ({err.msg})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataFileError(f"{path}: expected a JSON list of objects")
        return rows
    if suffix in (".csv", ".tsv"):
        reader = csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
        return [dict(row) for row in reader]
    return [{"text": line.strip()} for line in text.splitlines() if line.strip()]


def _read_dataset(source: str, split: str, key: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{key}: reading {source!r} needs the `datasets` package (pip install datasets)") from None
    path = Path(source).expanduser()
    saved = path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "dataset_info.json",
                                                                  "state.json"))
    try:
        data = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(source, split=split)
    except Exception as err:  # noqa: BLE001  (hub, network, builder and file errors alike: one line naming it)
        raise ConfigError(f"{key}: cannot load dataset {source!r} ({first_line(err)})") from None
    return _rows_of(data, split, key, f"dataset {source!r}")


def _rows_of(data: Any, split: str, key: str, name: str) -> list[dict[str, Any]]:
    """The rows of a ``datasets`` (Iterable)Dataset, a dict of them by split, or a list of row dicts."""
    if isinstance(data, dict) or type(data).__name__ in ("DatasetDict", "IterableDatasetDict"):
        if split not in data:
            raise ConfigError(f"{key}: {name} has no split {split!r} (splits: {', '.join(data)})")
        data = data[split]
    if isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
        raise ConfigError(f"{key}: expected a dataset, a dict of them by split or a list of row dicts, got "
                          f"{type(data).__name__}")
    rows = [dict(row) if isinstance(row, dict) else row for row in data]
    if not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f"{key}: expected rows that are dicts (column: value), got "
                          f"{next(type(r).__name__ for r in rows if not isinstance(r, dict))}")
    return rows


def _is_plain(source: Any) -> bool:
    if not isinstance(source, str):
        return False
    path = Path(source).expanduser()
    return path.is_file() and path.suffix.lower() not in (".jsonl", ".json", ".csv", ".tsv")


def read_texts(source: Any, key: str, column: str, column_key: str, *, split: str = "train",
               dataset: bool = False, chat: bool = False) -> list[tuple[Any, dict[str, Any]]]:
    """(text of ``column``, the row's other columns) per row of ``source``; a plain-text file's lines whatever
    the column. Every text must be a non-empty string; with ``chat``, every value may instead be a conversation
    (TRL's conversational format: a list of ``{"role", "content"}`` messages), but not some rows of each."""
    rows = read_rows(source, key, split=split, dataset=dataset)
    if not isinstance(source, str):
        source = key  # a dataset object from Python: errors name the option
    if not rows:
        raise DataFileError(f"{source}: no rows")
    if _is_plain(source):
        column = "text"  # one per line: there are no columns
    elif column not in rows[0]:
        raise ConfigError(f"{column_key}: {source} has no column {column!r} (columns: {', '.join(map(str, rows[0]))})")
    out = []
    for i, row in enumerate(rows):
        value = row.get(column)
        where = f"{source} row {i + 1}: column {column!r}"
        if chat and isinstance(value, list):
            _check_messages(value, where)
        elif not isinstance(value, str) or not value.strip():
            what = ("a list (chat messages are read for the prompts only)" if isinstance(value, list)
                    else "missing" if value is None else "empty" if isinstance(value, str) else type(value).__name__)
            raise DataFileError(f"{where} is {what}")
        if out and isinstance(value, list) != isinstance(out[0][0], list):
            raise DataFileError(f"{where} is {'chat messages' if isinstance(value, list) else 'text'}, but row 1's "
                                "is not: one format for every prompt")
        out.append((value, {k: v for k, v in row.items() if k != column and k not in _RESERVED}))
    return out


def _check_messages(messages: list, where: str) -> None:
    """A prompt conversation as TRL's prompt-only conversational format has it: messages with a string role and
    content, ending with a user or tool turn (answered) or an assistant turn (continued)."""
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DataFileError(f"{where}: message {j + 1} is not {{\"role\": str, \"content\": str}}")
    if not messages or messages[-1]["role"] not in ("user", "tool", "assistant"):
        last = repr(messages[-1]["role"]) if messages else "none (an empty list)"
        raise DataFileError(f"{where}: the last message's role must be user, tool or assistant, got {last}")
