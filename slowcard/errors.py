"""Exceptions raised by the slowcard library; only ``slowcard.cli`` turns them into messages.

    SlowcardError
    ├── InputError            a file cannot be read as any supported format (names file + position)
    │   └── TruncatedInput    (internal) the tail of a file is cut; the reader salvages what it can
    ├── UsageError            wrong arguments: unknown query, bad parameter, bad rank map …
    ├── QueryDefinitionError  a sql/*.sql file breaks the header rules (names file + line)
    └── DatabaseBusy          another process holds the database lock past the wait limit

Every message names the file (and event index or line when known), says what was expected and
what to do next, so that the CLI can print it as it is.
"""

from __future__ import annotations


class SlowcardError(Exception):
    """Base class of every error slowcard raises on purpose."""


class InputError(SlowcardError):
    """A profiler file that cannot be ingested as it is.

    Args:
        path: the file.
        expected: what the reader expected to find.
        position: where (``"event 1234"``, ``"line 17"``, ``"byte 2048"``), when known.
        hint: what the user can do about it.
    """

    def __init__(self, path, expected: str, position: str | None = None, hint: str | None = None):
        self.path = str(path)
        self.expected = expected
        self.position = position
        self.hint = hint
        where = f"{self.path}" + (f" ({position})" if position else "")
        msg = f"{where}: {expected}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class UsageError(SlowcardError):
    """The call itself is wrong (unknown query name, bad parameter value, bad option)."""


class QueryDefinitionError(SlowcardError):
    """A query file does not follow the header rules of ``sql/``."""


class DatabaseBusy(SlowcardError):
    """The database file is locked by another process for longer than we may wait."""


def is_interrupt(exc: BaseException) -> bool:
    """A Ctrl-C that landed inside a DuckDB statement. DuckDB reports it as its InterruptException,
    or, when Python's KeyboardInterrupt arrived during the call, as RuntimeError("Query
    interrupted") (its cause the KeyboardInterrupt): callers treat both as the Ctrl-C it was."""
    if isinstance(exc, RuntimeError) and str(exc) == "Query interrupted":
        return True
    import duckdb

    return isinstance(exc, duckdb.InterruptException)
