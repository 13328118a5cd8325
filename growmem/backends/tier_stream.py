"""What a jitted step sees of the cold rows (:mod:`growmem.backends.tiered`): the open tiers of this
process (:class:`ColdStore`, found by a static :class:`ColdRef`), the chunk reads on the host (the native
FFI target or a ``pure_callback``) and the streaming reductions over the cold chunks."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..errors import ConfigError
from .. import kernels, native
from .tier_files import FIELDS, TierError
from .tier_format import ColdTier

def _padded(rows, n, chunk_rows, shapes):
    """A chunk of ``n`` rows zero-padded to ``chunk_rows`` (so every chunk compiles to one program)."""
    if n == chunk_rows and all(len(a) == chunk_rows for a in rows.values()):
        return rows
    out = {}
    for f, a in rows.items():
        p = np.zeros((chunk_rows,) + shapes[f], a.dtype)
        p[:n] = a[:n]
        out[f] = p
    return out


def aged(rows: Dict[str, np.ndarray], lo: int, seg_start, seg_t, t: int, retention: float, weighted: bool):
    """Cold rows ``lo, lo+1, …`` with ``v`` (and ``w`` when ``weighted``) scaled by
    ``retention^(t − t_spill)``: the weight decay (Eq. 21/90) a row missed since its block
    spilled at step ``t_spill`` (block ``j`` starts at row ``seg_start[j]``, spilled at ``seg_t[j]``)."""
    if retention == 1.0 or "v" not in rows or len(seg_start) == 0:
        return rows
    seg_start, seg_t = np.asarray(seg_start, np.int64), np.asarray(seg_t, np.int64)
    seg = np.searchsorted(seg_start, lo + np.arange(len(rows["v"])), side="right") - 1
    age = np.maximum(t - seg_t[np.maximum(seg, 0)], 0)
    f = np.power(retention, age, dtype=np.float64)
    rows = dict(rows)
    rows["v"] = (rows["v"].astype(np.float32) * f[:, None].astype(np.float32)).astype(rows["v"].dtype)
    if weighted:
        rows["w"] = rows["w"] * f.astype(rows["w"].dtype)
    return rows


# ---------------------------------------------------------------------------------------------
# what a jitted step sees


@dataclasses.dataclass(frozen=True)
class ColdRef:
    """Static (hashable) handle on an open :class:`ColdStore` (part of the jitted program)."""

    key: str
    d_in: int
    d_out: int
    chunk_rows: int
    dtype: str = "float32"


# open cold stores of this process, by ColdRef.key (a view in a jitted program finds its tier here)
_STORES: Dict[str, Any] = {}
# the keys of this process's Tiered backends: tier-0, tier-1, ...
_KEYS = itertools.count()
# cold rows of every shard of a sharded layer, by ColdRef.key, as last gathered (every process knows all of them;
# the view's ``n`` holds only this process's shards)
_SHARD_COUNTS: Dict[str, np.ndarray] = {}


def _store(key: str, shard: int = 0) -> "ColdStore":
    try:
        s = _STORES[key]
    except KeyError:
        raise TierError(f"the cold tier {key} is not open in this process: build the trainer with its Tiered "
                        f"backend (or restore the checkpoint into one) before using this state") from None
    return s[shard] if isinstance(s, dict) else s


@struct.dataclass
class ColdView:
    """How many cold rows a step may read (``n``: a scalar, or ``(S,)`` per shard) and a static
    bound on their chunks (a power of two: a growing tier recompiles O(log N) times)."""

    n: jax.Array
    ref: ColdRef = struct.field(pytree_node=False)
    max_chunks: int = struct.field(pytree_node=False, default=1)


def _chunk_bound(rows: int, chunk_rows: int) -> int:
    need = max(1, -(-int(rows) // chunk_rows))
    return 1 << (need - 1).bit_length()


def _read(view: ColdView, i, n, t, shard, fields):
    """Cold chunk ``i`` (rows aged to step ``t``) of a shard's tier, read on the host by a callback."""
    ref, c = view.ref, view.ref.chunk_rows
    rd = jnp.dtype(ref.dtype)
    shapes = {"w": ((c,), jnp.float32), "k": ((c, ref.d_in), rd), "v": ((c, ref.d_out), rd),
              "born": ((c,), jnp.int32)}
    out = tuple(jax.ShapeDtypeStruct(*shapes[f]) for f in fields)
    if native.cold_reads(_host_read):
        if tuple(f for f in FIELDS if f in fields) != tuple(fields):
            raise ConfigError(f"cold read fields {fields} must follow the order of {FIELDS}")
        scalar = lambda a: jnp.asarray(a, jnp.int32)
        call = jax.ffi.ffi_call(native.COLD_READ_TARGET, out, vmap_method="sequential")
        return call(scalar(i), scalar(n), scalar(t), scalar(shard), key=ref.key,
                    fields=np.int32(sum(1 << FIELDS.index(f) for f in fields)))
    cb = lambda i, n, t, s: _store(ref.key, int(s)).read_chunk(int(i), int(n), int(t), fields)
    return jax.pure_callback(cb, out, i, n, t, shard, vmap_method="sequential")


