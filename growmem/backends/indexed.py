"""Rows in RAM, read through an inverted-file index once there are enough of them (:mod:`growmem.index`).

``Indexed(n_lists, nprobe, train_at)`` behaves as :class:`~growmem.backends.RAM` until a memory holds
``train_at`` rows; between two steps it then trains ``n_lists`` k-means centroids on the rows in use and
indexes them (the index lives in ``mem.ext["ivf"]``), and from there on:

- a step's retrieval attends over the rows of the ``nprobe`` nearest lists only (:func:`growmem.index.reduce`;
  the local kernels only: weighted softmax, RBF, Nadaraya–Watson); with ``shared=True`` each query over the
  union of the lists its batch probes, gathered once and reduced by the exact kernel;
- appended rows join the list of their nearest centroid inside the jitted step;
- before each step the lists are checked for room for the step's rows (one device read of the fullest
  list's count); a list that could overflow doubles every list's capacity, each row kept in its
  list (:func:`growmem.index.widen`), so no row is ever left where no query reads it.

Evicting policies move rows and are refused (an error when the step is traced). Novelty search stays
exact. The index is saved with the rows, so a resumed run reads the same lists (bitwise).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import index as ivf
from .. import kernels
from .. import memory as memlib
from ..errors import ConfigError
from . import RAM, _temperature

#: the index's arrays in a checkpoint, by field of :class:`growmem.index.IVF`
SAVED = ("centroids", "lists", "counts")


class Indexed(RAM):
    """Rows in RAM, read through an inverted-file index (module docstring)."""

    name = "indexed"

    def __init__(self, n_lists: int, nprobe: int, *, train_at: Optional[int] = None, shared: bool = False,
                 iters: int = 10, sample_per_list: int = 64, seed: int = 0):
        for what, v, lo in (("n_lists", n_lists, 1), ("nprobe", nprobe, 1), ("iters", iters, 1),
                            ("sample_per_list", sample_per_list, 1)):
            if not ivf.is_count(v, lo):
                raise ConfigError(f"Indexed {what} must be an integer >= {lo}, got {v!r}")
        if nprobe > n_lists:
            raise ConfigError(f"Indexed nprobe ({nprobe}) cannot exceed n_lists ({n_lists})")
        train_at = 16 * int(n_lists) if train_at is None else train_at
        if not ivf.is_count(train_at, n_lists):
            raise ConfigError(f"Indexed train_at must be an integer >= n_lists ({n_lists}): k-means starts from "
                              f"that many rows; got {train_at!r}")
        self.n_lists, self.nprobe, self.train_at = int(n_lists), int(nprobe), int(train_at)
        self.iters, self.sample_per_list, self.seed = int(iters), int(sample_per_list), int(seed)
        self.shared = bool(shared)

    def _key(self):
        return (type(self), self.n_lists, self.nprobe, self.train_at, self.shared, self.iters, self.sample_per_list,
                self.seed)

    def __repr__(self):
        return (f"Indexed(n_lists={self.n_lists}, nprobe={self.nprobe}, train_at={self.train_at}, "
                f"shared={self.shared})")

    def __eq__(self, other):
        return isinstance(other, Indexed) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    # ------------------------------------------------------------------ inside a jitted step
    def reduce(self, kern, mem, q, coeff_fn, *, row_grads: bool):
        ix = None if mem.ext is None else mem.ext.get("ivf")
        if ix is None:
            return super().reduce(kern, mem, q, coeff_fn, row_grads=row_grads)
        coeff = None if coeff_fn is None else coeff_fn(mem.born, mem.t)
        k, v, w = (mem.k, mem.v, mem.w) if row_grads else jax.lax.stop_gradient((mem.k, mem.v, mem.w))
        return ivf.reduce(kern, ix, q, k, v, w, nprobe=self.nprobe, temperature=_temperature(mem), coeff=coeff,
                          shared=self.shared, row_grads=row_grads)

    def append(self, mem, w, k, v, born, mask=None):
        out = memlib.append(mem, w, k, v, born, mask)
        ix = None if mem.ext is None else mem.ext.get("ivf")
        if ix is None:
            return out
        m = jnp.ones((k.shape[0],), bool) if mask is None else jnp.asarray(mask, bool)
        ids = mem.size + jnp.cumsum(m.astype(jnp.int32)) - 1          # where memory.append put each row
        return out.replace(ext={**mem.ext, "ivf": ivf.add_rows(ix, k, ids, m & (ids < mem.capacity))})

    def evict_and_append(self, mem, keep, w, k, v, born, mask, extra=(), extra_new=()):
        raise ConfigError("the Indexed backend keeps rows where they were appended; an evicting policy "
                          "(capacity, weight-decay pruning) moves them: use the RAM backend for it")

    # ------------------------------------------------------------------ on the host
    def attach(self, mem, name: str = "memory"):
        if mem.spec is not None and not kernels.get(mem.spec.kernel).exponential:
            raise ConfigError(f"memory {name!r}: the {mem.spec.kernel} kernel is not local; the Indexed backend "
                              f"serves weighted_softmax, rbf and nadaraya_watson layers")
        return mem.replace(backend=self)

    def prepare(self, mem, extra: int, bound: int, growth: float = 2.0, limit: Optional[int] = None):
        mem, exact = super().prepare(mem, extra, bound, growth, limit)
        ix = None if mem.ext is None else mem.ext.get("ivf")
        if ix is None:
            if max(bound, exact or 0) < self.train_at:
                return mem, exact
            exact = int(mem.size) if exact is None else exact
            if exact < self.train_at:
                return mem, exact
            return self._build(mem, exact, extra), exact
        fullest = int(ix.counts.max())
        if fullest + extra <= ix.list_capacity:
            return mem, exact
        cap = ix.list_capacity
        while fullest + extra > cap:
            cap *= 2
        return mem.replace(ext={**mem.ext, "ivf": ivf.widen(ix, cap)}), exact

    def _build(self, mem, n: int, extra: int):
        c = ivf.train_centroids(mem.k, self.n_lists, key=jax.random.key(self.seed), iters=self.iters, size=n,
                                sample=self.sample_per_list * self.n_lists)
        # room for the fullest list of the rows' nearest assignment, and for the next step's rows
        return self._index(mem, c, n, ivf.list_capacity_for(mem.k, c, size=n) + int(extra))

    def _index(self, mem, centroids, n: int, list_capacity: int):
        """``mem`` with every row in use assigned to ``centroids``' lists of ``list_capacity`` rows."""
        kern = mem.spec.kernel if mem.spec is not None else "weighted_softmax"
        ix = ivf.empty(centroids, list_capacity, overflow=0, kernel=kern)
        for a in range(0, n, ivf.ASSIGN_CHUNK):
            b = min(n, a + ivf.ASSIGN_CHUNK)
            ix = ivf.add(ix, mem.k[a:b].astype(jnp.float32), jnp.arange(a, b, dtype=jnp.int32),
                         alternatives=self.n_lists)
        return mem.replace(ext={**(mem.ext or {}), "ivf": ix})

    def save(self, name: str, mem) -> Tuple[Dict[str, Any], dict]:
        arrays, meta = super().save(name, mem)
        meta = {**meta, "backend": self.name}
        ix = None if mem.ext is None else mem.ext.get("ivf")
        if ix is not None:
            arrays.update({f"ivf_{f}": np.asarray(getattr(ix, f)) for f in SAVED})
            meta["ivf"] = {"form": ix.form}
        return arrays, meta

    def restore(self, name: str, meta: dict, arrays: Dict[str, Any], template):
        mem = super().restore(name, meta, {f: arrays[f] for f in memlib.FIELDS if f in arrays}, template)
        if "ivf" not in meta:
            return mem
        c, lists, counts = (np.asarray(arrays[f"ivf_{f}"]) for f in SAVED)
        ix = ivf.empty(c, lists.shape[1], overflow=0, kernel=mem.spec.kernel).replace(
            lists=jnp.asarray(lists, jnp.int32), counts=jnp.asarray(counts, jnp.int32))
        return mem.replace(ext={**(mem.ext or {}), "ivf": ix})
