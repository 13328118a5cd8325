"""Retrieval kernels: one :class:`Kernel` object per kernel, in the table :data:`KERNELS`.

Every kernel is kernel attention of a query batch ``q:(B, d_in)`` over memory rows
``k:(N, d_in)``, ``v:(N, d_out)`` (and ``w:(N,)``) with per-row coefficients ``c_i``
(momentum, Eq. 23/91; 1 when absent)::

    y = Σ_i c_i κ(s_i) v_i                       (linear: κ(s) = s;  RBF: κ(s) = e^s)
    y = Σ_i c_i e^{s_i} ṽ_i / Σ_i c_i w_i e^{s_i}  (weighted softmax, Eq. 8)

with the score ``s_i = α ⟨k_i, q⟩`` (linear: α = 1; weighted softmax: α = 1/(T√d_in)) or
``s_i = −α ‖q − k_i‖²`` (RBF, Alg. 5: α = 1/(2T√d_in)).

**The algebra every backend shares.** A kernel reduces a set of rows to a *partial result*
:class:`Partial` ``(m, num, den)``: ``num = Σ c_i κ(s_i − m) v_i``, ``den = Σ c_i w_i κ(s_i − m)``
(0 for kernels without a denominator), ``m`` a per-query stabiliser (the running maximum of
``s_i + log|c_i w_i|`` for the weighted softmax, so it is finite at any temperature; 0 for
the others). Two partials of disjoint row sets — two chunks, two shards, the hot and the
cold rows — :func:`merge` by the log-sum-exp rule (for ``m = 0`` it is a plain sum), and
:meth:`Kernel.finish` turns the merged partial into ``y``. So a backend (in RAM, sharded,
on disk) needs no per-kernel code, and a new kernel is one row of the table.

**Cost.** :func:`reduce` loops over fixed-size chunks of rows ``[0, size)`` only (a dynamic
trip count: capacity past ``size`` costs nothing), with the two matrix products and the
exponential of a chunk in cache. Rows may be stored in a lower precision than ``q``
(bfloat16 keys and values halve the bytes a step reads); every chunk is widened to ``q``'s
dtype and accumulated there.

**Where it runs.** On the CPU the chunked passes below run as one call of the fused native kernel
(:mod:`growmem.native`: ``GROWMEM_KERNELS=native``, the default, for float32 queries over float32
or bfloat16 rows); elsewhere, or with ``GROWMEM_KERNELS=xla``, as the XLA loops of this module.
Both compute the same partials and gradients under the same custom VJP.

**Gradients.** :func:`reduce` has a custom VJP: the backward pass recomputes each chunk's
scores from the forward pass's stabiliser ``m`` (no chunk of rows is kept between the
passes: the forward pass allocates nothing row-sized) and gives ``∂/∂q``, ``∂/∂T`` and — only
when ``row_grads=True`` (hybrid layers, Alg. 4) — ``∂/∂k, ∂/∂v, ∂/∂w``. Coefficients and
``size`` get no gradient. Forward-mode differentiation (``jax.jvp``) is not supported.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Dict, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from growmem import native
from growmem.units import check_temperature

from .errors import ConfigError

#: default upper bound on rows per chunk (small rows); see :func:`chunk_rows`
DEFAULT_CHUNK = 8192
#: target bytes of one chunk's key + value rows (4,096 rows of d = 784 at float32). Measured on a
#: 2-core Xeon for B = 16 over 60,016 rows: forward + backward 113.7 ms at 512 rows per chunk,
#: 97.5 at 2,048, 93.0 at 4,096, 140.2 at 16,384 (a chunk's dots then leave the cache)
CHUNK_BYTES = 32 << 20
#: the forward pass keeps its scores for the backward pass up to this size (:func:`keeps_scores`)
SCORE_BYTES = 64 << 20
#: batches of at most this many queries work on the scores transposed, rows by queries: XLA's CPU
#: dot writes ``k qᵀ`` 1.7x faster than ``q kᵀ`` at B = 16 (and the backward's ``ṽ ḡᵀ`` likewise),
#: while larger batches are faster the other way (B = 1,000, 10 outputs, 65,536 rows: 571 against
#: 791 ms forward); 2-core AMD EPYC
ROWS_FIRST_MAX_B = 64
#: the rows after the last whole chunk are read in chunks this many times smaller (:func:`_fold_chunks`).
#: 8 reads fewer rows past those in use (B = 16, d = 784, 4,900 rows: forward + backward 13.3 -> 7.6 ms)
#: but compiles a second loop for every table: the test suite ran 1.6x longer (1,617 s against ~1,000 s;
#: two spill tests 78.8 s against 51.2 s) and the single pass compiled for 14.2 s instead of 9.3 s.
#: 1 (one loop, the last chunk shifted back) is the default; raise it for long runs of mid-size tables
TAIL_SPLIT = 1
#: never fewer rows per chunk than this (unless ``chunk`` asks for it): per-chunk overhead
MIN_CHUNK_ROWS = 128
#: rows per chunk of the novelty (minimum distance) search
NOVELTY_CHUNK = 256
# floor on |c·w| inside the softmax stabiliser: rows with w = 0 still carry ṽ (Alg. 3)
_TINY = 1e-30


class Partial(NamedTuple):
    """A kernel's partial result over some rows (module docstring): ``m:(B,)`` stabiliser
    (never differentiated), ``num:(B, d_out)``, ``den:(B,)``."""

    m: jax.Array
    num: jax.Array
    den: jax.Array


class _Layout:
    """Index algebra of a ``(B, n)`` score block (queries first) or its transpose ``(n, B)``
    (``rows_first``): how a per-row or per-query vector broadcasts against it, and the products
    that contract it over rows or over queries."""

    def __init__(self, rows_first: bool):
        self.t = bool(rows_first)

    def row(self, x):            # (n,) against the block
        return x[:, None] if self.t else x[None, :]

    def query(self, x):          # (B,) against the block
        return x[None, :] if self.t else x[:, None]

    def max_rows(self, s):       # (B,): over the rows
        return jnp.max(s, axis=0 if self.t else 1)

    def sum_rows(self, s):
        return jnp.sum(s, axis=0 if self.t else 1)

    def sum_queries(self, s):
        return jnp.sum(s, axis=1 if self.t else 0)

    def to_queries(self, s, x):  # Σ_i s_bi x_i: (B, ...) from per-row x (n, ...)
        return s.T @ x if self.t else s @ x

    def to_rows(self, s, y):     # Σ_b s_bi y_b: (n, ...) from per-query y (B, ...)
        return s @ y if self.t else s.T @ y

    def outer(self, y, x):       # ⟨y_b, x_i⟩ for per-query y (B, e) and per-row x (n, e), in the block's layout
        return x @ y.T if self.t else y @ x.T


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One retrieval kernel (a row of :data:`KERNELS`).

    name         its name in specs and presets
    form         ``"dot"``: ``s = α⟨k, q⟩``; ``"neg_sqdist"``: ``s = −α‖q − k‖²``
    scale        α = ``scale / (T √d_in)`` when ``uses_temperature`` (else α = ``scale``)
    exponential  κ(s) = e^{s − m} (else κ(s) = s)
    normalised   y = num / den with ``den = Σ c w κ`` (the weighted softmax); else y = num
    rules        the growth rules (:mod:`growmem.rules`) that fit it; the first is the default
    base_weight  the layer adds ``W0 q`` (the linear dual form, Eq. 1)
    """

    name: str
    form: str
    scale: float
    exponential: bool
    normalised: bool
    uses_temperature: bool
    rules: tuple = ("sgd",)
    base_weight: bool = False

    # ------------------------------------------------------------------ scores
    def alpha(self, temperature, d_in: int):
        if not self.uses_temperature:
            return jnp.asarray(self.scale, jnp.float32)
        return self.scale / (temperature * math.sqrt(d_in))

    def scores(self, q, q2, k, alpha):
        """``(B, n)`` scores ``s`` of queries ``q`` (``q2 = ‖q‖²``) against rows ``k``."""
        qk = q @ k.T
        if self.form == "dot":
            return alpha * qk
        # ‖q-k‖² = ‖q‖² + ‖k‖² - 2 q·k through one matrix product; clamp rounding below 0
        return -alpha * jnp.maximum(q2[:, None] + jnp.sum(k * k, axis=1)[None, :] - 2.0 * qk, 0.0)

    def scores_t(self, q, q2, k, alpha):
        """``(n, B)``: :meth:`scores` transposed, rows by queries (the layout of small batches:
        :data:`ROWS_FIRST_MAX_B`)."""
        kq = k @ q.T
        if self.form == "dot":
            return alpha * kq
        return -alpha * jnp.maximum(jnp.sum(k * k, axis=1)[:, None] + q2[None, :] - 2.0 * kq, 0.0)

    def score_vjp(self, sbar, q, k, alpha, row_grads: bool, rows_first: bool = False):
        """``(q̄, k̄)`` from ``s̄ = ∂L/∂s`` (``(B, n)``, or ``(n, B)`` when ``rows_first``; ``k̄`` is
        None unless ``row_grads``)."""
        L = _Layout(rows_first)
        if self.form == "dot":                                   # s = α q·k
            qbar = alpha * L.to_queries(sbar, k)
            kbar = alpha * L.to_rows(sbar, q) if row_grads else None
            return qbar, kbar
        # s = −α(‖q‖² + ‖k‖² − 2 q·k):  ∂s/∂q_b = 2α(k_i − q_b),  ∂s/∂k_i = 2α(q_b − k_i)
        qbar = 2.0 * alpha * (L.to_queries(sbar, k) - q * L.sum_rows(sbar)[:, None])
        kbar = 2.0 * alpha * (L.to_rows(sbar, q) - k * L.sum_queries(sbar)[:, None]) if row_grads else None
        return qbar, kbar

    # ------------------------------------------------------------------ partial results
    def empty(self, b: int, d_out: int, dtype=jnp.float32) -> Partial:
        """The partial of no rows (the identity of :func:`merge`)."""
        m0 = -jnp.inf if (self.exponential and self.normalised) else 0.0
        return Partial(jnp.full((b,), m0, dtype), jnp.zeros((b, d_out), dtype), jnp.zeros((b,), dtype))

    def _weights(self, s, m, c, valid, L: "_Layout"):
        """``c_i κ(s_i − m)`` per (query, row) in ``s``'s layout, 0 on invalid rows."""
        if self.exponential:
            e = jnp.exp(jnp.where(L.row(valid), s, L.query(m)) - L.query(m))
        else:
            e = s
        e = jnp.where(L.row(valid), e, 0.0)
        return e if c is None else e * L.row(c)

    def fold(self, p: Partial, q, q2, k, v, w, c, valid, alpha, s=None, rows_first: bool = False) -> Partial:
        """``p`` merged with the partial of one chunk of rows (forward pass); ``s``: the chunk's
        scores when already computed (``(B, n)``, or ``(n, B)`` when ``rows_first``)."""
        L = _Layout(rows_first)
        if s is None:
            s = self.scores_t(q, q2, k, alpha) if rows_first else self.scores(q, q2, k, alpha)
        m = p.m
        if self.exponential and self.normalised:
            # stabiliser: max over rows of s_i + log|c_i w_i| keeps den >= 1 whenever some
            # weighted row is present, so the result is finite whenever it is representable
            cw = jnp.abs(w if c is None else c * w)
            score = jnp.where(L.row(valid), s + L.row(jnp.log(jnp.maximum(cw, _TINY))), -jnp.inf)
            m = jnp.maximum(p.m, L.max_rows(score))
        e = self._weights(s, m, c, valid, L)
        # rescale earlier chunks; while no row has been seen yet (m = -inf) there is nothing to rescale
        r = jnp.exp(jnp.where(jnp.isfinite(m), p.m - m, 0.0))
        num = p.num * r[:, None] + L.to_queries(e, v)
        den = p.den * r + L.to_queries(e, w) if self.normalised else p.den
        return Partial(m, num, den)

    def unfold(self, m, num_bar, den_bar, q, q2, k, v, w, c, valid, alpha, row_grads: bool, s=None,
               rows_first: bool = False):
        """Backward pass of one chunk: ``(q̄, Σ s̄·s, k̄, v̄, w̄)`` (row terms None unless ``row_grads``);
        ``s``: the chunk's scores kept by the forward pass, in the same layout (else they are
        computed again from ``k``)."""
        L = _Layout(rows_first)
        if s is None:
            s = self.scores_t(q, q2, k, alpha) if rows_first else self.scores(q, q2, k, alpha)
        e = self._weights(s, m, c, valid, L)
        ebar = L.outer(num_bar, v)                               # ∂L/∂(c κ) per (query, row)
        if self.normalised:
            ebar = ebar + L.query(den_bar) * L.row(w)
        if self.exponential:
            sbar = ebar * e                                      # ∂(c e^{s-m})/∂s = c e^{s-m}
        else:
            sbar = ebar * (L.row(valid) if c is None else jnp.where(L.row(valid), L.row(c), 0.0))
        qbar, kbar = self.score_vjp(sbar, q, k, alpha, row_grads, rows_first)
        s_sbar = jnp.sum(sbar * s)
        if not row_grads:
            return qbar, s_sbar, None, None, None
        vbar = L.to_rows(e, num_bar)
        wbar = L.to_rows(e, den_bar) if self.normalised else None
        return qbar, s_sbar, kbar, vbar, wbar

    def finish(self, p: Partial):
        """``y`` from a (merged) partial: ``num / den`` (0 where ``den == 0``: no weighted
        rows), or ``num``."""
        if not self.normalised:
            return p.num
        zero = p.den == 0
        return jnp.where(zero[:, None], 0.0, p.num / jnp.where(zero, 1.0, p.den)[:, None])


