"""The growing memory: a pytree of rows ``(w, k, ṽ, born)`` plus the row count.

Capacity is preallocated and grown geometrically on the host, so a run that
appends N rows compiles the jitted code O(log N) times (one trace per distinct
capacity), not N times. Every jitted operation here is shape-polymorphic only
through the capacity; the number of rows in use lives on the device in
``size``.

Shapes (C = capacity):
    w:    (C,)          scalar weight (weighted softmax); 1 for RBF/linear rows; float32
    k:    (C, d_in)     key, stored in the row dtype (float32, or bfloat16 to halve the bytes)
    v:    (C, d_out)    value: ṽ = w·v for weighted softmax (Eq. 8), v otherwise; row dtype
    born: (C,)          step that created the row (int32; -1 for initial rows D0)
    size: ()            rows in use (int32); rows [size, C) are unused padding (all zero)
    t:    ()            the memory's clock: training steps completed (int32); rows
                        appended by step t+1 are born t+1
    ext:  whatever the memory's backend needs inside a jitted step (e.g. how many rows a
          disk tier holds; :mod:`growmem.backends`), or None

Static metadata (part of the pytree structure, so part of every jitted program):
    spec:    the layer's :class:`growmem.GrowingSpec` (kernel, temperature, rule...)
    policy:  the :class:`growmem.policies.Policy` that grows it (installed by the trainer), or None
    backend: where the rows live (:mod:`growmem.backends`); None means in RAM on one device

Row order: appends pack admitted rows after ``size`` in batch order; :func:`select`
compacts kept rows in order; :func:`evict_and_append` (a policy step that evicts) puts new
rows into the holes evicted rows leave, so the table is in arrival order only until the
first eviction — ``born`` always tells the order.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from .errors import ConfigError

#: rows are always allocated in multiples of this many (and chunked by it)
ROW_QUANTUM = 256
#: ``born`` of rows that belong to the initial database D0: never momentum-scaled
BORN_INITIAL = -1
#: row storage dtypes a spec may ask for (keys and values; ``w`` stays float32)
ROW_DTYPES = ("float32", "bfloat16")
#: the per-row fields, in order
FIELDS = ("w", "k", "v", "born")


def round_capacity(n: int, quantum: int = ROW_QUANTUM) -> int:
    """Smallest multiple of ``quantum`` that holds ``n`` rows (at least one quantum)."""
    n = max(int(n), 1)
    return ((n + quantum - 1) // quantum) * quantum


def finite_rows(*arrays):
    """``(B,)`` bool: the rows (leading axis) whose entries are finite in every array of ``arrays`` — the one
    non-finite filter before anything enters a memory (numpy arrays on the host, jax arrays under jit)."""
    xp = jnp if any(isinstance(a, jax.Array) for a in arrays) else np
    ok = None
    for a in arrays:
        f = xp.isfinite(a)
        f = f.all(axis=tuple(range(1, f.ndim))) if f.ndim > 1 else f
        ok = f if ok is None else ok & f
    return ok


def stored_rows(w, k, v, row_dtype=np.float32):
    """Host rows ``(w, k, v)`` at the dtypes a memory stores them (``w`` float32, ``k`` and ``v`` at
    ``row_dtype``) — cast before :func:`finite_rows`, so that a value past the stored dtype's range
    (a float64 1e300, a float32 3.4e38 in bfloat16) is seen as the inf it would become."""
    rd = row_dtype if isinstance(row_dtype, np.dtype) else np.dtype(row_dtype)
    return (np.asarray(w, np.float32), np.asarray(k, np.float32).astype(rd, copy=False),
            np.asarray(v, np.float32).astype(rd, copy=False))


@struct.dataclass
class Memory:
    """Rows of one growing layer (module docstring)."""

    w: jax.Array
    k: jax.Array
    v: jax.Array
    born: jax.Array
    size: jax.Array
    t: jax.Array
    ext: Any = None
    spec: Any = struct.field(pytree_node=False, default=None)
    policy: Any = struct.field(pytree_node=False, default=None)
    backend: Any = struct.field(pytree_node=False, default=None)

    @property
    def capacity(self) -> int:
        return int(self.k.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.k.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.v.shape[1])

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row (``w``, ``k``, ``v``, ``born`` at their stored dtypes)."""
        return row_bytes(self.d_in, self.d_out, self.k.dtype, self.w.dtype)

    def rows(self) -> dict:
        """The rows in use on the device as numpy arrays (host copy; syncs with the device).

        A memory whose ``size`` is a vector holds its rows in equal blocks, one per shard
        (:mod:`growmem.backends.sharded`): the blocks' rows in use, in block order."""
        size = np.asarray(self.size)
        if size.ndim == 0:
            n = int(size)
            return {f: np.asarray(getattr(self, f))[:n] for f in FIELDS}
        cs = self.capacity // len(size)
        out = {}
        for f in FIELDS:
            a = np.asarray(getattr(self, f))
            out[f] = np.concatenate([a[j * cs:j * cs + int(n)] for j, n in enumerate(size)])
        return out


