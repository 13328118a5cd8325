"""Where a memory's rows live: one protocol, three implementations.

A *backend* is a small static (hashable) object attached to a :class:`growmem.memory.Memory`
(``mem.backend``; None means :data:`RAM`). Everything that depends on where rows live goes
through it — and only through it:

inside a jitted step
    ``reduce(kernel, mem, q, coeff_fn, row_grads)``  the kernel's partial result over every row
                                                   (chunks, shards and disk tiers merged by the
                                                   kernel's log-sum-exp rule)
    ``min_sq_distance(mem, q, chunk)``              novelty search over every row
    ``valid_mask(mem)``, ``append(...)``, ``evict_and_append(...)``  row bookkeeping
on the host, between steps
    ``attach(mem, name)``         take a fresh memory (placement, tiers opened)
    ``prepare(mem, extra, bound)``  make room for ``extra`` rows (grow the capacity, spill to disk)
    ``rows_in_use(mem)``, ``host_rows(mem)``         counts and a host copy (export, tests)
    ``save(name, mem)`` / ``restore(name, meta, arrays, template)``   checkpoint items

Implementations: :class:`RAM` (device arrays of one device), :class:`growmem.backends.sharded.Sharded`
(rows split over the devices of a mesh, across processes too; each shard with its own rows in
use), :class:`growmem.backends.tiered.Tiered` (newest rows in RAM, older rows in a TensorStore
tier on disk, per shard when combined with :class:`Sharded`). The trainer takes one with
``Trainer(model, backend=...)``; :class:`growmem.store.Store` uses the same objects
for a memory outside any trainer.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from .. import kernels
from .. import memory as memlib


class RAM:
    """Rows as device arrays on one device (the default backend)."""

    name = "ram"
    n_shards = 1

    def __repr__(self):
        return "RAM()"

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self))

    # ------------------------------------------------------------------ inside a jitted step
    def reduce(self, kern, mem, q, coeff_fn, *, row_grads: bool):
        coeff = None if coeff_fn is None else coeff_fn(mem.born, mem.t)
        return kernels.reduce(kern, q, mem.k, mem.v, mem.w, temperature=_temperature(mem), coeff=coeff,
                              size=mem.size, chunk=mem.spec.chunk if mem.spec is not None else kernels.DEFAULT_CHUNK,
                              row_grads=row_grads)

    def min_sq_distance(self, mem, q, chunk: int = kernels.NOVELTY_CHUNK):
        return kernels.min_sq_distance(q, mem.k, size=mem.size, chunk=chunk)

    def valid_mask(self, mem):
        return memlib.valid_mask(mem)

    def append(self, mem, w, k, v, born, mask=None):
        return memlib.append(mem, w, k, v, born, mask)

    def evict_and_append(self, mem, keep, w, k, v, born, mask, extra=(), extra_new=()):
        return memlib.evict_and_append(mem, keep, w, k, v, born, mask, extra=extra, extra_new=extra_new)

    # ------------------------------------------------------------------ on the host
    def register(self, mem, name: str = "memory"):
        """Announce a memory before any is attached (a budget shared by layers is split over all)."""

    def attach(self, mem, name: str = "memory"):
        """Take a fresh memory: placement, tiers opened; returns the memory as this backend keeps it."""
        return mem.replace(backend=None if type(self) is RAM else self)

    def prepare(self, mem, extra: int, bound: int, growth: float = 2.0, limit: Optional[int] = None):
        """``(mem, exact_rows or None)``: room for ``extra`` more rows. ``bound`` is an upper
        bound on the rows in use the caller keeps without syncing; the exact count is read
        (and returned) only when the rows might not fit. ``limit``: the memory never holds more
        rows than this after a step (a capacity policy's ``max_rows``: its evictions make the
        room), so the capacity stops growing there."""
        def room(n):            # rows the step may add on top of n rows in use
            return extra if limit is None else min(extra, max(int(limit) - n, 0))

        if bound + room(bound) <= mem.capacity:
            return mem, None
        exact = int(mem.size)
        if exact + room(exact) <= mem.capacity:
            return mem, exact
        target = max(exact + extra, int(np.ceil(mem.capacity * growth)))
        if limit is not None:
            target = max(min(target, int(limit)), exact + room(exact))
        return memlib.with_capacity(mem, target), exact

    def fill(self, mem) -> int:
        """The count a step's new rows must fit under (rows in use; the fullest shard when sharded)."""
        return int(mem.size)

    def resize_rows(self, a, old: int, new: int):
        """A per-row array (e.g. a policy's row state) from ``old`` to ``new`` rows, laid out like
        this backend's rows."""
        return memlib.pad_rows_to(a, new)

    def compact(self, mem, evict=None, keep=None):
        """Prune rows kept off the device (nothing to do in RAM); see :meth:`Tiered.compact`."""
        return mem

    def cold_rows(self, mem) -> int:
        return 0

    def due_compaction(self) -> bool:
        """Whether the trainer should prune the rows kept off the device now."""
        return False

    def rows_in_use(self, mem) -> int:
        return int(mem.size)

    def hot_rows(self, mem) -> int:
        return int(mem.size)

    def host_rows(self, mem) -> Dict[str, np.ndarray]:
        return mem.rows()

    def place(self, x):
        """Put a non-memory state leaf where this backend's computations run."""
        return x

    def place_rows(self, a):
        """Put a per-row array (a policy's row state) where this backend keeps the rows."""
        return a

    def check_restore(self, meta: dict, name: str):
        """Refuse, before any I/O, a saved memory this backend cannot restore."""

    def save(self, name: str, mem) -> Tuple[Dict[str, Any], dict]:
        """``(arrays, meta)`` of a memory for a checkpoint: the rows in use (host numpy)."""
        rows = self.host_rows(mem)
        return rows, {"backend": self.name}

    def restore(self, name: str, meta: dict, arrays: Dict[str, Any], template):
        """A memory like ``template`` holding the saved rows, at the saved capacity (so it
        compiles to the same program: resuming is bitwise)."""
        n, cap = int(meta["size"]), int(meta.get("capacity", template.capacity))
        out = {}
        for f in memlib.FIELDS:
            cur = getattr(template, f)
            a = np.asarray(arrays[f]) if n else None
            if n and n == cap and a.dtype == np.dtype(cur.dtype):
                out[f] = jnp.asarray(a)            # a full memory: no padded host copy
                continue
            buf = np.zeros((cap,) + tuple(cur.shape[1:]), np.dtype(cur.dtype))
            if n:
                buf[:n] = a
            out[f] = jnp.asarray(buf)
        return template.replace(**out, size=jnp.asarray(n, jnp.int32), t=jnp.asarray(meta["t"], jnp.int32))


