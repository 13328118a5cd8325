"""Errors every floor of growmem may raise (the bottom floor: imports nothing of growmem)."""
from __future__ import annotations


class GrowmemError(Exception):
    """Base class of every error growmem raises on purpose: ``except GrowmemError`` catches them all."""


class UsageError(GrowmemError):
    """A problem with a command line or its inputs: the ``growmem`` command prints it as one line, exit code 2."""


class RunError(GrowmemError):
    """A run that failed on its way (disk full, a diverged loss): one line, exit code 1."""


class ConfigError(GrowmemError, ValueError):
    """A configuration or an argument that cannot work: an invalid preset file (the message names the file,
    the key and what is allowed), a budget too small for what it must hold, arrays of the wrong shape, a value
    out of its range. A ``ValueError`` too, so ``except ValueError`` still catches it."""


class NumericalError(GrowmemError, FloatingPointError):
    """A computation that came out non-finite: a factorisation that failed in float32, a diverged loss."""


class WrongTypeError(GrowmemError, TypeError):
    """An argument of the wrong kind of object (the message names what was expected); a ``TypeError`` too."""


class CheckpointError(GrowmemError, RuntimeError):
    """A checkpoint cannot be written or read."""


class IncompatibleVersionError(CheckpointError):
    """The checkpoint was written in a format this version of growmem cannot read."""


class CorruptCheckpointError(CheckpointError):
    """A file of the checkpoint is missing, truncated or does not match its checksum."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written by a model with a different configuration."""
