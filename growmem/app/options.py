"""What the ``growmem`` commands share before they import anything heavy: the argument parser that
reports a bad option as one line, argparse types for bounded numbers, and the checks and claims of
``--out`` / ``--checkpoint-dir`` (:mod:`growmem.locks`). ``growmem.app.cli`` and the sub-commands
(``growmem.app.continual``, ...) import them from here, so no command imports ``growmem.app.cli`` back."""
from __future__ import annotations

import argparse
import math

from growmem.errors import CheckpointError, ConfigError, UsageError
from growmem.locks import LockedError, RunFolders, check_run_folder


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option as one line (no usage dump): ``growmem CMD: message``; an option's value
    that starts like a negative number (``--ram-budget -1MB``) is read as its value, to be refused by its
    type, not as an unknown option."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")

    def parse_known_args(self, args=None, namespace=None):
        import re
        import sys

        args = list(sys.argv[1:] if args is None else args)
        out, i = [], 0
        while i < len(args):
            a = args[i]
            action = self._option_string_actions.get(a)
            if action is not None and action.nargs is None and i + 1 < len(args) and \
                    re.match(r"^-[0-9.]", args[i + 1]):
                out.append(f"{a}={args[i + 1]}")
                i += 2
                continue
            out.append(a)
            i += 1
        return super().parse_known_args(out, namespace)


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


def _int(lo, what, hi=None):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return v
    return parse


#: the largest seed every consumer takes (NumPy, JAX without x64, torch): a signed 32-bit integer
SEED_MAX = 2 ** 31 - 1


def _size(text):
    """An argparse type: a positive size (``512MB``, ``1.5GB``, ``4096``) in bytes
    (:func:`growmem.units.byte_budget`)."""
    from growmem.units import byte_budget

    try:
        return byte_budget(str(text), what="a size")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _temperature(text):
    """An argparse type: a kernel temperature (:func:`growmem.units.check_temperature`)."""
    from growmem.units import MIN_TEMPERATURE, check_temperature

    try:
        return check_temperature(float(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"must be a finite number >= {MIN_TEMPERATURE}, got {text}") from None


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