#: the default backend
DEFAULT = RAM()


def of(mem) -> RAM:
    """The backend of a memory (:data:`DEFAULT` when it has none)."""
    return DEFAULT if mem.backend is None else mem.backend


def make_room(mem, extra: int, bound: int, growth: float = 2.0, limit: Optional[int] = None):
    """``(mem, bound)``: the host drivers' one make-room step (:class:`~growmem.Trainer`,
    :class:`~growmem.store.Store`) — ``mem``'s backend prepares room for ``extra`` rows (:meth:`RAM.prepare`:
    grow the capacity geometrically by ``growth``, spill, never past ``limit``), and the caller's ``bound`` on
    the rows in use (kept without a sync) becomes the exact count where one was read, or the new memory's
    :meth:`RAM.fill`."""
    be = of(mem)
    new, exact = be.prepare(mem, extra, bound, growth, limit=limit)
    if exact is not None:
        bound = exact
    if new is not mem:
        bound = be.fill(new)
    return new, bound


def _temperature(mem):
    return mem.spec.temperature if mem.spec is not None else 1.0


# ---------------------------------------------------------------------------------------------
# dispatch: what layers and policies call


def reduce(mem, q, *, row_grads: bool = False, coeff_fn=None):
    """The partial result of the memory's kernel over all its rows, wherever they live."""
    kern = kernels.get(mem.spec.kernel)
    return of(mem).reduce(kern, mem, q, coeff_fn, row_grads=row_grads)


def min_sq_distance(mem, q, *, chunk: int = kernels.NOVELTY_CHUNK):
    """``(B,)`` ``min_j ‖q_b − k_j‖²`` over every stored row (``inf`` without rows)."""
    return of(mem).min_sq_distance(mem, q, chunk)


def valid_mask(mem):
    return of(mem).valid_mask(mem)
