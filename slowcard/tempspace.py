"""Temporary folders: owned by the process that made them, and removed by the next slowcard
that finds their owner gone.

A process killed with SIGKILL (or a machine that lost power) runs no cleanup, and its part files
in /dev/shm are RAM until reboot (issue 16: 131 MB per .gz). Every temporary folder slowcard
creates is ``[.]slowcard-<kind>-<host>-<pid>-<random>`` and holds an owner file, ``.owner``: a
token (host, pid, PID namespace, boot id, the folder's random part) under an exclusive lock
(flock) that its process holds for as long as it lives. ``clean_stale`` removes a folder of
this host only when it can take that lock itself: the kernel releases a lock only when its
holder is gone, whatever PID namespace either process runs in. (The process id alone was
not proof: a slowcard in another container sharing /dev/shm and the host name sees no process
with that id and deleted the part folder of a running ingest, issue 31.) A folder without an
owner file (made by slowcard before issue 31, or killed in the instant between making it and
locking it) is removed only when its process is gone as seen from here AND it is older than
LEGACY_AGE_S. Called when a database is opened for writing and before an export writes into
its folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

KINDS = ("part", "template", "worker", "dask", "export")
_NAME = re.compile(r"^\.?slowcard-(?:{})-(?P<host>.+)-(?P<pid>\d+)-(?P<token>[A-Za-z0-9_]+)$".format("|".join(KINDS)))
OWNER_FILE = ".owner"
# A folder without an owner file is left alone for this long (seconds), whatever its pid says.
LEGACY_AGE_S = 3600.0

# Owner files this process holds locked: folder -> open file descriptor (the lock lives as long
# as the descriptor; closed when the folder is gone, see _release_gone).
_HELD: dict[str, int] = {}
_HELD_LOCK = threading.Lock()


def _host() -> str:
    # '-' is kept (the pattern takes the last two '-' fields as pid and random part)
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _prefix(kind: str, hidden: bool) -> str:
    """``[.]slowcard-<kind>-<host>-<pid>-``: what clean_stale recognises, before the random part."""
    assert kind in KINDS
    return f"{'.' if hidden else ''}slowcard-{kind}-{_host()}-{os.getpid()}-"


def _namespace() -> str:
    """This process's PID namespace and boot (recorded in the token, for people reading it)."""
    parts = []
    for path in ("/proc/self/ns/pid", "/proc/sys/kernel/random/boot_id"):
        try:
            parts.append(os.readlink(path) if path.startswith("/proc/self") else Path(path).read_text().strip())
        except OSError:
            parts.append("?")
    return " ".join(parts)


def _release_gone() -> None:
    """Close the owner locks of folders that are gone (removed by their code when done)."""
    with _HELD_LOCK:
        for folder in [f for f in _HELD if not os.path.isdir(f)]:
            os.close(_HELD.pop(folder))


def make_dir(kind: str, parent: str | Path | None = None, hidden: bool = False) -> Path:
    """A new temporary folder owned by this process: its owner file is written and locked
    before the folder is handed out (see the module doc)."""
    _release_gone()
    folder = Path(tempfile.mkdtemp(prefix=_prefix(kind, hidden), dir=None if parent is None else str(parent)))
    m = _NAME.match(folder.name)
    token = f"slowcard temp folder {m.group('token') if m else folder.name}\nhost {_host()}\npid {os.getpid()}\n"
    try:
        fd = os.open(folder / OWNER_FILE, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, (token + f"namespace {_namespace()}\nstarted {time.time():.0f}\n").encode())
        except OSError:
            os.close(fd)
            raise
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    with _HELD_LOCK:
        _HELD[str(folder)] = fd
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def chosen_root() -> Path | None:
    """``SLOWCARD_TMP_DIR``: the folder the user chose for an ingest's part files (a small
    /dev/shm in a container, a faster disk), when it names a folder; None otherwise (the CLI
    warns about a value that is not a folder: tmp_dir_warning)."""
    value = os.environ.get("SLOWCARD_TMP_DIR", "")
    return Path(value) if value and os.path.isdir(value) else None


def tmp_dir_warning() -> str | None:
    """What is wrong with SLOWCARD_TMP_DIR, when it is set but names no folder."""
    value = os.environ.get("SLOWCARD_TMP_DIR", "")
    if value and not os.path.isdir(value):
        return f"SLOWCARD_TMP_DIR={value!r} is not a folder; part files go to /dev/shm or the system temp folder"
    return None


def default_roots() -> list[Path]:
    """Where temporary folders go when no folder is given: SLOWCARD_TMP_DIR when set, /dev/shm and
    the system temp folder (each one is also where stale folders are looked for)."""
    chosen = chosen_root()
    roots = ([chosen] if chosen else []) + [Path("/dev/shm"), Path(tempfile.gettempdir())]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def _owner_gone(folder: str, token: str) -> bool | None:
    """True when the folder's owner lock can be taken (its process is gone), False when it is
    held, None when the folder has no owner file (or one that is not its own)."""
    try:
        fd = os.open(os.path.join(folder, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return False  # cannot even look: not ours to judge
    try:
        head = os.read(fd, 256).decode("utf-8", "replace")
        if not head.startswith(f"slowcard temp folder {token}\n"):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its process lives (in this PID namespace or another)
        return True
    finally:
        os.close(fd)


def clean_stale(roots: Sequence[str | Path] | None = None) -> list[Path]:
    """Remove this host's slowcard temp folders whose owner is gone; returns what was removed.
    Never raises: a folder that cannot be listed or removed is left as it is."""
    removed = []
    host = _host()
    now = time.time()
    for root in default_roots() if roots is None else [Path(r) for r in roots]:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            m = _NAME.match(entry.name)
            if not m or m.group("host") != host or entry.path in _HELD:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    gone = _owner_gone(entry.path, m.group("token"))
                    if gone is None:  # no owner file: the process id, and age, decide
                        pid = int(m.group("pid"))
                        old = now - entry.stat(follow_symlinks=False).st_mtime > LEGACY_AGE_S
                        gone = old and pid != os.getpid() and not _alive(pid)
                    if gone:
                        shutil.rmtree(entry.path)
                        removed.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    # a temporary file of a slowcard before issue 31 (they are all folders now)
                    pid = int(m.group("pid"))
                    old = now - entry.stat(follow_symlinks=False).st_mtime > LEGACY_AGE_S
                    if old and pid != os.getpid() and not _alive(pid):
                        os.unlink(entry.path)
                        removed.append(Path(entry.path))
            except OSError:
                pass
    return removed
