"""The raw floor: what one durable write costs on this disk, with nothing on top."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from .measure import Contender

RECORD = b"x" * 299 + b"\n"  # a 300-byte record


def append_fsync(directory: Path, stack: ExitStack) -> Contender:
    path = directory / "floor-append.log"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    stack.callback(os.close, fd)

    def step(i: int) -> None:
        os.write(fd, RECORD)
        os.fsync(fd)

    return Contender("raw: 300 B append + fsync", step, writes=1, key="floor")


def pwrite_fdatasync(directory: Path, stack: ExitStack, n: int) -> Contender:
    path = directory / "floor-prealloc.dat"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    stack.callback(os.close, fd)
    slots = n + 1000
    os.write(fd, b"\0" * slots * len(RECORD))
    os.fsync(fd)

    def step(i: int) -> None:
        os.pwrite(fd, RECORD, (i % slots) * len(RECORD))
        os.fdatasync(fd)

    return Contender(
        "raw: 300 B pwrite, preallocated + fdatasync", step, writes=1, key="floor_pwrite"
    )
