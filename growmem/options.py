"""What the ``growmem`` commands share before they import anything heavy: the argument parser that
reports a bad option as one line, argparse types for bounded numbers, and the checks and claims of
``--out`` / ``--checkpoint-dir`` (:mod:`growmem.locks`). ``growmem.cli`` and the sub-commands
(``growmem.continual.cli``, ...) import them from here, so no command imports ``growmem.cli`` back."""
from __future__ import annotations

import argparse
import math

from .errors import CheckpointError, UsageError
from .locks import LockedError, RunFolders, check_run_folder


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option as one line (no usage dump): ``growmem CMD: message``."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _finite(lo=None, lo_open=False, hi=None, hi_open=False, what="a number"):
    """An argparse type: a finite float within the bounds."""
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        ok = math.isfinite(v) and (lo is None or (v > lo if lo_open else v >= lo)) and \
            (hi is None or (v < hi if hi_open else v <= hi))
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return v
    return parse


def _int(lo, what):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return v
    return parse


def check_folders(kind: str, checkpoint_dir, resume: bool, out):
    """--out and --checkpoint-dir as ``growmem <kind>`` may use them (:func:`growmem.locks.check_run_folder`:
    not a file; a checkpoint folder no other command wrote; --resume over one that holds a run, a new run
    over one that does not), checked without touching them; a refusal is a :class:`UsageError`."""
    if resume and checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir")
    try:
        check_run_folder(out, option="--out")
        if checkpoint_dir is not None:
            check_run_folder(checkpoint_dir, kind, resume=resume)
    except CheckpointError as e:
        raise UsageError(str(e)) from None


def claim_folders(kind: str, checkpoint_dir, resume: bool, out):
    """:class:`growmem.locks.RunFolders` for a command: --out locked, --checkpoint-dir checked,
    locked and marked ``kind``; a refusal is a :class:`UsageError`."""
    try:
        return RunFolders(kind, checkpoint_dir, resume=resume, out=out)
    except (CheckpointError, LockedError) as e:
        raise UsageError(str(e)) from None
