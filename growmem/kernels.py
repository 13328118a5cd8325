"""Retrieval kernels: pure functions of a query batch and memory rows.

All kernels take ``q:(B, d_in)`` and rows ``(N, ·)`` and return ``(B, d_out)``.
They loop over fixed-size chunks of rows and skip chunks past ``size``, so the
cost follows the rows in use, not the preallocated capacity; rows at index
``>= size`` are masked out. The weighted softmax merges the chunks' partial
numerators and denominators with a running maximum (the log-sum-exp rule), so
it is finite at any temperature. Everything is differentiable in ``q`` and in
the rows (``k``, ``v``, ``w``).

``coeff:(N,)`` is an optional per-row retrieval coefficient ``c_i`` (momentum
uses it, Eq. 23/91); it multiplies each row's kernel value.

Chunk size and speed: on CPU each chunk's rows are copied out of the row table
(XLA materialises the dynamic slice) before the two matrix products read them,
so a chunk should stay in cache. ``chunk`` is therefore the *largest* number of
rows per chunk; :func:`chunk_rows` lowers it so that a chunk's key and value rows
take about :data:`CHUNK_BYTES` (e.g. 256 rows at d = 3072, 512 at d = 784). The
result does not depend on the chunking beyond floating-point rounding.
:func:`scan_rows` itself uses exactly the ``chunk`` it is given.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

#: default upper bound on rows per chunk (small rows); see :func:`chunk_rows`
DEFAULT_CHUNK = 8192
#: target bytes of one chunk's key + value rows: about the last-level cache a core can use
CHUNK_BYTES = 6 << 20
#: never fewer rows per chunk than this (unless ``chunk`` asks for it): per-chunk overhead
MIN_CHUNK_ROWS = 128
# floor on |c·w| inside the softmax stabiliser: rows with w = 0 still carry ṽ (Alg. 3)
_TINY = 1e-30


def _check(q, k, v, w=None, coeff=None):
    if q.ndim != 2:
        raise ValueError(f"q must be (B, d_in), got shape {tuple(q.shape)}")
    if k.ndim != 2 or v.ndim != 2:
        raise ValueError(f"k and v must be 2-D (N, d), got k{tuple(k.shape)} v{tuple(v.shape)}")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"key dimension {k.shape[1]} does not match query dimension {q.shape[1]}")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k has {k.shape[0]} rows but v has {v.shape[0]}")
    n = k.shape[0]
    for name, a in (("w", w), ("coeff", coeff)):
        if a is not None and tuple(a.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(a.shape)}")


def chunk_rows(chunk: int, *rows: jax.Array) -> int:
    """Rows per chunk the kernels use: ``min(chunk, R)``, where ``R`` is the largest power of
    two (at least :data:`MIN_CHUNK_ROWS`) whose rows of all ``rows`` arrays fit in
    :data:`CHUNK_BYTES`."""
    row_bytes = sum(math.prod(a.shape[1:]) * a.dtype.itemsize for a in rows)
    fit = max(int(CHUNK_BYTES) // max(row_bytes, 1), 1)
    fit = max(MIN_CHUNK_ROWS, 1 << (fit.bit_length() - 1))
    return max(1, min(int(chunk), fit))


def scan_rows(body: Callable, carry, rows: Sequence[jax.Array], *, size=None, chunk: int = DEFAULT_CHUNK):
    """Fold ``body(carry, rows_chunk, valid)`` over row chunks ``[i·chunk, (i+1)·chunk)``.

    ``valid:(chunk,)`` marks rows below ``size`` that belong to this chunk (the last
    chunk is shifted back to stay in bounds; its overlap is masked). Chunks that
    start at or after ``size`` are skipped at run time.
    """
    n = rows[0].shape[0]
    if n == 0:
        return carry
    size = n if size is None else jnp.minimum(jnp.asarray(size, jnp.int32), n)
    chunk = max(1, min(int(chunk), n))
    n_chunks = math.ceil(n / chunk)
    if n_chunks == 1:
        return body(carry, rows, jnp.arange(n) < size)
    ragged = n % chunk != 0  # static: only then is the last chunk shifted back

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


def _rows_and_coeff(dtype, rows, coeff):
    """``rows`` plus the coefficient column if there is one (``None`` means all c_i = 1)."""
    return tuple(rows) + (() if coeff is None else (jnp.asarray(coeff, dtype),))


def linear(q, k, v, *, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Eq. 1 without ``W0 q``: ``Σ_i c_i ⟨k_i, q⟩ v_i``."""
    _check(q, k, v, coeff=coeff)

    def body(num, r, valid):
        kc, vc = r[0], r[1]
        cc = jnp.where(valid, r[2], 0) if len(r) > 2 else valid.astype(q.dtype)
        a = (q @ kc.T) * cc
        return num + a @ vc

    return scan_rows(body, jnp.zeros((q.shape[0], v.shape[1]), q.dtype), _rows_and_coeff(q.dtype, (k, v), coeff),
                     size=size, chunk=chunk_rows(chunk, k, v))


