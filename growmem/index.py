"""Inverted-file (IVF) retrieval: kernel attention over the rows of a query's nearest lists only.

An exact layer reads every row at every step, so a step costs O(N). The weighted softmax, the RBF
kernel and the Nadaraya–Watson estimator put almost all their weight on the rows nearest a query
(``e^{s_i}`` with ``s_i = α⟨k_i, q⟩`` or ``−α‖q − k_i‖²``), so attending over the rows of the
``nprobe`` lists whose centroids are nearest the query approximates the exact result at a cost that
depends on ``nprobe × list_capacity``, not on N (FAISS's IndexIVFFlat; Jégou et al., 2011). The
linear kernel is not local (every row weighs ``⟨k_i, q⟩``) and stays exact: :func:`build` refuses it.

The index holds row ids, not rows: the rows stay in the memory's table (``k``, ``v``, ``w`` of
:mod:`growmem.memory`), and a query gathers the rows of its lists from there.

- :func:`train_centroids`: k-means on the rows or a sample of them (k-means++ seeding, Lloyd's iterations).
- :func:`build` / :func:`add`: each row goes to the nearest centroid whose list has room, else to the
  next nearest of the ``alternatives`` nearest, else to the *overflow* list that every query reads
  (exact for those rows); a row that finds no room there either is counted in ``unindexed``, and
  :func:`add` raises :class:`IndexFullError` rather than leave a row no query can reach.
- :func:`reduce` / :func:`retrieve`: the :class:`growmem.kernels.Partial` (or ``y``) of a kernel over the
  rows of each query's ``nprobe`` lists and the overflow list (``shared=True``: over the union of the
  lists the batch probes, gathered once and reduced by :func:`growmem.kernels.reduce`). Lists are
  disjoint, so no row counts twice, and with ``nprobe = n_lists`` the result is the exact one over every
  indexed row. Gradients
  (``∂/∂q``, ``∂/∂T``, the rows through the gather) are JAX's own: the gathered block is
  ``B × (nprobe · L + overflow)`` rows.

Probing: for the dot-product kernels (weighted softmax) the lists with the largest ``⟨c, q⟩``; for the
distance kernels (RBF, Nadaraya–Watson) the smallest ``‖q − c‖²``. Rows are always assigned by distance
(k-means' own rule).
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from growmem import kernels as K
from growmem import memory as memlib
from growmem.errors import ConfigError, GrowmemError


class IndexFullError(GrowmemError, RuntimeError):
    """Rows that no list of an inverted-file index had room for (they would be read by no query)."""


@struct.dataclass
class IVF:
    """An inverted-file index over the rows of one memory table.

    centroids: (C, d) float32       the lists' centres
    lists:     (C, L) int32         row ids of each list, -1 past its count
    counts:    (C,) int32           rows in each list
    overflow:  (O,) int32           rows no list had room for (read by every query), -1 past ``n_overflow``
    n_overflow: () int32
    unindexed: () int32             rows that found no room at all (never read: :func:`add` raises)
    form:      "dot" | "neg_sqdist" (static): how queries probe the lists (the kernel's score form)
    """

    centroids: jax.Array
    lists: jax.Array
    counts: jax.Array
    overflow: jax.Array
    n_overflow: jax.Array
    unindexed: jax.Array
    form: str = struct.field(pytree_node=False, default="dot")

    @property
    def n_lists(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def list_capacity(self) -> int:
        return int(self.lists.shape[1])

    @property
    def size(self) -> jax.Array:
        """Rows indexed (in a list or in the overflow list)."""
        return self.counts.sum() + self.n_overflow


def is_count(v, lo: int, hi: Optional[int] = None) -> bool:
    """Whether ``v`` is an integer (not a bool) in ``[lo, hi]``: the one check of every count of an index."""
    return (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo
            and (hi is None or v <= hi))


def _local(kernel) -> K.Kernel:
    kern = K.get(kernel)
    if not kern.exponential:
        raise ConfigError(f"the {kern.name} kernel is not local (every row weighs <k, q>), so an inverted-file "
                          f"index would change its result; use it exact, or a local kernel: weighted_softmax, "
                          f"rbf, nadaraya_watson")
    return kern


def _sq_dist(x, c):
    """``(n, C)`` squared distances (one matrix product; clamped at 0)."""
    return jnp.maximum(jnp.sum(x * x, 1)[:, None] + jnp.sum(c * c, 1)[None, :] - 2.0 * x @ c.T, 0.0)


#: rows per chunk of the assignments (k-means and :func:`build`): a chunk's distances to the centroids fit in
#: cache-sized blocks however many rows and lists there are
ASSIGN_CHUNK = 4096


def _nearest(x, c):
    """``(n,)`` the nearest centroid of each row of ``x``, in chunks of :data:`ASSIGN_CHUNK` rows."""
    n = x.shape[0]
    pad = (-n) % ASSIGN_CHUNK
    xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, ASSIGN_CHUNK, x.shape[1])
    return jax.lax.map(lambda xc: jnp.argmin(_sq_dist(xc, c), axis=1), xs).reshape(-1)[:n]


#: how k-means picks its first centres: ``"kmeans++"`` (each next centre a row drawn with probability ∝ its
#: squared distance to the nearest centre so far: Arthur & Vassilvitskii, 2007) or ``"random"`` (rows drawn
#: uniformly without replacement)
INITS = ("kmeans++", "random")


def train_centroids(k, n_lists: int, *, key, iters: int = 10, size: Optional[int] = None,
                    sample: Optional[int] = None, init: str = "kmeans++") -> jax.Array:
    """``(n_lists, d)`` k-means centroids of the rows ``k[:size]``: Lloyd's iterations from ``n_lists`` rows
    picked by ``init`` (:data:`INITS`) with ``key``; a list left empty keeps its centre. ``sample``: train on
    that many rows drawn at random (FAISS trains on 39-256 rows a list), else on all. k-means++ spreads the
    first centres over the rows' clusters, so fewer lists start out covering several of them."""
    if not is_count(n_lists, 1):
        raise ConfigError(f"n_lists must be an integer >= 1, got {n_lists!r}")
    if init not in INITS:
        raise ConfigError(f"unknown k-means init {init!r}; choose one of {', '.join(INITS)}")
    n = int(np.shape(k)[0] if size is None else size)
    if n < n_lists:
        raise ConfigError(f"k-means needs at least n_lists = {n_lists} rows to start from, got {n}; train the "
                          f"centroids later or ask for fewer lists")
    k_init, k_sample = jax.random.split(key)
    rows = np.arange(n) if sample is None or sample >= n else np.sort(np.asarray(
        jax.random.choice(k_sample, n, (max(int(sample), int(n_lists)),), replace=False)))
    x = jnp.asarray(np.asarray(k[:n])[rows], jnp.float32)
    if not bool(memlib.finite_rows(x).all()):
        raise ConfigError("the rows the centroids are trained on hold non-finite values")
    if init == "random":
        c = x[jax.random.choice(k_init, x.shape[0], (int(n_lists),), replace=False)]
    else:
        c = _kmeanspp(x, k_init, int(n_lists))
    return _lloyd(c, x, int(iters))


@functools.partial(jax.jit, static_argnums=(2,))
def _kmeanspp(x, key, n_lists: int):
    """k-means++ seeding: the first centre a row drawn uniformly, each next one a row drawn with probability
    ∝ ``D(x)²``, its squared distance to the nearest centre chosen so far (uniformly while every row sits on
    a centre)."""
    n = x.shape[0]
    k0, key = jax.random.split(key)
    first = x[jax.random.randint(k0, (), 0, n)]
    c = jnp.zeros((n_lists, x.shape[1]), x.dtype).at[0].set(first)
    d2 = jnp.sum((x - first) ** 2, axis=1)

    def body(i, carry):
        c, d2 = carry
        total = jnp.sum(d2)
        logits = jnp.where(total > 0, jnp.log(jnp.maximum(d2, 0.0)), 0.0)
        new = x[jax.random.categorical(jax.random.fold_in(key, i), logits)]
        return c.at[i].set(new), jnp.minimum(d2, jnp.sum((x - new) ** 2, axis=1))

    return jax.lax.fori_loop(1, n_lists, body, (c, d2))[0]


@functools.partial(jax.jit, static_argnums=(2,))
def _lloyd(c, x, iters: int):
    """``iters`` Lloyd iterations from the centres ``c`` over the rows ``x`` (both traced: a captured array
    would be folded into the program as a constant)."""
    def step(c, _):
        a = _nearest(x, c)
        total = jax.ops.segment_sum(x, a, num_segments=c.shape[0])
        cnt = jax.ops.segment_sum(jnp.ones(x.shape[:1], x.dtype), a, num_segments=c.shape[0])
        return jnp.where(cnt[:, None] > 0, total / jnp.maximum(cnt, 1.0)[:, None], c), None

    return jax.lax.scan(step, c, None, length=iters)[0]


def empty(centroids, list_capacity: int, *, overflow: int = 256, kernel="weighted_softmax") -> IVF:
    """An index with no rows over ``centroids`` (``(C, d)``): ``C`` lists of ``list_capacity`` rows and an
    overflow list of ``overflow`` rows. ``kernel``: the kernel the index serves (it sets how queries probe)."""
    kern = _local(kernel)
    c = jnp.asarray(centroids, jnp.float32)
    if c.ndim != 2 or c.shape[0] < 1:
        raise ConfigError(f"centroids must be (n_lists, d) with n_lists >= 1, got shape {tuple(c.shape)}")
    for name, v, lo in (("list_capacity", list_capacity, 1), ("overflow", overflow, 0)):
        if not is_count(v, lo):
            raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}")
    return IVF(centroids=c, lists=jnp.full((c.shape[0], int(list_capacity)), -1, jnp.int32),
               counts=jnp.zeros((c.shape[0],), jnp.int32), overflow=jnp.full((int(overflow),), -1, jnp.int32),
               n_overflow=jnp.zeros((), jnp.int32), unindexed=jnp.zeros((), jnp.int32), form=kern.form)