LINEAR = Kernel("linear", form="dot", scale=1.0, exponential=False, normalised=False, uses_temperature=False,
                rules=("sgd",), base_weight=True)
RBF = Kernel("rbf", form="neg_sqdist", scale=0.5, exponential=True, normalised=False, uses_temperature=True,
             rules=("sgd",))
WEIGHTED_SOFTMAX = Kernel("weighted_softmax", form="dot", scale=1.0, exponential=True, normalised=True,
                          uses_temperature=True, rules=("weighted_softmax", "gauge"))
#: the Gaussian Nadaraya–Watson estimator: Σ c w e^{−‖q−k‖²/(2T√d)} ṽ / Σ c w e^{−‖q−k‖²/(2T√d)}
#: (with w = 1 and ṽ the targets: :mod:`growmem.nadaraya`)
NADARAYA_WATSON = Kernel("nadaraya_watson", form="neg_sqdist", scale=0.5, exponential=True, normalised=True,
                         uses_temperature=True, rules=("target",))
#: the kernel table: name -> Kernel
KERNELS: Dict[str, Kernel] = {k.name: k for k in (LINEAR, RBF, WEIGHTED_SOFTMAX, NADARAYA_WATSON)}


def get(kernel) -> Kernel:
    """A :class:`Kernel` by name (or the kernel itself)."""
    if isinstance(kernel, Kernel):
        return kernel
    try:
        return KERNELS[kernel]
    except KeyError:
        raise ConfigError(f"unknown kernel {kernel!r}; choose one of {tuple(KERNELS)}") from None


