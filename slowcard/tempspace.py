"""Temporary folders (and files): named after the process that owns them, and removed by the next slowcard
that finds their owner gone.

A process killed with SIGKILL (or a machine that lost power) runs no cleanup, and its part files
in /dev/shm are RAM until reboot (issue 16: 131 MB per .gz). Every temporary folder slowcard
creates is ``[.]slowcard-<kind>-<host>-<pid>-<random>``; ``clean_stale`` removes those of this
host whose process no longer exists. Called when a database is opened for writing and before an
export writes into its folder.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

KINDS = ("part", "template", "worker", "dask", "export")
_NAME = re.compile(r"^\.?slowcard-(?:{})-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$".format("|".join(KINDS)))


def _host() -> str:
    # '-' is kept (the pattern takes the last two '-' fields as pid and random part)
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _prefix(kind: str, hidden: bool) -> str:
    """``[.]slowcard-<kind>-<host>-<pid>-``: what clean_stale recognises, before the random part."""
    assert kind in KINDS
    return f"{'.' if hidden else ''}slowcard-{kind}-{_host()}-{os.getpid()}-"


def make_dir(kind: str, parent: str | Path | None = None, hidden: bool = False) -> Path:
    """A new temporary folder owned by this process (see the module doc for its name)."""
    return Path(tempfile.mkdtemp(prefix=_prefix(kind, hidden), dir=None if parent is None else str(parent)))


def temp_name(kind: str, hidden: bool = True) -> str:
    """A name for a temporary file owned by this process (see the module doc), e.g. a database
    being copied into place."""
    return _prefix(kind, hidden) + secrets.token_hex(4)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def default_roots() -> list[Path]:
    """Where temporary folders go when no folder is given: /dev/shm and the system temp folder."""
    roots = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def clean_stale(roots: Sequence[str | Path] | None = None) -> list[Path]:
    """Remove this host's slowcard temp folders whose process is gone; returns what was removed.
    Never raises: a folder that cannot be listed or removed is left as it is."""
    removed = []
    host = _host()
    for root in default_roots() if roots is None else [Path(r) for r in roots]:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            m = _NAME.match(entry.name)
            if not m or m.group("host") != host:
                continue
            pid = int(m.group("pid"))
            if pid == os.getpid() or _alive(pid):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                    removed.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):  # a copy cut short (temp_name)
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
            except OSError:
                pass
    return removed
