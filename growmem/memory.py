"""The growing memory: a pytree of rows ``(w, k, ṽ, born)`` plus the row count.

Capacity is preallocated and grown geometrically on the host, so a run that
appends N rows compiles the jitted code O(log N) times (one trace per distinct
capacity), not N times. Every jitted operation here is shape-polymorphic only
through the capacity; the number of rows in use lives on the device in
``size``.

Shapes (C = capacity):
    w:    (C,)          scalar weight (weighted softmax); 1 for RBF/linear rows
    k:    (C, d_in)     key
    v:    (C, d_out)    value: ṽ = w·v for weighted softmax (Eq. 8), v otherwise
    born: (C,)          step that created the row (int32; -1 for initial rows D0)
    size: ()            rows in use (int32); rows [size, C) are unused padding
    t:    ()            the memory's clock: training steps completed (int32); rows
                        appended by step t+1 are born t+1
    cold: None, or a view of older rows that spilled to a TensorStore tier
          (:mod:`growmem.storage.spill`): retrieval and novelty search see them too
    shards: None, or the mesh axis the rows are sharded over (static; rows
          ``[s·C/S, (s+1)·C/S)`` live on shard ``s``)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

#: rows are always allocated in multiples of this many (and chunked by it)
ROW_QUANTUM = 256
#: ``born`` of rows that belong to the initial database D0: never momentum-scaled
BORN_INITIAL = -1


def round_capacity(n: int, quantum: int = ROW_QUANTUM) -> int:
    """Smallest multiple of ``quantum`` that holds ``n`` rows (at least one quantum)."""
    n = max(int(n), 1)
    return ((n + quantum - 1) // quantum) * quantum


@struct.dataclass
class Memory:
    """Rows of one growing layer. ``spec`` is static metadata (kernel, rule...)."""

    w: jax.Array
    k: jax.Array
    v: jax.Array
    born: jax.Array
    size: jax.Array
    t: jax.Array
    #: rows beyond this memory that retrieval must also see: a view of the layer's cold tier
    #: (:class:`growmem.storage.spill.ColdView`; rows that spilled to disk), or None
    cold: Any = None
    spec: Any = struct.field(pytree_node=False, default=None)
    #: static: the rows are sharded along their axis over a device mesh
    #: (:class:`growmem.storage.sharded.RowShards`); retrieval and novelty search then run
    #: per shard and merge. None: one device
    shards: Any = struct.field(pytree_node=False, default=None)

    @property
    def capacity(self) -> int:
        return int(self.k.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.k.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.v.shape[1])

    def rows(self) -> dict:
        """The rows in use as numpy arrays (host copy; syncs with the device)."""
        n = int(self.size)
        return {
            "w": np.asarray(self.w[:n]),
            "k": np.asarray(self.k[:n]),
            "v": np.asarray(self.v[:n]),
            "born": np.asarray(self.born[:n]),
        }


def empty(d_in: int, d_out: int, capacity: int = ROW_QUANTUM, *, dtype=jnp.float32, spec=None) -> Memory:
    """A memory with no rows in use and room for ``capacity`` (rounded up) rows."""
    if d_in <= 0 or d_out <= 0:
        raise ValueError(f"memory dimensions must be positive, got d_in={d_in}, d_out={d_out}")
    c = round_capacity(capacity)
    return Memory(
        w=jnp.zeros((c,), dtype),
        k=jnp.zeros((c, d_in), dtype),
        v=jnp.zeros((c, d_out), dtype),
        born=jnp.zeros((c,), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        t=jnp.zeros((), jnp.int32),
        spec=spec,
    )


def from_rows(w, k, v, born=None, *, capacity: Optional[int] = None, spec=None) -> Memory:
    """A memory holding exactly the given rows (plus padding up to ``capacity``)."""
    k = jnp.asarray(k)
    v = jnp.asarray(v)
    w = jnp.asarray(w, k.dtype)
    n = k.shape[0]
    if k.ndim != 2 or v.ndim != 2 or w.shape != (n,) or v.shape[0] != n:
        raise ValueError(
            f"rows must be w:(N,), k:(N,d_in), v:(N,d_out) with one N; got w{tuple(w.shape)}, "
            f"k{tuple(k.shape)}, v{tuple(v.shape)}")
    born = jnp.full((n,), BORN_INITIAL, jnp.int32) if born is None else jnp.asarray(born, jnp.int32)
    mem = empty(k.shape[1], v.shape[1], max(n, capacity or 0), dtype=k.dtype, spec=spec)
    return mem.replace(
        w=mem.w.at[:n].set(w), k=mem.k.at[:n].set(k), v=mem.v.at[:n].set(v),
        born=mem.born.at[:n].set(born), size=jnp.asarray(n, jnp.int32))


def with_capacity(mem: Memory, capacity: int) -> Memory:
    """Host op: a copy of ``mem`` whose arrays hold ``capacity`` rows (never truncates rows in use)."""
    c = round_capacity(capacity)
    if c < int(mem.size):
        raise ValueError(f"cannot shrink a memory of {int(mem.size)} rows to capacity {c}")
    old = mem.capacity
    if c == old:
        return mem

    def fit(a):
        if c > old:
            pad = [(0, c - old)] + [(0, 0)] * (a.ndim - 1)
            return jnp.pad(a, pad)
        return a[:c]

    return mem.replace(w=fit(mem.w), k=fit(mem.k), v=fit(mem.v), born=fit(mem.born))


def ensure_capacity(mem: Memory, extra: int, *, growth: float = 2.0) -> Memory:
    """Host op: make room for ``extra`` more rows, growing capacity geometrically.

    Syncs ``size`` with the device only when the rows might not fit.
    """
    if growth <= 1.0:
        raise ValueError(f"growth factor must be > 1, got {growth}")
    need = int(mem.size) + int(extra)
    if need <= mem.capacity:
        return mem
    return with_capacity(mem, max(need, int(np.ceil(mem.capacity * growth))))


def append(mem: Memory, w, k, v, born, mask=None) -> Memory:
    """Append candidate rows where ``mask`` is True, packed contiguously after ``size``.

    Pure and jittable. ``w:(B,)``, ``k:(B,d_in)``, ``v:(B,d_out)``, ``born``: scalar or
    ``(B,)``, ``mask:(B,)`` bool. Rows that do not fit in the capacity are dropped and
    ``size`` saturates at the capacity: make room first with :func:`ensure_capacity`
    (the trainer does this for you).
    """
    b = k.shape[0]
    if mask is None:
        mask = jnp.ones((b,), bool)
    mask = jnp.asarray(mask, bool)
    born = jnp.broadcast_to(jnp.asarray(born, jnp.int32), (b,))
    cap = mem.k.shape[0]
    # position of each admitted row: size + (number of admitted rows before it)
    pos = mem.size + jnp.cumsum(mask.astype(jnp.int32)) - 1
    idx = jnp.where(mask, pos, cap)  # index `cap` is out of bounds -> dropped
    new_size = jnp.minimum(mem.size + mask.sum(dtype=jnp.int32), cap)
    return mem.replace(
        w=mem.w.at[idx].set(jnp.asarray(w, mem.w.dtype), mode="drop"),
        k=mem.k.at[idx].set(jnp.asarray(k, mem.k.dtype), mode="drop"),
        v=mem.v.at[idx].set(jnp.asarray(v, mem.v.dtype), mode="drop"),
        born=mem.born.at[idx].set(born, mode="drop"),
        size=new_size,
    )


def compact_fn(keep, size):
    """``(a -> a')``: moves the entries ``i < size`` of ``a``'s leading axis where ``keep:(C,)``
    is True to the front, in order, with zeros after (jittable). Used by :func:`select` and for
    per-row state that must follow the rows (optimizer moments)."""
    keep = jnp.asarray(keep, bool)
    keep = keep & (jnp.arange(keep.shape[0]) < size)
    cap = keep.shape[0]
    idx = jnp.where(keep, jnp.cumsum(keep.astype(jnp.int32)) - 1, cap)
    return lambda a: jnp.zeros_like(a).at[idx].set(a, mode="drop")


def select(mem: Memory, keep) -> Memory:
    """Keep the rows in use where ``keep:(C,)`` is True, compacted to the front (jittable)."""
    cap = mem.k.shape[0]
    keep = jnp.asarray(keep, bool) & (jnp.arange(cap) < mem.size)
    z = compact_fn(keep, mem.size)
    return mem.replace(w=z(mem.w), k=z(mem.k), v=z(mem.v), born=z(mem.born),
                       size=keep.sum(dtype=jnp.int32))


def valid_mask(mem: Memory) -> jax.Array:
    """``(C,)`` bool: rows in use."""
    return jnp.arange(mem.k.shape[0]) < mem.size


def is_memory(x) -> bool:
    return isinstance(x, Memory)
