"""Checkpoints of everything a run needs to resume exactly (Orbax), and their inspection.

* :mod:`growmem.checkpoint.manager` — :class:`Checkpointer`: Orbax's ``CheckpointManager``
  (atomic steps: a temporary folder renamed when complete; the last ``keep`` kept) over
  three items — the JSON description, the host arrays (raw ``.npy`` files with CRC32s,
  written at the speed of the disk) and the arrays sharded over devices (Orbax's standard
  PyTree handler: each process writes and reads only its own shards). Every memory is
  saved by asking its backend for its items (:meth:`growmem.backends.RAM.save`): rows in
  use, global row arrays of a sharded memory, a disk tier by reference.
* :mod:`growmem.checkpoint.inspect` — the summary ``growmem inspect`` prints (checksums
  verified) and ``growmem export``'s plain-numpy dump of every layer's rows.
"""
from .manager import (CheckpointError, Checkpointer, ConfigMismatchError, CorruptCheckpointError,
                      IncompatibleVersionError, Restored, spec_from_json, spec_to_json)
from .inspect import export, format_inspect, inspect

__all__ = ["Checkpointer", "Restored", "CheckpointError", "ConfigMismatchError", "CorruptCheckpointError",
           "IncompatibleVersionError", "spec_to_json", "spec_from_json", "inspect", "format_inspect", "export"]