@functools.partial(jax.jit, static_argnames=("alternatives",))
def add_rows(index: IVF, k_new, ids, mask=None, *, alternatives: int = 4) -> IVF:
    """``index`` with the rows ``ids`` (``(n,)`` int, their keys ``k_new``) assigned, in order (jittable; see
    :func:`add`, which checks that every row found room). ``mask``: the rows to add (default all)."""
    x = jnp.asarray(k_new, jnp.float32)
    n = x.shape[0]
    r = min(int(alternatives), index.n_lists)
    near = jax.lax.top_k(-_sq_dist(x, index.centroids), r)[1]        # (n, r): nearest first
    mask = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
    L, O = index.list_capacity, index.overflow.shape[0]

    def one(i, ix):
        cand = near[i]
        room = ix.counts[cand] < L
        j = jnp.argmax(room)                                         # the nearest with room
        c = cand[j]
        to_list = mask[i] & room[j]
        to_over = mask[i] & ~room[j] & (ix.n_overflow < O)
        at = jnp.minimum(ix.counts[c], L - 1)                        # one element written either way
        lists = ix.lists.at[c, at].set(jnp.where(to_list, ids[i], ix.lists[c, at]))
        if O:
            o = jnp.minimum(ix.n_overflow, O - 1)
            over = ix.overflow.at[o].set(jnp.where(to_over, ids[i], ix.overflow[o]))
        else:
            over = ix.overflow
        return ix.replace(lists=lists, counts=ix.counts.at[c].add(to_list.astype(jnp.int32)), overflow=over,
                          n_overflow=ix.n_overflow + to_over.astype(jnp.int32),
                          unindexed=ix.unindexed + (mask[i] & ~to_list & ~to_over).astype(jnp.int32))

    return jax.lax.fori_loop(0, n, one, index)