def _host_read(key: str, i: int, n: int, t: int, shard: int, fields: int):
    """The host side of the native cold read: chunk ``i`` of the tier ``key`` (``fields``: a bit per
    entry of FIELDS), each field as the bytes of its C-contiguous array."""
    names = tuple(f for j, f in enumerate(FIELDS) if fields >> j & 1)
    return tuple(np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                 for a in _store(key, shard).read_chunk(i, n, t, names))


def cold_partial(kern, view: ColdView, n, shard, q, t, coeff_fn, temperature):
    """The kernel's partial over a tier's first ``n`` cold rows at clock ``t`` (a rematerialised
    scan over the chunks, each read by a host callback)."""
    t = jnp.asarray(t, jnp.int32)
    c = view.ref.chunk_rows
    b = q.shape[0]

    @jax.checkpoint
    def body(carry, i):
        def run(carry):
            w, k, v, born = _read(view, i, n, t, shard, FIELDS)
            n_valid = jnp.clip(n - i * c, 0, c)
            coeff = None if coeff_fn is None else coeff_fn(born, t)
            p = kernels.reduce(kern, q, k, v, w, temperature=temperature, coeff=coeff, size=n_valid, chunk=c,
                               row_grads=False)
            return kernels.merge(carry, p)

        return jax.lax.cond(i * c < n, run, lambda carry: carry, carry), None

    out, _ = jax.lax.scan(body, kern.empty(b, view.ref.d_out, q.dtype), jnp.arange(view.max_chunks, dtype=jnp.int32))
    return out


def cold_min_sq_distance(view: ColdView, n, shard, q):
    """``(B,)``: ``min_j ‖q − k_j‖²`` over a tier's first ``n`` cold keys (``inf`` without any)."""
    q = jax.lax.stop_gradient(q)
    c = view.ref.chunk_rows
    t = jnp.zeros((), jnp.int32)

    def body(best, i):
        def run(best):
            (k,) = _read(view, i, n, t, shard, ("k",))
            n_valid = jnp.clip(n - i * c, 0, c)
            return jnp.minimum(best, kernels.min_sq_distance(q, k, size=n_valid))

        return jax.lax.cond(i * c < n, run, lambda b: b, best), None

    best, _ = jax.lax.scan(body, jnp.full((q.shape[0],), jnp.inf, q.dtype), jnp.arange(view.max_chunks, dtype=jnp.int32))
    return best


# ---------------------------------------------------------------------------------------------
# one layer's (or shard's) cold rows on the host


