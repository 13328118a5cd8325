"""Errors every floor of growmem may raise (the bottom floor: imports nothing of growmem)."""
from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read."""


class IncompatibleVersionError(CheckpointError):
    """The checkpoint was written in a format this version of growmem cannot read."""


class CorruptCheckpointError(CheckpointError):
    """A file of the checkpoint is missing, truncated or does not match its checksum."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written by a model with a different configuration."""
