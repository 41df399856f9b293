"""Errors a user can act on. The CLI prints them as one line (no traceback unless ``--debug``), so each message
names the key or the file at fault and, where it is not obvious, what to do."""


class ElasticResetError(Exception):
    """Base of the errors the CLI reports as one line."""


class ConfigError(ElasticResetError, ValueError):
    """A configuration value is unknown, of the wrong type, or impossible. The message names the dotted key."""


class RunFileError(ElasticResetError, ValueError):
    """A run's file is damaged or inconsistent. The message names the file and what to do."""


class ReportError(ElasticResetError, ValueError):
    """Runs cannot be reported as asked (missing records, mixed metrics, an output over an input)."""


class RewardError(ElasticResetError, ValueError):
    """The reward function returned something that is not one finite number per completion."""


class NonFiniteError(ElasticResetError, FloatingPointError):
    """A loss or gradient became NaN or infinite; the run stopped before applying it."""


class RunRecoveryWarning(UserWarning):
    """A run directory was not clean (a lost pointer, temp files of a killed save, ...) and was recovered."""


class TornRecordWarning(UserWarning):
    """A ``metrics.jsonl`` whose last line is not a whole record (a run writing it, or stopped mid-line): left out."""


class DataFileError(ElasticResetError, ValueError):
    """An input data file is missing fields or malformed. The message names the file and line."""


class GridError(ElasticResetError, RuntimeError):
    """Cells of a ``compare --jobs`` grid failed. The message names each cell and its log."""


class DirectoryInUseError(ElasticResetError, RuntimeError):
    """Another live process holds the lock of a run or grid directory. The message names it and its PID."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name where it has none: a library's error cut to fit the
    one-line message that names the key or file at fault."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
