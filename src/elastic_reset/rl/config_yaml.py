"""A config's YAML, read strictly, and how its errors name a key and show a value.

PyYAML follows YAML 1.1; a config is read as YAML 1.2 reads floats, and what would silently load something else than
the file says is refused naming the key and line (:class:`_Loader`). :mod:`elastic_reset.rl.config` validates what
this module reads.
"""

from __future__ import annotations

import re
import reprlib
import typing
from pathlib import Path
from typing import Any

import yaml

from elastic_reset.errors import ConfigError

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset, _REPR.maxdict = 3, 6, 6, 6, 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = 60
_SHORT = 80
"""Characters of a bad value (or key) an error shows: a huge value must not make a huge (or endless) message."""


def short(value: Any) -> str:
    """``repr(value)``, cut to a few levels, items and :data:`_SHORT` characters."""
    text = _REPR.repr(value)
    return text if len(text) <= _SHORT else text[:_SHORT - 3] + "..."


def dotted(loc: typing.Sequence[str | int | None]) -> str:
    """``('model', 'lora', 'target_modules', 1)`` → ``model.lora.target_modules[1]`` (None parts skipped)."""
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc if p is not None).lstrip(".")
    return key if len(key) <= _SHORT else key[:_SHORT - 3] + "..."


_MAX_DEPTH = 32
"""How deeply a YAML config may nest (the shipped ones: 5 levels); PyYAML's composer recurses once per level."""
_INT = "tag:yaml.org,2002:int"
_STR = "tag:yaml.org,2002:str"
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_OCTAL_0O = re.compile(r"[-+]?0[oO][0-7_]+")


class Refused(Exception):
    """YAML that parses but that a config refuses; the caller says where it came from (the file or ``--set``)."""

    def __init__(self, line: int, key: typing.Sequence[str | int | None], message: str):
        self.line, self.key, self.message = line, tuple(key), message
        super().__init__(f"line {line}: {self.describe()}")

    def describe(self, prefix: typing.Sequence[str | int] = ()) -> str:
        key = dotted((*prefix, *self.key))
        return f"{key}: {self.message}" if key else self.message


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, which reads ``3e-4`` (no dot) and ``1.0e5`` (no exponent sign) as strings; this
    loader reads them as floats, as YAML 1.2 does. It refuses, naming the key and line, what would silently load
    something else than what the file says: anchors and aliases (a 1 KB "billion laughs" file expands to gigabytes),
    nesting deeper than :data:`_MAX_DEPTH`, a duplicated key (YAML keeps the last), an integer with a leading zero
    (YAML 1.1 reads ``010`` as 8; ``0o10`` is YAML 1.2's octal, a string in 1.1) and a base-60 one (``1:30`` is 90)."""

    refuse_0o = True
    """False for a run's saved config.yaml: yaml.safe_dump writes the string "0o10" unquoted."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str | int | None] = []  # keys and indices down to the node being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        # A mapping's value comes with its key node, a sequence item with its index; a key itself with None.
        self._path.append(index.value if isinstance(index, yaml.ScalarNode) else index)
        try:
            if event.anchor is not None:  # an AliasEvent's anchor is the name it refers to
                sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
                raise Refused(line, self._path, f"YAML anchors and aliases ({sign}{event.anchor}) are not allowed "
                                                "in a config; write the value out")
            if len(self._path) > _MAX_DEPTH:
                raise Refused(line, self._path[:3], f"nested deeper than {_MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
            self._check(node)
            return node
        finally:
            self._path.pop()

    def _check(self, node: Any) -> None:
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], Any] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    seen = first.setdefault((key.tag, key.value), key)
                    if seen is not key:
                        raise Refused(key.start_mark.line + 1, (*self._path, key.value),
                                      f"duplicate key (first at line {seen.start_mark.line + 1}); keep one")
        elif isinstance(node, yaml.ScalarNode):
            digits = node.value.replace("_", "")
            if node.tag == _INT and _LEADING_ZERO.fullmatch(node.value):
                raise Refused(node.start_mark.line + 1, self._path,
                              f"{node.value} has a leading zero, which YAML reads as octal ({int(digits, 8)}); "
                              "drop the zero (or quote it for text)")
            if node.tag == _INT and ":" in node.value:
                raise Refused(node.start_mark.line + 1, self._path,
                              f"{node.value} is a base-60 number to YAML 1.1 ({self.construct_yaml_int(node)}); "
                              "write it in decimal (or quote it for text)")
            if self.refuse_0o and node.tag == _STR and node.style is None and _OCTAL_0O.fullmatch(node.value):
                raise Refused(node.start_mark.line + 1, self._path,
                              f"{node.value} is an octal number ({int(digits, 0)}), which YAML 1.1 reads as text; "
                              "write it in decimal (or quote it for text)")


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))


class _SavedLoader(_Loader):
    """For a run's saved config.yaml, which yaml.safe_dump wrote."""

    refuse_0o = False


def _read_text(path: Path) -> str:
    """The file's text; a binary file or a stray non-UTF-8 byte is refused naming the file and line."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start
    else:
        bad = raw.find(b"\0")  # valid UTF-8, but no text file holds it
        if bad < 0:
            return text
    line = raw.count(b"\n", 0, bad) + 1
    raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[bad]:02x} at line {line}); save it as UTF-8")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, read as :class:`_Loader` reads (YAML 1.2 floats, no aliases, no duplicated
    key); a missing, empty or unreadable file, or one that is not a mapping, is refused naming it."""
    path = Path(path)
    if not path.is_file():
        shipped = Path(__file__).resolve().parents[1] / "configs"
        hint = (f"; a shipped config of that name is {shipped / path.name}" if (shipped / path.name).is_file()
                else f"; the shipped configs are in {shipped}")
        raise ConfigError(f"{path}: config file not found{hint}")
    try:
        data = yaml.load(_read_text(path), _Loader)
    except Refused as err:
        raise ConfigError(f"{path}, line {err.line}: {err.describe()}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if data is None:  # an empty file (or only comments) is more likely a mistake than a wish for all the defaults
        raise ConfigError(f"{path}: empty config; give at least one setting (e.g. `steps: 50`), or start from a file "
                          "in configs/")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_value(raw: str) -> Any:
    """One ``--set key=value`` value, read as a config file's are (raises :class:`Refused` or ``yaml.YAMLError``)."""
    return yaml.load(raw, _Loader)


def load_saved(text: str) -> Any:
    """A run's saved ``config.yaml`` (``yaml.safe_dump``'s writing; raises :class:`Refused` or ``yaml.YAMLError``)."""
    return yaml.load(text, _SavedLoader)
