"""Exclusive advisory locks on folders a run writes (checkpoints, disk tiers).

A lock is ``fcntl.flock`` on ``FOLDER/.growmem.lock``, holding the owner's pid for the message.
It is taken once per process (several handles in one process share it, counted) and released
when the last is closed or the process ends — a killed run leaves no stale lock. Folders given
as URLs (``gs://``, ``memory://``) are not locked.
"""
from __future__ import annotations

import fcntl
import os
from typing import Dict, Tuple

LOCK_NAME = ".growmem.lock"
_HELD: Dict[str, Tuple[int, int]] = {}


class LockedError(RuntimeError):
    """Another process is writing to the folder."""


def acquire(folder, what: str) -> str:
    """Lock ``folder`` (created if needed) for this process; ``what`` names it in the error."""
    folder = os.path.abspath(os.fspath(folder))
    if folder in _HELD:
        fd, n = _HELD[folder]
        _HELD[folder] = (fd, n + 1)
        return folder
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = os.pread(fd, 32, 0).decode().strip() or "?"
        except OSError:
            pid = "?"
        os.close(fd)
        raise LockedError(f"{what} {folder} is in use by another growmem process (pid {pid}); wait for it to end, "
                          f"or use another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[folder] = (fd, 1)
    return folder


def release(folder):
    """Drop one hold of this process on ``folder``; the lock goes with the last."""
    folder = os.path.abspath(os.fspath(folder))
    if folder not in _HELD:
        return
    fd, n = _HELD[folder]
    if n > 1:
        _HELD[folder] = (fd, n - 1)
        return
    del _HELD[folder]
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