class ColdStore:
    """A :class:`ColdTier` plus the step each spilled block was aged to (lazy weight decay) and
    the read-ahead state of the callbacks."""

    def __init__(self, tier: ColdTier, retention: float, weighted: bool, read_ahead: int = 2, seg_start=(),
                 seg_t=()):
        self.tier, self.retention, self.weighted, self.read_ahead = tier, float(retention), weighted, int(read_ahead)
        self.seg_start = np.asarray(seg_start, np.int64).reshape(-1)
        self.seg_t = np.asarray(seg_t, np.int64).reshape(-1)
        self._pending: Dict[tuple, dict] = {}
        self._last = None

    @property
    def rows(self) -> int:
        return self.tier.rows

    def spill(self, rows: Dict[str, np.ndarray], t: int):
        """Append ``rows`` (already aged to step ``t``) to the tier (all-or-nothing)."""
        start = self.rows
        self._pending.clear()
        self.tier.write(rows)
        self.seg_start = np.append(self.seg_start, start)
        self.seg_t = np.append(self.seg_t, int(t))

    def _aged(self, rows, lo: int, n: int, t: int):
        rows = _padded(rows, n, self.tier.chunk_rows, self.tier.shapes())
        if n == 0:
            return rows
        return aged(rows, lo, self.seg_start, self.seg_t, t, self.retention, self.weighted)

    def read_chunk(self, i: int, n: int, t: int, fields=FIELDS):
        """Host side of a cold read: chunk ``i`` of the first ``n`` cold rows, padded and aged to
        ``t``; reads of the next ``read_ahead`` chunks in the direction of travel (forward pass
        up, rematerialised backward pass down) are put in flight."""
        c = self.tier.chunk_rows
        n = min(int(n), self.rows)
        n_chunks = -(-n // c)
        fields = tuple(fields)
        issue = lambda j: self.tier.issue(j * c, min(n, (j + 1) * c), fields)
        futs = self._pending.pop((i, n, fields), None) or issue(i)
        if i == 0 or i == n_chunks - 1:   # a pass starts at an end
            step = 1 if i == 0 else -1
        else:
            step = -1 if self._last is not None and i < self._last else 1
        self._last = i
        ahead = {(j, n, fields) for j in range(i + step, i + step * (self.read_ahead + 1), step) if 0 <= j < n_chunks}
        for key in list(self._pending):
            if key not in ahead:
                del self._pending[key]
        for key in ahead:
            if key not in self._pending:
                self._pending[key] = issue(key[0])
        rows = self.tier.collect(futs)
        rows = self._aged(rows, i * c, max(0, min(c, n - i * c)), t)
        return tuple(np.ascontiguousarray(rows[f], self.tier.dt(f)) for f in fields)

    def all_rows(self, t: int) -> Dict[str, np.ndarray]:
        """Every cold row, aged to step ``t`` (only for tiers that fit in RAM: tests, export)."""
        out = {f: [] for f in FIELDS}
        lo = 0
        for rows, c in self.tier.chunks():
            rows = self._aged(rows, lo, c, t)
            lo += c
            for f in FIELDS:
                out[f].append(np.array(rows[f][:c]))
        shapes = self.tier.shapes()
        return {f: (np.concatenate(p) if p else np.zeros((0,) + shapes[f], self.tier.dt(f))) for f, p in out.items()}

    def compact(self, t: int, evict: Callable, aged_rows: bool = True) -> int:
        """Drop the cold rows ``evict(rows, n, lo) -> keep`` refuses (rows aged to ``t`` when
        ``aged_rows``); returns the rows removed."""
        masks = []

        def keep(rows, lo):
            n = len(rows["w"])
            view = self._aged(rows, lo, n, t) if aged_rows else rows
            k = np.asarray(evict(view, n, lo), bool)[:n]
            masks.append(k)
            return k

        before = self.rows
        self._pending.clear()               # read-ahead of the old generation
        self.tier.compact(keep)
        kept = np.concatenate(masks) if masks else np.zeros(0, bool)
        # the block boundaries move with the rows: a block now starts after the rows kept before it
        before_start = np.concatenate([[0], np.cumsum(kept)])
        self.seg_start = before_start[np.minimum(self.seg_start, len(kept))]
        return before - self.rows

    def reference(self) -> dict:
        return {"url": self.tier.url, "generation": self.tier.generation, "rows_cold": self.rows,
                "owner": self.tier.owner, "chunk_rows": self.tier.chunk_rows, "dtype": str(self.tier.dtype),
                "spill": {"seg_start": self.seg_start.tolist(), "seg_t": self.seg_t.tolist()}}
