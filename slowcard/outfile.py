"""Writing an output file the user named (--out): atomically where that is possible and safe.

A regular file (or a new name) is written to a temporary file beside it and renamed over it at
the end, so a reader never sees half a file and a failed write leaves the old one. Anything else
is written in place, never replaced: a FIFO or a device (``--out /dev/stdout``) gets the bytes
streamed into it, and a symbolic link keeps being a link (its target is what gets written, itself
atomically when it is a regular file). Renaming over such a target would have swapped the
user's pipe, device or link for a plain file (issue 16).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into (see the module doc for where it goes)."""
    path = Path(path)
    real = Path(os.path.realpath(path))  # a symlink's final target (itself when none)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "is a folder, expected a file name", str(path))
        with open(real, "wb") as f:  # FIFO, device, socket: stream into it
            yield f
        return
    real.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".part", dir=real.parent)
    try:
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
