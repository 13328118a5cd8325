"""The folders a run writes (checkpoints, disk tiers, outputs): exclusive locks, and the marker
that says which command wrote a folder.

A lock is ``fcntl.flock`` on ``FOLDER/.growmem.lock``, holding the owner's pid for the message.
It is taken once per process (several handles in one process share it, counted) and released
when the last is closed or the process ends — a killed run leaves no stale lock. Folders given
as URLs (``gs://``, ``memory://``) are not locked.

A checkpoint folder of a command holds ``FOLDER/.growmem-run.json`` (``{"kind": "train" |
"continual", ...}``), written when the command first claims the folder (:class:`RunFolder`).
Every command that resumes from a folder or writes into it checks the marker first
(:func:`check_run_folder`): a folder another command wrote is refused, naming that command, and
``--resume`` over a folder that holds no run says so instead of starting afresh.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import weakref
from typing import Dict, Optional, Tuple

from .errors import CheckpointError, GrowmemError

LOCK_NAME = ".growmem.lock"
MARK_NAME = ".growmem-run.json"
MARK_FORMAT = "growmem-run"
MARK_VERSION = 1
#: what a folder written before markers existed holds, by the file that shows it (a continual
#: run's ``run.json``; a train run's numbered Orbax step folders are recognised by their names)
_LEGACY_FILES = {"run.json": "continual"}
_HELD: Dict[str, Tuple[int, int]] = {}
#: the open :class:`RunFolder` of each folder this process claimed (a second claim in the process nests in it)
_CLAIMS: Dict[str, "RunFolder"] = {}


class LockedError(GrowmemError, RuntimeError):
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


# ----------------------------------------------------------------------------- which command wrote a folder

def _entries(folder: str):
    """What a folder holds besides the lock and the marker (and a marker being written); None if absent."""
    try:
        return [n for n in os.listdir(folder) if n != LOCK_NAME and not n.startswith(MARK_NAME)]
    except FileNotFoundError:
        return None


def written_by(folder) -> Optional[str]:
    """The command kind that wrote ``folder``: its marker's ``kind``; for a folder written
    before markers existed, ``"continual"`` (a ``run.json``) or ``"train"`` (numbered step
    folders); None for a missing or empty folder; ``"?"`` for files no growmem command wrote."""
    folder = os.fspath(folder)
    mark = os.path.join(folder, MARK_NAME)
    try:
        with open(mark) as f:
            doc = json.load(f)
    except FileNotFoundError:
        doc = None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mark} is unreadable or corrupt ({e}); it names the command that wrote {folder}: "
                              f"remove it only if that folder holds nothing of another run") from None
    if doc is not None:
        if doc.get("format") != MARK_FORMAT or not isinstance(doc.get("kind"), str):
            raise CheckpointError(f"{mark} is not a growmem run marker; pass another folder")
        return doc["kind"]
    names = _entries(folder)
    if not names:
        return None
    for name, kind in _LEGACY_FILES.items():
        if name in names:
            return kind
    if any(n.isdigit() and os.path.isdir(os.path.join(folder, n)) for n in names):
        return "train"
    return "?"


def check_run_folder(folder, kind: Optional[str] = None, *, resume: bool = False,
                     option: str = "--checkpoint-dir") -> None:
    """Refuse (:class:`CheckpointError`) a folder ``growmem <kind>`` must not use: a file; a
    folder another command wrote; one of files no growmem command wrote; with ``resume``, one that
    holds no run to resume; without it, one that already holds a run of ``kind``. ``kind=None``
    (an output folder): only the first. Touches nothing."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise CheckpointError(f"{option} {folder} is a file; pass a folder")
    if kind is None:
        return
    other = written_by(folder)
    if other is None:
        if resume:
            state = "is empty" if os.path.isdir(folder) else "does not exist"
            raise CheckpointError(f"--resume: {option} {folder} {state}, so there is no run to resume; check the "
                                  f"path, or start a new run without --resume")
        return
    if other == "?":
        raise CheckpointError(f"{option} {folder} holds files that no growmem command wrote (no {MARK_NAME}); pass "
                              f"a new or empty folder")
    if other != kind:
        raise CheckpointError(f"{option} {folder} holds a `growmem {other}` run; `growmem {kind}` neither resumes "
                              f"nor writes into it: pass another {option}")
    if not resume and _entries(folder):
        raise CheckpointError(f"{option} {folder} already holds a `growmem {kind}` run; pass --resume to continue "
                              f"it, or another {option}")