def add(index: IVF, k_new, ids, mask=None, *, alternatives: int = 4) -> IVF:
    """:func:`add_rows`, then a check on the host: raises :class:`IndexFullError` when a row found no room
    (nothing of the call is kept: the index passed in is unchanged)."""
    k_new = jnp.asarray(k_new)
    if k_new.ndim != 2 or k_new.shape[1] != index.centroids.shape[1]:
        raise ConfigError(f"keys must be (n, {index.centroids.shape[1]}), got shape {tuple(k_new.shape)}")
    ids = jnp.asarray(ids, jnp.int32)
    if ids.shape != (k_new.shape[0],):
        raise ConfigError(f"ids must be ({k_new.shape[0]},), one per key, got shape {tuple(ids.shape)}")
    if not bool((memlib.finite_rows(k_new) | (False if mask is None else ~jnp.asarray(mask, bool))).all()):
        raise ConfigError("a key to index holds non-finite values; the memory's filter keeps such rows out")
    out = add_rows(index, k_new, ids, mask, alternatives=alternatives)
    lost = int(out.unindexed) - int(index.unindexed)
    if lost:
        raise IndexFullError(f"{lost} row(s) found no room: each of its {min(alternatives, index.n_lists)} nearest "
                             f"lists holds {index.list_capacity} rows and the overflow list "
                             f"{index.overflow.shape[0]}; build the index with more lists, a larger "
                             f"list_capacity or overflow")
    return out