def row_bytes(d_in: int, d_out: int, dtype=np.float32, w_dtype=np.float32) -> int:
    """Bytes of one row: ``k`` and ``v`` in ``dtype``, ``w`` in ``w_dtype``, an int32 ``born``."""
    return np.dtype(dtype).itemsize * (d_in + d_out) + np.dtype(w_dtype).itemsize + 4


def row_dtype(name) -> jnp.dtype:
    """The jnp dtype of a row-dtype name (``"float32"``, ``"bfloat16"``)."""
    name = getattr(name, "name", name)
    if str(name) not in ROW_DTYPES:
        raise ConfigError(f"row dtype must be one of {ROW_DTYPES}, got {name!r}")
    return jnp.dtype(str(name))


def empty(d_in: int, d_out: int, capacity: int = ROW_QUANTUM, *, dtype=jnp.float32, row_dtype=None,
          spec=None) -> Memory:
    """A memory with no rows in use and room for ``capacity`` (rounded up) rows.

    ``dtype`` is the dtype of ``w``; ``row_dtype`` (default ``dtype``) that of ``k`` and ``v``.
    """
    if d_in <= 0 or d_out <= 0:
        raise ConfigError(f"memory dimensions must be positive, got d_in={d_in}, d_out={d_out}")
    c = round_capacity(capacity)
    rd = dtype if row_dtype is None else row_dtype
    return Memory(
        w=jnp.zeros((c,), dtype),
        k=jnp.zeros((c, d_in), rd),
        v=jnp.zeros((c, d_out), rd),
        born=jnp.zeros((c,), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        t=jnp.zeros((), jnp.int32),
        spec=spec,
    )


def from_rows(w, k, v, born=None, *, capacity: Optional[int] = None, spec=None, row_dtype=None) -> Memory:
    """A memory holding exactly the given rows (plus padding up to ``capacity``)."""
    k = jnp.asarray(k)
    v = jnp.asarray(v)
    w = jnp.asarray(w, jnp.float32 if k.dtype == jnp.bfloat16 else k.dtype)
    n = k.shape[0]
    if k.ndim != 2 or v.ndim != 2 or w.shape != (n,) or v.shape[0] != n:
        raise ConfigError(
            f"rows must be w:(N,), k:(N,d_in), v:(N,d_out) with one N; got w{tuple(w.shape)}, "
            f"k{tuple(k.shape)}, v{tuple(v.shape)}")
    born = jnp.full((n,), BORN_INITIAL, jnp.int32) if born is None else jnp.asarray(born, jnp.int32)
    mem = empty(k.shape[1], v.shape[1], max(n, capacity or 0), dtype=w.dtype,
                row_dtype=k.dtype if row_dtype is None else row_dtype, spec=spec)
    return mem.replace(
        w=mem.w.at[:n].set(w), k=mem.k.at[:n].set(k.astype(mem.k.dtype)), v=mem.v.at[:n].set(v.astype(mem.v.dtype)),
        born=mem.born.at[:n].set(born), size=jnp.asarray(n, jnp.int32))


def pad_rows_to(a, capacity: int):
    """``a`` (per-row leading axis) padded with zeros, or cut, to ``capacity`` rows."""
    old = a.shape[0]
    if capacity > old:
        return jnp.pad(a, [(0, capacity - old)] + [(0, 0)] * (a.ndim - 1))
    return a[:capacity]


def with_capacity(mem: Memory, capacity: int, quantum: int = ROW_QUANTUM) -> Memory:
    """Host op: a copy of ``mem`` whose arrays hold ``capacity`` rows rounded up to ``quantum`` (1: exactly;
    never truncates rows in use)."""
    c = round_capacity(capacity, quantum)
    if c < int(mem.size):
        raise ConfigError(f"cannot shrink a memory of {int(mem.size)} rows to capacity {c}")
    if c == mem.capacity:
        return mem
    return mem.replace(**{f: pad_rows_to(getattr(mem, f), c) for f in FIELDS})


def append(mem: Memory, w, k, v, born, mask=None) -> Memory:
    """Append candidate rows where ``mask`` is True, packed contiguously after ``size``.

    Pure and jittable. ``w:(B,)``, ``k:(B,d_in)``, ``v:(B,d_out)``, ``born``: scalar or
    ``(B,)``, ``mask:(B,)`` bool. Rows that do not fit in the capacity are dropped and
    ``size`` saturates at the capacity: make room first with :func:`growmem.backends.make_room`
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
        k=set_rows(mem.k, idx, k),
        v=set_rows(mem.v, idx, v),
        born=mem.born.at[idx].set(born, mode="drop"),
        size=new_size,
    )


def set_rows(table, idx, rows):
    """``table.at[idx].set(rows, mode="drop")`` in the table's dtype. bfloat16 tables are written
    through their uint16 bits: XLA's CPU backend otherwise widens the whole table to float32 for
    the scatter and narrows it back (two full copies per append)."""
    rows = jnp.asarray(rows).astype(table.dtype)
    if table.dtype != jnp.bfloat16:
        return table.at[idx].set(rows, mode="drop")
    bits = lax.bitcast_convert_type(table, jnp.uint16).at[idx].set(lax.bitcast_convert_type(rows, jnp.uint16),
                                                                    mode="drop")
    return lax.bitcast_convert_type(bits, jnp.bfloat16)


def compact_fn(keep, size):
    """``(a -> a')``: moves the entries ``i < size`` of ``a``'s leading axis where ``keep:(C,)``
    is True to the front, in order, with zeros after (jittable). Used by :func:`select` and for
    per-row state that must follow the rows."""
    keep = jnp.asarray(keep, bool)
    keep = keep & (jnp.arange(keep.shape[0]) < size)
    cap = keep.shape[0]
    idx = jnp.where(keep, jnp.cumsum(keep.astype(jnp.int32)) - 1, cap)
    return lambda a: jnp.zeros_like(a).at[idx].set(a, mode="drop")


def select(mem: Memory, keep) -> Memory:
    """Keep the rows in use where ``keep:(C,)`` is True, compacted to the front in order (jittable)."""
    cap = mem.k.shape[0]
    keep = jnp.asarray(keep, bool) & (jnp.arange(cap) < mem.size)
    z = compact_fn(keep, mem.size)
    return mem.replace(**{f: z(getattr(mem, f)) for f in FIELDS}, size=keep.sum(dtype=jnp.int32))


def valid_mask(mem: Memory) -> jax.Array:
    """``(C,)`` bool: rows in use."""
    return jnp.arange(mem.k.shape[0]) < mem.size


def is_memory(x) -> bool:
    return isinstance(x, Memory)


# ---------------------------------------------------------------------------------------------
# eviction and appends in one pass, touching only the rows that change


def _first_true(mask, n: int, fill: int):
    """Indices of the first ``n`` True entries of ``mask`` (``fill`` past the last one)."""
    return jnp.nonzero(mask, size=n, fill_value=fill)[0].astype(jnp.int32)


def relocate(arrays: Sequence[jax.Array], news: Sequence[Optional[jax.Array]], keep, mask, size, *,
             max_moves: int):
    """Drop the rows in use where ``keep:(C,)`` is False and add the candidates where
    ``mask:(B,)`` is True, for several per-row arrays at once, in place; ``-> (arrays, new_size)``.

    ``news[j]`` holds the candidates' entries for ``arrays[j]`` (``(B, ...)``; None: zeros).
    The admitted candidates fill the holes the evicted rows leave (then the space after
    ``size``); the kept rows past the new size move into the holes still open, and the rows
    they leave are zeroed. The moves run ``max_moves`` rows at a time in a loop whose trip count
    is what the step needs (none when the candidates fill every hole, the common case at a
    cap): only the rows that change are touched and the table is never copied, however many
    rows leave. Candidates that do not fit in the capacity are dropped. Rows ``[new_size, C)``
    are zero.
    """
    cap = arrays[0].shape[0]
    b = mask.shape[0]
    k = max(int(max_moves), 1)
    idx = jnp.arange(cap, dtype=jnp.int32)
    valid = idx < size
    keep = jnp.asarray(keep, bool) & valid
    mask = jnp.asarray(mask, bool)
    n_keep = keep.sum(dtype=jnp.int32)
    n_new = jnp.minimum(mask.sum(dtype=jnp.int32), cap - n_keep)
    # only the first n_new admitted candidates fit
    mask = mask & (jnp.cumsum(mask.astype(jnp.int32)) <= n_new)
    new_size = n_keep + n_new
    holes = valid & ~keep
    n_holes = holes.sum(dtype=jnp.int32)
    news = [jnp.zeros((b,) + a.shape[1:], a.dtype) if n is None else jnp.asarray(n).astype(a.dtype)
            for a, n in zip(arrays, news)]
    cand = _first_true(mask, b, b)                          # admitted candidates, in batch order
    hole = _first_true(holes, b, cap)                       # the first B holes, in order
    rank = jnp.arange(b, dtype=jnp.int32)
    # destination of the j-th admitted candidate: the j-th hole, then size, size+1, ...
    dest = jnp.where(rank < n_holes, hole[jnp.minimum(rank, b - 1)], size + rank - n_holes)
    dest = jnp.where(rank < n_new, dest, cap)
    # holes left below new_size (the candidates did not take them) get the kept rows at or past
    # new_size: two lists of equal length, sources all >= new_size > destinations, so the moves
    # commute and can run a chunk at a time
    left = holes & (idx < new_size) & (jnp.cumsum(holes.astype(jnp.int32)) > n_new)
    n_moves = left.sum(dtype=jnp.int32)
    pad = (-cap) % k
    fill_to = jnp.pad(_first_true(left, cap, cap), (0, pad + k), constant_values=cap)
    fill_from = jnp.pad(_first_true(keep & (idx >= new_size), cap, cap), (0, pad + k), constant_values=cap)
    n_clear = jnp.maximum(size - new_size, 0)               # rows [new_size, size) end up unused

    def moves(i, arrays):
        to = lax.dynamic_slice(fill_to, (i * k,), (k,))
        src = lax.dynamic_slice(fill_from, (i * k,), (k,))
        return [a.at[to].set(a.at[jnp.minimum(src, cap - 1)].get(mode="clip"), mode="drop") for a in arrays]

    def clears(i, arrays):
        rows = new_size + i * k + jnp.arange(k, dtype=jnp.int32)
        rows = jnp.where(rows < new_size + n_clear, rows, cap)
        return [a.at[rows].set(jnp.zeros((k,) + a.shape[1:], a.dtype), mode="drop") for a in arrays]

    out = lax.fori_loop(0, (n_moves + k - 1) // k, moves, list(arrays))
    out = lax.fori_loop(0, (n_clear + k - 1) // k, clears, out)
    out = [set_rows(a, dest, new[cand]) for a, new in zip(out, news)]
    return out, new_size


def evict_and_append(mem: Memory, keep, w, k, v, born, mask, *, max_moves: Optional[int] = None,
                     extra: Sequence[jax.Array] = (), extra_new: Sequence[Optional[jax.Array]] = ()):
    """:func:`relocate` the memory's rows (and ``extra`` per-row arrays, whose new entries are
    ``extra_new``'s ``(B, ...)`` candidates' values, zero where None or not given):
    ``-> (mem, extra)``. ``max_moves`` defaults to the number of candidates."""
    b = k.shape[0]
    born = jnp.broadcast_to(jnp.asarray(born, jnp.int32), (b,))
    arrays = [mem.w, mem.k, mem.v, mem.born, *extra]
    extra_new = list(extra_new) + [None] * (len(extra) - len(extra_new))
    news = [w, k, v, born] + extra_new
    out, new_size = relocate(arrays, news, keep, mask, mem.size, max_moves=b if max_moves is None else max_moves)
    return mem.replace(w=out[0], k=out[1], v=out[2], born=out[3], size=new_size), out[4:]
