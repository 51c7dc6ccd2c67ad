"""Reading gzip files: every member, as ``gzip -dc`` does, and the content size a trailer allows.

Every ingest path that decompresses a ``.gz`` itself (the head that detection reads, the Chrome
trace stream of one file and of a batch) reads through ``Members``; the CSV readers hand gzip to
DuckDB or to the stdlib ``gzip`` module, which read every member too.

A gzip file is one or more members (``cat a.gz b.gz``, appending writers, pigz --independent,
bgzip), each a header, a deflate stream and a trailer, optionally followed by zero padding (tape
blocks). zlib decompresses one member; the next starts in the bytes zlib hands back as
``unused_data``. Once a member ends, CPython may leave the same leftover in ``unconsumed_tail``
too: reading that attribute after the end fed the finished decompressor its own leftover again
and again, a loop that never ended while ``unused_data`` grew (issue 46, finding 1). Here the
leftover is taken from ``unused_data`` only, and each member gets a decompressor of its own.

zlib is used directly (not the ``gzip`` module) so that a cut or corrupt stream still yields every
byte that decompressed before the damage (the salvage keeps those events), with the damage
described in ``error``; and it decompresses without the GIL (members of a batch side by side).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"

READ_CHUNK = 1 << 18  # compressed bytes read at a time

CUT = "the compressed stream ends before its end marker (the tail was cut)"

# Deflate's largest ratio: one 258-byte match per ~2 bits of input gives at most 1032:1.
MAX_RATIO = 1032


class Members:
    """Decompressed bytes of a gzip file, member after member (see the module doc).

    ``read(n)`` returns up to n bytes, b"" at the end. The end is the end of the file after a
    complete member (zero padding after a member is skipped, as gzip does), or the damage:
    a member cut short, corrupt data, or bytes after a member that are not another member.
    Then ``error`` says what it was, and every byte before it has been returned."""

    def __init__(self, f: BinaryIO, chunk: int = READ_CHUNK):
        self.f = f
        self.chunk = chunk
        self.z: zlib._Decompress | None = None  # the current member's; None between members
        self.pending = b""  # compressed bytes read from f but not yet decompressed
        self.members = 0  # members read to their end (trailer checked by zlib: CRC and size)
        self.done = False
        self.error: str | None = None

    def _fill(self) -> bool:
        """Read more compressed bytes into ``pending``; False at the end of the file."""
        data = self.f.read(self.chunk)
        self.pending += data
        return bool(data)

    def _start_member(self) -> bool:
        """Between members: skip zero padding and start the next member's decompressor. False
        (``done`` set) at the end of the file, or on bytes that do not start a member."""
        while True:
            self.pending = self.pending.lstrip(b"\x00")
            if len(self.pending) >= len(GZIP_MAGIC):
                break
            if not self._fill():
                break
        if not self.pending:
            self.done = True  # a clean end (after zero padding or none)
            return False
        if self.members and not self.pending.startswith(GZIP_MAGIC):
            self.done = True
            self.error = (
                f"the data after gzip member {self.members} is not gzip (ignored; everything before it was read)"
            )
            return False
        self.z = zlib.decompressobj(31)  # 31: a gzip header and trailer around the deflate stream
        return True

    def read(self, n: int) -> bytes:
        chunks: list[bytes] = []
        got = 0
        try:
            while got < n and not self.done:
                if self.z is None and not self._start_member():
                    break
                z = self.z
                assert z is not None
                at_end = not self.pending and not self._fill()
                # at the file's end zlib may still hold output of what it consumed: drain it
                data = z.decompress(self.pending, n - got)
                if data:
                    chunks.append(data)
                    got += len(data)
                if z.eof:
                    # the leftover after this member's trailer is in unused_data (CPython may also
                    # leave it in unconsumed_tail: never read that once the member has ended)
                    self.pending = z.unused_data
                    self.z = None
                    self.members += 1
                else:
                    self.pending = z.unconsumed_tail
                    if at_end and not data:
                        self.done = True
                        self.error = CUT
        except zlib.error as exc:
            self.done = True
            self.error = f"corrupt compressed data ({exc})"
        except OSError as exc:
            self.done = True
            self.error = f"corrupt compressed data ({exc})"
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def content_size(path: Path, unknown_ratio: int = MAX_RATIO) -> int:
    """The decompressed size of a gzip file as far as its trailer tells; for planning only.

    The trailer's ISIZE is the LAST member's size mod 4 GiB. Taken: the smallest size of that
    remainder that a gzip of this many bytes can hold, i.e. at least the compressed size less
    its headers and block overhead (deflate never shrinks data below its stored size, so a
    smaller ISIZE means the size wrapped past 4 GiB, or the trailer is not the truth) and at
    most MAX_RATIO times it (deflate's limit). That is exact for one member under 4 GiB,
    whatever the ratio (no 50x cap: issue 46, finding 14). A trailer no gzip of this size can
    have (past MAX_RATIO: a cut file ends in deflate data, not a trailer; zero padding; a
    liar) says nothing: ``unknown_ratio`` times the compressed size is taken instead (the
    batch planner keeps MAX_RATIO, the most it can be; the pipes of one file a likelier ratio).

    Short of the truth for content of 4 GiB or more whose remainder happens to look possible,
    and for a file of several members (the trailer counts the last one only; where that is
    small against the whole, the estimate comes out large and the file goes alone). A batch
    therefore counts the bytes it really decompresses against its temp budget
    (ingest/_shared.py), and a file past it goes the one-file path."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - 4))
        est = int.from_bytes(f.read(4), "little")
    # headers (a file name, extra fields), trailers and 5 bytes per stored 64 KiB block
    least = size - size // 256 - 4096
    while est < least:
        est += 1 << 32
    return est if est <= MAX_RATIO * size else unknown_ratio * size
