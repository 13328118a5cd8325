"""The learner protocol: what a continual run asks of a model, whatever the model is.

A target memory (:class:`growmem.nadaraya.TargetMemory`), an order-free baseline
(:mod:`growmem.order_free`: kNN, NCM, SLDA) and a growing network (a ``Trainer`` behind
:class:`growmem.continual.learner.NetworkLearner`) all answer the same five calls, so a loop, a
byte count or a checkpoint holds any of them the same way:

* ``observe(x, y)`` — learn from one batch of inputs ``(B, d)`` and integer labels ``(B,)``; returns
  what the step measured (a loss, rows stored...);
* ``predict(x, batch_size)`` — scores ``(B, classes)``;
* ``state()`` / ``load_state(state)`` — everything learned, as arrays (what a checkpoint saves), and back;
* ``nbytes()`` — bytes counted against a memory budget: ``bytes_in_use``, ``bytes_allocated``,
  ``rows_in_use``, ``rows_in_use_bytes``, ``rows_allocated_bytes`` and the rest of the model's state;
* ``rows()`` — rows in use per part (``{"regime0": n}``, ``{"block_0": n, "readout": n}``).

``fixed_shapes``: True where ``state()`` keeps its array shapes as rows come and go (a network's
preallocated capacity: restored into a template of those shapes), False where the arrays grow (a
target memory's rows: restored by path, any length).
"""
from __future__ import annotations

from typing import Any, Dict, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Learner(Protocol):
    fixed_shapes: bool

    def observe(self, x, y) -> dict: ...

    def predict(self, x, batch_size: int = 1024) -> np.ndarray: ...

    def state(self) -> Any: ...

    def load_state(self, state) -> None: ...

    def nbytes(self) -> Dict[str, int]: ...

    def rows(self) -> Dict[str, int]: ...