def rbf(q, k, v, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Alg. 5: ``Σ_i c_i exp(-‖q - k_i‖² / (2 T √d_in)) v_i``."""
    _check(q, k, v, coeff=coeff)
    inv = 1.0 / (2.0 * temperature * math.sqrt(q.shape[1]))
    q2 = jnp.sum(q * q, axis=1, keepdims=True)

    def body(num, r, valid):
        kc, vc = r[0], r[1]
        # masking q·k right at the product keeps XLA:CPU from fusing the ‖k‖² reduction and
        # the exponential into the matrix-product kernel (which made it ~20% slower at B=256)
        qk = jnp.where(valid[None, :], q @ kc.T, 0.0)
        # ‖q-k‖² = ‖q‖² + ‖k‖² - 2 q·k, through one matrix product; clamp rounding below 0
        d2 = jnp.maximum(q2 + jnp.sum(kc * kc, axis=1)[None, :] - 2.0 * qk, 0.0)
        e = jnp.exp(-d2 * inv)
        e = e * jnp.where(valid, r[2], 0) if len(r) > 2 else jnp.where(valid, e, 0.0)
        return num + e @ vc

    return scan_rows(body, jnp.zeros((q.shape[0], v.shape[1]), q.dtype), _rows_and_coeff(q.dtype, (k, v), coeff),
                     size=size, chunk=chunk_rows(chunk, k, v))


def weighted_softmax_parts(q, k, v_tilde, w, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Partial sums of Eq. 8 with a common stabiliser: ``(m, num, den)``.

    ``num = Σ c_i e^{a_i - m} ṽ_i``, ``den = Σ c_i w_i e^{a_i - m}`` with
    ``a_i = ⟨k_i, q⟩ / (T √d_in)``. Partial results from several shards/chunks merge
    with :func:`merge_parts`.
    """
    _check(q, k, v_tilde, w=w, coeff=coeff)
    scale = 1.0 / (temperature * math.sqrt(q.shape[1]))
    b = q.shape[0]

    def body(carry, r, valid):
        m, num, den = carry
        kc, vc, wc = r[0], r[1], r[2]
        cc = r[3] if len(r) > 3 else None
        a = (q @ kc.T) * scale                                       # (B, chunk)
        # stabiliser: max over rows of a_i + log|c_i w_i| keeps den >= 1 whenever some
        # weighted row is present, so the result is finite whenever it is representable
        cw = jnp.abs(wc if cc is None else cc * wc)
        score = jnp.where(valid, a + jnp.log(jnp.maximum(cw, _TINY)), -jnp.inf)
        m_new = lax.stop_gradient(jnp.maximum(m, jnp.max(score, axis=1)))
        a_safe = jnp.where(valid, a, m_new[:, None])
        e = jnp.where(valid, jnp.exp(a_safe - m_new[:, None]), 0.0)   # e^{a_i - m}
        if cc is not None:
            e = e * cc                                               # c_i e^{a_i - m}
        # rescale earlier chunks; while no row has been seen yet (m = m_new = -inf) there is nothing to rescale
        r_old = jnp.exp(jnp.where(jnp.isfinite(m_new), m - m_new, 0.0))
        return m_new, num * r_old[:, None] + e @ vc, den * r_old + e @ wc

    init = (jnp.full((b,), -jnp.inf, q.dtype), jnp.zeros((b, v_tilde.shape[1]), q.dtype), jnp.zeros((b,), q.dtype))
    return scan_rows(body, init, _rows_and_coeff(q.dtype, (k, v_tilde, w), coeff), size=size,
                     chunk=chunk_rows(chunk, k, v_tilde))


def merge_parts(parts):
    """Merge ``(m, num, den)`` partials (e.g. from shards) by the log-sum-exp rule."""
    ms = jnp.stack([p[0] for p in parts])
    m = lax.stop_gradient(jnp.max(ms, axis=0))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    num = sum(p[1] * jnp.where(jnp.isfinite(p[0]), jnp.exp(p[0] - m_safe), 0.0)[:, None] for p in parts)
    den = sum(p[2] * jnp.where(jnp.isfinite(p[0]), jnp.exp(p[0] - m_safe), 0.0) for p in parts)
    return m, num, den


def finish_parts(parts):
    """``num / den``; 0 where the denominator is exactly 0 (no weighted rows)."""
    _, num, den = parts
    zero = den == 0
    return jnp.where(zero[:, None], 0.0, num / jnp.where(zero, 1.0, den)[:, None])


def weighted_softmax(q, k, v_tilde, w, *, temperature, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Eq. 8: ``Σ c_i e^{a_i} ṽ_i / Σ c_i w_i e^{a_i}``, ``a_i = ⟨k_i, q⟩ / (T √d_in)``.

    Max-stabilised; an empty memory (or one whose weights are all 0) returns 0.
    """
    return finish_parts(weighted_softmax_parts(q, k, v_tilde, w, temperature=temperature, coeff=coeff,
                                               size=size, chunk=chunk))


KERNELS = ("linear", "rbf", "weighted_softmax")


def retrieve(kernel: str, q, k, v, w, *, temperature=1.0, coeff=None, size=None, chunk: int = DEFAULT_CHUNK):
    """Dispatch on the kernel name (``w`` is ignored by ``linear`` and ``rbf``)."""
    if kernel == "linear":
        return linear(q, k, v, coeff=coeff, size=size, chunk=chunk)
    if kernel == "rbf":
        return rbf(q, k, v, temperature=temperature, coeff=coeff, size=size, chunk=chunk)
    if kernel == "weighted_softmax":
        return weighted_softmax(q, k, v, w, temperature=temperature, coeff=coeff, size=size, chunk=chunk)
    raise ValueError(f"unknown kernel {kernel!r}; choose one of {KERNELS}")