# ---------------------------------------------------------------------------------------------
# merging partial results


def merge(a: Partial, b: Partial) -> Partial:
    """Merge the partials of two disjoint row sets by the log-sum-exp rule (a sum when m = 0)."""
    m = lax.stop_gradient(jnp.maximum(a.m, b.m))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    ra = jnp.where(jnp.isfinite(a.m), jnp.exp(a.m - m_safe), 0.0)
    rb = jnp.where(jnp.isfinite(b.m), jnp.exp(b.m - m_safe), 0.0)
    return Partial(m, a.num * ra[:, None] + b.num * rb[:, None], a.den * ra + b.den * rb)


def merge_stacked(p: Partial) -> Partial:
    """Merge partials stacked along a leading axis (e.g. all-gathered from the shards of a mesh)."""
    m = lax.stop_gradient(jnp.max(p.m, axis=0))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    r = jnp.where(jnp.isfinite(p.m), jnp.exp(p.m - m_safe[None]), 0.0)
    return Partial(m, jnp.sum(p.num * r[..., None], axis=0), jnp.sum(p.den * r, axis=0))


def merge_across(p: Partial, axis_name) -> Partial:
    """Merge the partials of every device along a mesh axis (inside ``shard_map``): the
    partials are all-gathered (``B·(d_out + 2)`` numbers per device; the rows never move)."""
    return merge_stacked(Partial(*(lax.all_gather(a, axis_name) for a in p)))