class RunFolder:
    """A folder one run writes: checked (:func:`check_run_folder`), created if needed, locked for
    this process and, for a command's checkpoint folder (``kind``), marked with ``kind``.

    :meth:`close` releases it; ``close(failed=True)`` also removes what claiming it created when
    the run wrote nothing into it (the marker; the folder, and the parents this hold created), so
    a run that fails before writing anything leaves nothing behind. A hold that is never closed
    is released when it is garbage-collected (or when the process ends). Every refusal is a
    :class:`CheckpointError` naming the option, or :class:`LockedError`.

    A second claim of a folder this process holds (a command's, then the library function it
    calls) is checked alike and nests in the first: the first's :meth:`close` decides. Files the
    run writes as part of starting (:meth:`own`) go too when it fails."""

    def __init__(self, folder, kind: Optional[str] = None, *, resume: bool = False, option: str = "--checkpoint-dir"):
        self.folder = os.path.abspath(os.fspath(folder))
        self.kind = kind
        check_run_folder(self.folder, kind, resume=resume, option=option)
        self._closed = False
        self._outer = _CLAIMS.get(self.folder)
        if self._outer is not None:
            return
        self._owned = set()
        self._top = None                # the outermost folder this hold creates (parents included)
        up = self.folder
        while not os.path.exists(up):
            self._top, up = up, os.path.dirname(up)
        try:
            acquire(self.folder, f"{option} folder")
        except OSError as e:
            raise CheckpointError(f"{option} {folder} is not writable ({e.strerror or e}); pass a folder you can "
                                  f"write to") from None
        self._finalizer = weakref.finalize(self, _unclaim, self.folder)
        _CLAIMS[self.folder] = self
        self.marked = False
        try:
            if kind is not None and not os.path.exists(os.path.join(self.folder, MARK_NAME)):
                _write_mark(self.folder, kind)
                self.marked = True
        except OSError as e:
            self.close(failed=True)
            raise CheckpointError(f"{option} {folder} is not writable ({e.strerror or e}); pass a folder you can "
                                  f"write to") from None

    def own(self, name: str):
        """``name`` (a file in the folder) was written to start the run: it goes if the run fails."""
        (self._outer or self)._owned.add(name)

    def close(self, failed: bool = False):
        if self._closed or self._outer is not None:
            return
        self._closed = True
        try:
            if failed and set(_entries(self.folder) or ()) <= self._owned:
                for name in self._owned:
                    try:
                        os.remove(os.path.join(self.folder, name))
                    except OSError:
                        pass
                self._undo()
        finally:
            self._finalizer()           # releases the lock once

    def _undo(self):
        if self.marked:
            try:
                os.remove(os.path.join(self.folder, MARK_NAME))
            except OSError:
                return
        last = _HELD.get(self.folder, (None, 1))[1] == 1      # no other hold of this process needs the lock file
        if last and self._top is not None and not os.path.exists(os.path.join(self.folder, MARK_NAME)):
            try:
                os.remove(os.path.join(self.folder, LOCK_NAME))
                d = self.folder
                while True:             # the folder, then the parents this hold created, while empty
                    os.rmdir(d)
                    if d == self._top:
                        break
                    d = os.path.dirname(d)
            except OSError:
                pass


class RunFolders:
    """The folders one run of ``growmem <kind>`` writes: ``out`` (its results: locked, so that a
    second run writing the same results is refused) and ``checkpoint_dir`` (checked, locked and
    marked :class:`RunFolder`); either may be None. ``close(failed=...)`` closes both."""

    def __init__(self, kind: str, checkpoint_dir=None, *, resume: bool = False, out=None):
        if resume and checkpoint_dir is None:
            raise CheckpointError("--resume needs --checkpoint-dir (resume=True needs a checkpoint_dir)")
        self.held = []
        self.checkpoints: Optional[RunFolder] = None
        try:
            if out is not None:
                self.held.append(RunFolder(out, option="--out"))
            if checkpoint_dir is not None:
                self.checkpoints = RunFolder(checkpoint_dir, kind, resume=resume)
                self.held.append(self.checkpoints)
        except BaseException:
            self.close(failed=True)
            raise

    def close(self, failed: bool = False):
        for h in reversed(self.held):
            h.close(failed=failed)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(failed=exc_type is not None)


def _unclaim(folder: str):
    _CLAIMS.pop(folder, None)
    release(folder)


def _write_mark(folder: str, kind: str):
    """The marker, written to a temporary file and renamed into place (never half-written)."""
    from .version import __version__

    doc = {"format": MARK_FORMAT, "version": MARK_VERSION, "kind": kind, "growmem_version": __version__,
           "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    tmp = os.path.join(folder, f"{MARK_NAME}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, MARK_NAME))