def widen(index: IVF, list_capacity: int) -> IVF:
    """``index`` with room for ``list_capacity`` rows in every list, each list's rows kept where they are (no
    row is re-assigned: the same lists, in the same order, as assigning every row again to the same centroids
    would give while no list was full; O(C · L) copies, not O(N · C · d) distances)."""
    if not is_count(list_capacity, index.list_capacity):
        raise ConfigError(f"list_capacity must be an integer >= the index's {index.list_capacity}, got "
                          f"{list_capacity!r}")
    pad = int(list_capacity) - index.list_capacity
    return index.replace(lists=jnp.pad(index.lists, ((0, 0), (0, pad)), constant_values=-1))


#: :func:`build` without a ``list_capacity``: this many times the fullest list of the rows' nearest
#: assignment (k-means leaves lists uneven; a list too short for its rows sends them to farther lists, where
#: the queries near them do not look)
LIST_HEADROOM = 1.25


def list_capacity_for(k, centroids, *, size: Optional[int] = None, headroom: float = LIST_HEADROOM) -> int:
    """The list capacity that holds every row of ``k[:size]`` in its nearest list with ``headroom``, rounded
    up to a multiple of 8."""
    n = int(np.shape(k)[0] if size is None else size)
    a = _nearest(jnp.asarray(np.asarray(k[:n]), jnp.float32), jnp.asarray(centroids, jnp.float32))
    fullest = int(jnp.bincount(a, length=int(np.shape(centroids)[0])).max())
    return int(8 * math.ceil(max(1, fullest) * headroom / 8))


def build(kernel, k, *, n_lists: int, key, list_capacity: Optional[int] = None, size: Optional[int] = None,
          overflow: int = 256, iters: int = 10, alternatives: int = 4, sample: Optional[int] = None,
          init: str = "kmeans++") -> IVF:
    """An index over the rows ``k[:size]``: k-means centroids (:func:`train_centroids`, on ``sample`` rows),
    then every row added, :data:`ASSIGN_CHUNK` rows a call. ``list_capacity`` None: from the rows' nearest
    assignment (:func:`list_capacity_for`)."""
    n = int(np.shape(k)[0] if size is None else size)
    c = train_centroids(k, n_lists, key=key, iters=iters, size=n, sample=sample, init=init)
    if list_capacity is None:
        list_capacity = list_capacity_for(k, c, size=n)
    ix = empty(c, list_capacity, overflow=overflow, kernel=kernel)
    for start in range(0, n, ASSIGN_CHUNK):
        stop = min(n, start + ASSIGN_CHUNK)
        ix = add(ix, jnp.asarray(k[start:stop]), jnp.arange(start, stop, dtype=jnp.int32), alternatives=alternatives)
    return ix


