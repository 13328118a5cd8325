"""Storage tiers: device sharding, the TensorStore cold tier, Orbax checkpoints.

* :mod:`growmem.storage.sharded` — a memory sharded along its row axis over a
  ``jax.sharding.Mesh``; per-shard partial results merged by the log-sum-exp rule.
* :mod:`growmem.storage.tiered` — newest rows hot in RAM, older rows cold in
  TensorStore (zarr v3) arrays, streamed with read-ahead at retrieval.
* :mod:`growmem.storage.spill` — training past the RAM budget: a trainer's oldest rows
  spill to TensorStore tiers and every step still sees them (``Trainer.enable_spill``).
* :mod:`growmem.storage.checkpoint` — Orbax checkpoints of everything a run needs
  to resume exactly; ``inspect`` and ``export`` for the ``growmem`` command.

The submodules import lazily so ``import growmem`` stays light.
"""
from __future__ import annotations

import importlib

__all__ = ["sharded", "tiered", "spill", "checkpoint"]


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