# ---------------------------------------------------------------------------------------------
# the chunked reduction


def chunk_rows(chunk: int, *rows: jax.Array) -> int:
    """Rows per chunk the kernels use: ``min(chunk, R)``, where ``R`` is the largest power of
    two (at least :data:`MIN_CHUNK_ROWS`) whose rows of all ``rows`` arrays fit in
    :data:`CHUNK_BYTES` (measured at the float32 width every chunk is widened to)."""
    row_bytes = sum(math.prod(a.shape[1:]) * 4 for a in rows)
    fit = max(int(CHUNK_BYTES) // max(row_bytes, 1), 1)
    fit = max(MIN_CHUNK_ROWS, 1 << (fit.bit_length() - 1))
    return max(1, min(int(chunk), fit))


def _fold_chunks(fn, carry, arrays: Sequence[Optional[jax.Array]], n: int, size, chunk: int):
    """``carry = fn(carry, start, chunks, valid)`` over the rows below ``size`` (dynamic trip
    counts): whole chunks of ``chunk`` rows, then the rest in chunks of ``chunk //``
    :data:`TAIL_SPLIT` rows, so fewer than that many rows past ``size`` are read. A tail
    chunk that would cross the end of the table is shifted back to stay in bounds; its
    overlap is masked."""
    if n == 0:
        return carry
    tail = max(chunk // TAIL_SPLIT, 1)
    if n <= tail:
        return fn(carry, 0, arrays, jnp.arange(n) < size)
    # bfloat16 rows cross the loop as their uint16 bits: XLA's CPU backend otherwise widens the
    # whole table to float32 before the loop (one full f32 copy per call), and the halved bytes
    # that bf16 rows are for are read twice over instead
    bits = [a is not None and a.dtype == jnp.bfloat16 for a in arrays]
    arrays = [lax.bitcast_convert_type(a, jnp.uint16) if b else a for a, b in zip(arrays, bits)]
    used = jnp.minimum(size, n)

    def loop(carry, c, base, count):
        def body(i, carry):
            lo = base + i * c
            start = jnp.minimum(lo, n - c)
            sl = [None if a is None else lax.dynamic_slice_in_dim(a, start, c, 0) for a in arrays]
            sl = [lax.bitcast_convert_type(a, jnp.bfloat16) if b else a for a, b in zip(sl, bits)]
            idx = start + jnp.arange(c, dtype=jnp.int32)
            return fn(carry, start, sl, (idx >= lo) & (idx < size))

        return lax.fori_loop(0, count, body, carry)

    base = jnp.zeros((), jnp.int32)
    if n >= chunk > tail:   # whole chunks: never past the end of the table
        carry = loop(carry, chunk, base, used // chunk)
        base = used // chunk * chunk
    return loop(carry, tail, base, (used - base + tail - 1) // tail)


def _widen(a, dtype):
    return None if a is None else a.astype(dtype)


def rows_first(b: int) -> bool:
    """Whether a batch of ``b`` queries works on its scores transposed (:data:`ROWS_FIRST_MAX_B`)."""
    return b <= ROWS_FIRST_MAX_B


def keeps_scores(b: int, n: int) -> bool:
    """Whether the forward pass of ``b`` queries over ``n`` rows keeps its ``b × n`` scores for
    the backward pass (:data:`SCORE_BYTES`)."""
    return b * n * 4 <= SCORE_BYTES


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _reduce(kernel: Kernel, chunk: int, row_grads: bool, isa: Optional[str], q, k, v, w, c, size, temperature):
    return _forward(kernel, chunk, isa, q, k, v, w, c, size, temperature, keep=False)[0]


def _forward(kernel, chunk, isa, q, k, v, w, c, size, temperature, keep: bool):
    """``(partial, scores)``: the chunked forward pass; ``scores`` (``(N, B)`` for a small batch,
    :func:`rows_first`, or from the native kernel (``isa``); else ``(B, N)``; rows past ``size``
    unset) when ``keep``, else None."""
    dt = q.dtype
    alpha = kernel.alpha(temperature, q.shape[1]).astype(dt)
    if isa is not None:
        (m, num, den), kept = native.forward(kernel, isa, q, k, v, w, c, size, alpha, keep)
        return Partial(m, num, den), kept
    q2 = jnp.sum(q * q, axis=1)
    n = k.shape[0]

    rf = rows_first(q.shape[0])

    def fn(carry, start, rows, valid):
        p, kept = carry
        kc, vc, wc, cc = (_widen(a, dt) for a in rows)
        s = kernel.scores_t(q, q2, kc, alpha) if rf else kernel.scores(q, q2, kc, alpha)
        if keep:   # the shifted-back last chunk writes its overlap again, with the same scores
            kept = lax.dynamic_update_slice_in_dim(kept, s, start, 0 if rf else 1)
        return kernel.fold(p, q, q2, kc, vc, wc, cc, valid, alpha, s=s, rows_first=rf), kept

    kept = (jnp.zeros((n, q.shape[0]) if rf else (q.shape[0], n), dt)) if keep else None
    return _fold_chunks(fn, (kernel.empty(q.shape[0], v.shape[1], dt), kept), (k, v, w, c), n, size, chunk)


def _reduce_fwd(kernel, chunk, row_grads, isa, q, k, v, w, c, size, temperature):
    # the backward pass needs every row's score again: kept, it reads k once (q̄ = s̄ k) instead of
    # twice (s = α q kᵀ, then q̄) — one of the five (N, d) reads of a step's forward + backward
    p, s = _forward(kernel, chunk, isa, q, k, v, w, c, size, temperature,
                    keep=keeps_scores(q.shape[0], k.shape[0]))
    return p, (q, k, v, w, c, size, temperature, p.m, s)


def _reduce_bwd(kernel, chunk, row_grads, isa, res, pbar):
    q, k, v, w, c, size, temperature, m, s_kept = res
    dt = q.dtype
    alpha = kernel.alpha(temperature, q.shape[1]).astype(dt)
    if isa is not None:
        qbar, s_sbar, kbar, vbar, wbar = native.backward(kernel, isa, q, k, v, w, c, size, alpha, m, pbar.num,
                                                         pbar.den, s_kept, row_grads)
    else:
        qbar, s_sbar, kbar, vbar, wbar = _unfold_chunks(kernel, chunk, row_grads, q, k, v, w, c, size, alpha, m,
                                                        pbar, s_kept)
    # s ∝ 1/T  =>  ∂s/∂T = −s/T
    tbar = (-s_sbar / temperature).astype(jnp.result_type(temperature)) if kernel.uses_temperature else None
    cast = lambda g, a: None if g is None else g.astype(a.dtype)
    return (qbar, cast(kbar, k), cast(vbar, v), cast(wbar, w) if w is not None else None, None, None,
            None if tbar is None else jnp.reshape(tbar, jnp.shape(temperature)))


def _unfold_chunks(kernel, chunk, row_grads, q, k, v, w, c, size, alpha, m, pbar, s_kept):
    """``(q̄, Σ s̄·s, k̄, v̄, w̄)``: the chunked backward pass (XLA loops)."""
    dt = q.dtype
    q2 = jnp.sum(q * q, axis=1)
    num_bar, den_bar = pbar.num, pbar.den
    n = k.shape[0]
    rf = rows_first(q.shape[0])
    zeros = lambda a: None if (a is None or not row_grads) else jnp.zeros(a.shape, dt)
    init = (jnp.zeros_like(q), jnp.zeros((), dt), zeros(k), zeros(v), zeros(w) if kernel.normalised else None)

    def add_rows(buf, start, g):
        if buf is None or g is None:
            return buf
        size_c = g.shape[0]
        return lax.dynamic_update_slice_in_dim(buf, lax.dynamic_slice_in_dim(buf, start, size_c, 0) + g, start, 0)

    def fn(acc, start, rows, valid):
        kc, vc, wc, cc = (_widen(a, dt) for a in rows)
        s = None if s_kept is None else lax.dynamic_slice_in_dim(s_kept, start, kc.shape[0], 0 if rf else 1)
        qb, ss, kb, vb, wb = kernel.unfold(m, num_bar, den_bar, q, q2, kc, vc, wc, cc, valid, alpha, row_grads, s=s,
                                           rows_first=rf)
        qbar, s_sbar, kbar, vbar, wbar = acc
        # the shifted-back last chunk overlaps the one before: add, never overwrite
        return (qbar + qb, s_sbar + ss, add_rows(kbar, start, kb), add_rows(vbar, start, vb),
                add_rows(wbar, start, wb))

    return _fold_chunks(fn, init, (k, v, w, c), n, size, chunk)


_reduce.defvjp(_reduce_fwd, _reduce_bwd)


def _check(q, k, v, w=None, coeff=None, normalised=False):
    if q.ndim != 2:
        raise ConfigError(f"q must be (B, d_in), got shape {tuple(q.shape)}")
    if k.ndim != 2 or v.ndim != 2:
        raise ConfigError(f"k and v must be 2-D (N, d), got k{tuple(k.shape)} v{tuple(v.shape)}")
    if k.shape[1] != q.shape[1]:
        raise ConfigError(f"key dimension {k.shape[1]} does not match query dimension {q.shape[1]}")
    if v.shape[0] != k.shape[0]:
        raise ConfigError(f"k has {k.shape[0]} rows but v has {v.shape[0]}")
    n = k.shape[0]
    if normalised and w is None:
        raise ConfigError("this kernel needs the row weights w")
    for name, a in (("w", w), ("coeff", coeff)):
        if a is not None and tuple(a.shape) != (n,):
            raise ConfigError(f"{name} must have shape ({n},), got {tuple(a.shape)}")


def _as_array(x):
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def reduce(kernel, q, k, v, w=None, *, temperature=1.0, coeff=None, size=None, chunk: int = DEFAULT_CHUNK,
           row_grads: bool = True) -> Partial:
    """The partial result (:class:`Partial`) of ``kernel`` over rows ``[0, size)``.

    ``q:(B, d_in)``, ``k:(N, d_in)``, ``v:(N, d_out)``, ``w:(N,)`` (weighted softmax),
    ``coeff:(N,)`` optional per-row ``c_i``; rows may be stored in a lower precision than
    ``q`` (each chunk is widened to ``q.dtype``). ``temperature`` may be traced (it is
    differentiable). ``chunk`` is an upper bound on rows per chunk (:func:`chunk_rows`).
    ``row_grads=False`` drops the gradient with respect to the rows (the backward pass then
    computes only ``∂/∂q`` and ``∂/∂T``): use it when the rows are not trained.
    """
    kern = get(kernel)
    if kern.uses_temperature and isinstance(temperature, (int, float, np.number)):   # a traced T is not checked
        check_temperature(temperature)
    if isinstance(size, (int, np.integer)) and size < 0:
        raise ConfigError(f"size (rows in use) must be >= 0, got {size}")
    q, k, v = (_as_array(a) for a in (q, k, v))
    w = _as_array(w) if (w is not None and kern.normalised) else None
    coeff = None if coeff is None else _as_array(coeff)
    _check(q, k, v, w, coeff, kern.normalised)
    if not jnp.issubdtype(q.dtype, jnp.floating):
        q = q.astype(jnp.float32)
    n = k.shape[0]
    size = jnp.asarray(n if size is None else size, jnp.int32)
    size = jnp.clip(size, 0, n)
    temperature = jnp.asarray(temperature, q.dtype)
    ch = max(1, min(chunk_rows(chunk, k, v), max(n, 1)))
    coeff = None if coeff is None else coeff.astype(q.dtype)
    return _reduce(kern, ch, bool(row_grads), native.isa_for(q, k, v, w, coeff), q, k, v, w, coeff, size,
                   temperature)


def retrieve(kernel, q, k, v, w=None, *, temperature=1.0, coeff=None, size=None, chunk: int = DEFAULT_CHUNK,
             row_grads: bool = True):
    """``y:(B, d_out)`` of ``kernel`` (a name or a :class:`Kernel`) over rows ``[0, size)``."""
    kern = get(kernel)
    return kern.finish(reduce(kern, q, k, v, w, temperature=temperature, coeff=coeff, size=size, chunk=chunk,
                              row_grads=row_grads))


# ---------------------------------------------------------------------------------------------
# the paper's kernels by name (functional API)


def linear(q, k, v, *, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Eq. 1 without ``W0 q``: ``Σ_i c_i ⟨k_i, q⟩ v_i``."""
    return retrieve(LINEAR, q, k, v, coeff=coeff, size=size, chunk=chunk)


def rbf(q, k, v, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Alg. 5: ``Σ_i c_i exp(-‖q - k_i‖² / (2 T √d_in)) v_i``."""
    return retrieve(RBF, q, k, v, temperature=temperature, coeff=coeff, size=size, chunk=chunk)


def weighted_softmax(q, k, v_tilde, w, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Eq. 8: ``Σ c_i e^{a_i} ṽ_i / Σ c_i w_i e^{a_i}``, ``a_i = ⟨k_i, q⟩ / (T √d_in)``.

    Max-stabilised; an empty memory (or one whose weights are all 0) returns 0.
    """
    return retrieve(WEIGHTED_SOFTMAX, q, k, v_tilde, w, temperature=temperature, coeff=coeff, size=size,
                    chunk=chunk)


def weighted_softmax_parts(q, k, v_tilde, w, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Partial sums of Eq. 8 with a common stabiliser: ``(m, num, den)`` (a :class:`Partial`)."""
    return reduce(WEIGHTED_SOFTMAX, q, k, v_tilde, w, temperature=temperature, coeff=coeff, size=size, chunk=chunk)


def merge_parts(parts) -> Partial:
    """Merge a list of partials (e.g. from shards) by the log-sum-exp rule."""
    parts = [Partial(*p) for p in parts]
    out = parts[0]
    for p in parts[1:]:
        out = merge(out, p)
    return out


def finish_parts(parts):
    """``num / den`` of weighted-softmax partials; 0 where the denominator is exactly 0."""
    return WEIGHTED_SOFTMAX.finish(Partial(*parts))


# ---------------------------------------------------------------------------------------------
# novelty search and a general chunked fold


def min_sq_distance(q, k, *, size=None, chunk: int = NOVELTY_CHUNK) -> jax.Array:
    """``(B,)`` ``min_j ‖q_b − k_j‖²`` over rows ``j < size`` (``+inf`` when there are none).

    Chunked over rows through one matrix product per chunk (``‖q‖² + ‖k‖² − 2 q·k``,
    clamped at 0); never materialises ``(B, N, d)``; not differentiated.
    """
    q = lax.stop_gradient(q)
    q2 = jnp.sum(q * q, axis=1)
    n = k.shape[0]
    size = jnp.clip(jnp.asarray(n if size is None else size, jnp.int32), 0, n)

    def fn(best, start, rows, valid):
        kc = rows[0].astype(q.dtype)
        d2 = q2[:, None] + jnp.sum(kc * kc, axis=1)[None, :] - 2.0 * (q @ kc.T)
        return jnp.minimum(best, jnp.min(jnp.where(valid[None, :], d2, jnp.inf), axis=1))

    best = _fold_chunks(fn, jnp.full(q.shape[:1], jnp.inf, q.dtype), (lax.stop_gradient(k),), n, size,
                        max(1, min(int(chunk), max(n, 1))))
    return jnp.maximum(best, 0.0)


def scan_rows(body: Callable, carry, rows: Sequence[jax.Array], *, size=None, chunk: int = DEFAULT_CHUNK):
    """Fold ``body(carry, rows_chunk, valid)`` over row chunks ``[i·chunk, (i+1)·chunk)`` below
    ``size`` (a general chunked loop, differentiable, for kernels outside the table: the
    last chunk is shifted back to stay in bounds and its overlap masked; chunks at or past
    ``size`` are skipped at run time)."""
    n = rows[0].shape[0]
    if n == 0:
        return carry
    size = n if size is None else jnp.minimum(jnp.asarray(size, jnp.int32), n)
    chunk = max(1, min(int(chunk), n))
    n_chunks = math.ceil(n / chunk)
    if n_chunks == 1:
        return body(carry, rows, jnp.arange(n) < size)
    ragged = n % chunk != 0

    def step(c, i):
        lo = i * chunk
        start = jnp.minimum(lo, n - chunk) if ragged else lo

        def run(c):
            sl = [lax.dynamic_slice_in_dim(a, start, chunk, 0) for a in rows]
            idx = start + jnp.arange(chunk, dtype=jnp.int32)
            valid = (idx >= lo) & (idx < size) if ragged else idx < size
            return body(c, sl, valid)

        return lax.cond(lo < size, run, lambda c: c, c), None

    carry, _ = lax.scan(step, carry, jnp.arange(n_chunks, dtype=jnp.int32))
    return carry