def _probe(index: IVF, q, nprobe: int):
    """``(B, nprobe)`` the lists each query reads, nearest first."""
    if not is_count(nprobe, 1, index.n_lists):
        raise ConfigError(f"nprobe must be an integer in [1, {index.n_lists}] (the index's lists), got {nprobe!r}")
    q = jnp.asarray(q, jnp.float32)
    score = q @ index.centroids.T if index.form == "dot" else -_sq_dist(q, index.centroids)
    return jax.lax.top_k(score, int(nprobe))[1]


def candidates(index: IVF, q, nprobe: int):
    """``(B, nprobe · L + O)`` row ids each query reads (its ``nprobe`` lists, then the overflow list; -1 where
    a list is not full)."""
    probe = _probe(index, q, nprobe)
    ids = index.lists[probe].reshape(probe.shape[0], -1)
    over = jnp.broadcast_to(index.overflow, (probe.shape[0], index.overflow.shape[0]))
    return jnp.concatenate([ids, over], axis=1)


def shared_candidates(index: IVF, q, nprobe: int):
    """``(B · nprobe · L + O,)`` row ids the whole batch reads: the union of the lists its queries probe (each
    list once), then the overflow list; -1 past a list's rows and for lists no query chose."""
    probe = _probe(index, q, nprobe).reshape(-1)
    lists = jnp.unique(probe, size=probe.shape[0], fill_value=-1)
    ids = jnp.where(lists[:, None] >= 0, index.lists[jnp.maximum(lists, 0)], -1).reshape(-1)
    return jnp.concatenate([ids, index.overflow])


def reduce(kernel, index: IVF, q, k, v, w=None, *, nprobe: int, temperature=1.0, coeff=None,
           shared: bool = False, row_grads: bool = True) -> K.Partial:
    """The :class:`~growmem.kernels.Partial` of ``kernel`` for each query over the rows of its ``nprobe``
    nearest lists and the overflow list (rows of the table ``k``, ``v``, ``w``, ``coeff`` by id).

    ``shared=True``: every query of the batch attends over the union of the lists the batch probes — its
    own among them, so never fewer rows than alone, and a query's answer depends on its batch. The union
    (padded to ``B · nprobe`` lists: static shapes) is gathered once and reduced by
    :func:`growmem.kernels.reduce` (the native kernel on CPUs, its custom VJP; ``row_grads`` as there):
    one dense product, but every query meets every slot, ``B`` times the dot products of per-query
    probing."""
    kern = _local(kernel)
    if kern.form != index.form:
        raise ConfigError(f"the index was built for {index.form} scores and the {kern.name} kernel scores by "
                          f"{kern.form}; build it with kernel={kern.name!r}")
    q = jnp.asarray(q)
    q = q if jnp.issubdtype(q.dtype, jnp.floating) else q.astype(jnp.float32)
    K._check(q, k, v, w, coeff, kern.normalised)
    if shared:
        ids = shared_candidates(index, q, nprobe)                    # (R,)
        valid = ids >= 0
        at = jnp.maximum(ids, 0)
        k = jnp.asarray(k)
        kk = jnp.where(valid[:, None], k[at], jnp.zeros((), k.dtype))   # a padded slot scores as a zero key
        c = valid.astype(q.dtype) if coeff is None else jnp.where(valid, jnp.asarray(coeff, q.dtype)[at], 0.0)
        return K.reduce(kern, q, kk, jnp.asarray(v)[at], None if w is None else jnp.asarray(w)[at],
                        temperature=temperature, coeff=c, row_grads=row_grads)
    ids = candidates(index, q, nprobe)                               # (B, R)
    valid = ids >= 0
    at = jnp.maximum(ids, 0)
    kk = jnp.asarray(k)[at].astype(q.dtype)                          # (B, R, d)
    vv = jnp.asarray(v)[at].astype(q.dtype)
    alpha = kern.alpha(jnp.asarray(temperature, q.dtype), q.shape[1])
    qk = jnp.einsum("bd,brd->br", q, kk)
    if kern.form == "dot":
        s = alpha * qk
    else:
        s = -alpha * jnp.maximum(jnp.sum(q * q, 1)[:, None] + jnp.sum(kk * kk, -1) - 2.0 * qk, 0.0)
    c = None if coeff is None else jnp.asarray(coeff, q.dtype)[at]
    if kern.normalised:
        ww = jnp.asarray(w, q.dtype)[at]
        cw = jnp.abs(ww if c is None else c * ww)
        m = jax.lax.stop_gradient(jnp.max(jnp.where(valid, s + jnp.log(jnp.maximum(cw, K._TINY)), -jnp.inf), 1))
    else:
        m = jnp.zeros(q.shape[:1], q.dtype)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(valid, jnp.exp(jnp.where(valid, s, 0.0) - m_safe[:, None]), 0.0)
    e = e if c is None else e * c
    num = jnp.einsum("br,bre->be", e, vv)
    den = jnp.einsum("br,br->b", e, ww) if kern.normalised else jnp.zeros(q.shape[:1], q.dtype)
    return K.Partial(m if kern.normalised else m_safe, num, den)


def retrieve(kernel, index: IVF, q, k, v, w=None, *, nprobe: int, temperature=1.0, coeff=None,
             shared: bool = False):
    """``y:(B, d_out)``: :func:`reduce` finished (``num / den`` for the normalised kernels)."""
    kern = _local(kernel)
    return kern.finish(reduce(kern, index, q, k, v, w, nprobe=nprobe, temperature=temperature, coeff=coeff,
                              shared=shared))


def recall(index: IVF, q, k, *, nprobe: int, top: int = 10, size: Optional[int] = None) -> jax.Array:
    """``(B,)``: the share of each query's ``top`` highest-scoring rows (of ``k[:size]``, by the index's score
    form) that its lists hold — recall@top of the probe against the exact scan."""
    q = jnp.asarray(q, jnp.float32)
    kk = jnp.asarray(k, jnp.float32)
    n = kk.shape[0] if size is None else int(size)
    kk = kk[:n]
    score = q @ kk.T if index.form == "dot" else -_sq_dist(q, kk)
    _, best = jax.lax.top_k(score, min(int(top), n))                 # (B, top)
    ids = candidates(index, q, nprobe)
    hit = (best[:, :, None] == ids[:, None, :]).any(-1)
    return hit.mean(1)


def weight_read(kernel, index: IVF, q, k, w=None, *, nprobe: int, temperature=1.0, size: Optional[int] = None,
                chunk: int = K.DEFAULT_CHUNK) -> jax.Array:
    """``(B,)``: the share of the exact kernel's total weight over the rows ``k[:size]`` that the rows a query
    reads (its ``nprobe`` lists and the overflow list) hold — ``Σ w_i e^{s_i}`` for a normalised kernel (its
    denominator), ``Σ e^{s_i}`` for the RBF kernel: the exact partial (:func:`growmem.kernels.reduce`) against
    the probed one (:func:`reduce`), with ṽ = 1; 1 where the probe misses nothing the kernel weighs. Where the
    scores spread little (a large T, keys spread evenly), most of the weight lies outside any few lists,
    whatever the recall of the top rows (:func:`recall`)."""
    kern = _local(kernel)
    q = jnp.asarray(q, jnp.float32)
    ones = jnp.ones((np.shape(k)[0], 1), jnp.float32)
    exact = K.reduce(kern, q, k, ones, w, temperature=temperature, size=size, chunk=chunk, row_grads=False)
    read = reduce(kern, index, q, k, ones, w, nprobe=nprobe, temperature=temperature, row_grads=False)
    weight = (lambda p: p.den) if kern.normalised else (lambda p: p.num[:, 0])
    return jnp.exp(read.m - exact.m) * weight(read) / weight(exact)
