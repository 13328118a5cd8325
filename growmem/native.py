"""The fused CPU retrieval kernel: the chunked passes of :func:`growmem.kernels.reduce` as two XLA
FFI calls into ``growmem._native`` (C++, ``csrc/``, built by ``pip install``).

``forward`` is :meth:`growmem.kernels.Kernel.fold` over every row below ``size``, returning the
partial ``(m, num, den)`` and, when asked, the scores the backward pass reads again; ``backward`` is
:meth:`~growmem.kernels.Kernel.unfold` over the same rows: ``(∂q, Σ s̄·s, ∂k, ∂v, ∂w)``. The custom
VJP of :func:`growmem.kernels.reduce` stays the one place the math is put together: this module
only moves the loops over rows into one native call per pass, which reads each row once per pass,
meets a vector of 16 (AVX-512) or 8 (AVX2) queries per row element, widens bfloat16 rows a block at
a time and runs its row blocks on XLA's intra-op threads (the parts' partials merged in a fixed
order, so results do not depend on the threads).

Which path runs:

* ``GROWMEM_KERNELS=native`` (the default) uses the native kernel for float32 queries over float32
  or bfloat16 rows when JAX's default backend is the CPU; every other case (GPU and TPU backends,
  float64 or float16 operands) takes the pure-XLA path of :mod:`growmem.kernels`.
* ``GROWMEM_KERNELS=xla`` takes the XLA path everywhere.
* The cold chunks of a spilled layer (:mod:`growmem.backends.tiered`) are read on the host through
  the ``growmem_cold_read`` FFI target (:func:`cold_reads`): unlike a ``jax.pure_callback``, its
  programs are kept by JAX's persistent compilation cache. Without a build, with
  ``GROWMEM_KERNELS=xla`` or off the CPU backend they are read by a ``jax.pure_callback``.
* ``GROWMEM_NATIVE_ISA=avx512|avx2|generic`` narrows the instruction set (default: the widest this
  CPU runs; :func:`isas` lists them).
* ``GROWMEM_NATIVE_THREADS=N`` runs a pass on at most ``N`` threads (the calling one included; default
  0: every thread of XLA's intra-op pool). The parts follow the pool's size, not ``N``: the result is
  bitwise the same for every ``N``. :func:`stats` says which instruction set ran and on how many threads.

A missing or unloadable build falls back to the XLA path with one warning, never an error. The
choice is made when a function is traced: after changing the variables, ``jax.clear_caches()``.
"""
from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .environment import KERNEL_MODES, kernel_mode, native_threads

try:
    from growmem import _native
    _IMPORT_ERROR: Optional[BaseException] = None
except ImportError as exc:   # not built (a source checkout without `pip install -e .`), or unloadable
    _native = None
    _IMPORT_ERROR = exc

#: the values of ``GROWMEM_KERNELS``; the first is the default
MODES = KERNEL_MODES
FWD_TARGET = "growmem_reduce_fwd"
BWD_TARGET = "growmem_reduce_bwd"
#: a spilled layer's cold chunk read on the host (growmem.backends.tiered)
COLD_READ_TARGET = "growmem_cold_read"
#: score forms of growmem.kernels.Kernel.form, as the native kernel numbers them
FORMS = {"dot": 0, "neg_sqdist": 1}
#: row dtypes the native kernel reads (queries are float32)
ROW_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

_state = {"registered": None, "warned": set()}


def _warn_once(key: str, msg: str):
    if key not in _state["warned"]:
        _state["warned"].add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def mode() -> str:
    """``GROWMEM_KERNELS``: ``native`` (default) or ``xla`` (:func:`growmem.environment.kernel_mode`)."""
    return kernel_mode()


def isas() -> Tuple[str, ...]:
    """The instruction sets the native build has and this CPU runs, widest first (empty without a
    build)."""
    return tuple(name for name, _ in _native.isas()) if _native is not None else ()


def available() -> bool:
    """Whether the native kernel is built and its FFI targets are registered (registering them on
    the first call). A failure is reported once, as a warning."""
    if _state["registered"] is None:
        if _native is None:
            _state["registered"] = False
            _state["reason"] = f"growmem._native is not built ({_IMPORT_ERROR})"
        else:
            try:
                for name, capsule in _native.targets().items():
                    jax.ffi.register_ffi_target(name, capsule, platform="cpu")
                _state["registered"] = True
            except Exception as exc:   # e.g. an XLA whose FFI is older than the headers of the build
                _state["registered"] = False
                _state["reason"] = f"registering its XLA FFI targets failed ({exc})"
    return bool(_state["registered"])


def cold_reads(reader) -> bool:
    """Whether cold chunks are read through the ``growmem_cold_read`` FFI target (module docstring),
    with ``reader(key, i, n, t, shard, fields)`` its host side (set once per process). Decided at
    trace time."""
    if mode() == "xla" or jax.default_backend() != "cpu" or not hasattr(_native, "set_cold_reader") \
            or not available():
        return False
    if _state.get("reader") is not reader:
        _native.set_cold_reader(reader)
        _state["reader"] = reader
    return True


def isa_for(q, k, v, w=None, coeff=None) -> Optional[str]:
    """The instruction set the native kernel runs these operands with, or None for the XLA path
    (module docstring). Decided at trace time from dtypes, shapes and the environment."""
    if mode() == "xla" or jax.default_backend() != "cpu":
        return None
    if jnp.dtype(q.dtype) != jnp.float32 or jnp.dtype(k.dtype) not in ROW_DTYPES or \
            jnp.dtype(v.dtype) not in ROW_DTYPES:
        return None
    if any(a is not None and not jnp.issubdtype(a.dtype, jnp.floating) for a in (w, coeff)):
        return None
    if 0 in (q.shape[0], k.shape[0], k.shape[1], v.shape[1]):
        return None   # nothing to compute: the XLA path returns the empty partial as it is
    if not available():
        _warn_once("missing", f"growmem: the native CPU kernel is not available: {_state['reason']}; using the "
                              f"XLA path (reinstall with `pip install -e .` to build it, or set "
                              f"GROWMEM_KERNELS=xla to silence this)")
        return None
    usable = isas()
    want = os.environ.get("GROWMEM_NATIVE_ISA", "").strip().lower()
    if want and want not in usable:
        _warn_once(f"isa:{want}", f"growmem: GROWMEM_NATIVE_ISA={want!r} is not usable on this CPU "
                                  f"(usable: {usable}); using {usable[0]!r}")
        want = ""
    return want or usable[0]


def threads() -> int:
    """``GROWMEM_NATIVE_THREADS``: the most threads a pass uses (0: XLA's pool)."""
    return native_threads()


def stats() -> dict:
    """What the native kernel ran in this process: ``{"calls": {isa: passes}, "last_workers": threads that
    took part in the last pass}`` (empty calls without a build)."""
    if _native is None:
        return {"calls": {}, "last_workers": 0}
    return _native.stats()


def _attrs(kern, isa: str) -> dict:
    return dict(form=np.int32(FORMS[kern.form]), exponential=np.int32(kern.exponential),
                normalised=np.int32(kern.normalised), isa=isa, threads=np.int32(threads()))


def _row_args(kern, q, k, v, w, c, size, alpha):
    f32 = jnp.float32
    none = jnp.zeros((0,), f32)
    return (q, k, v, w.astype(f32) if kern.normalised else none, none if c is None else c.astype(f32),
            jnp.asarray(size, jnp.int32), jnp.asarray(alpha, f32))


def forward(kern, isa: str, q, k, v, w, c, size, alpha, keep: bool):
    """``((m, num, den), kept)``: the partial of ``kern`` over rows ``[0, size)`` (float32) and, when
    ``keep``, the ``(N, B)`` scores (rows past ``size`` unset), else None."""
    n, b, d_out = k.shape[0], q.shape[0], v.shape[1]
    f32 = jnp.float32
    out = (jax.ShapeDtypeStruct((b,), f32), jax.ShapeDtypeStruct((b, d_out), f32), jax.ShapeDtypeStruct((b,), f32),
           jax.ShapeDtypeStruct((n * b if keep else 0,), f32))
    m, num, den, kept = jax.ffi.ffi_call(FWD_TARGET, out, vmap_method="sequential")(
        *_row_args(kern, q, k, v, w, c, size, alpha), **_attrs(kern, isa))
    return (m, num, den), (kept.reshape(n, b) if keep else None)


def backward(kern, isa: str, q, k, v, w, c, size, alpha, m, num_bar, den_bar, kept, row_grads: bool):
    """``(∂q, Σ s̄·s, ∂k, ∂v, ∂w)`` of the pass :func:`forward` made (float32; the row terms None
    unless ``row_grads``, ``∂w`` also None without a denominator); ``kept``: its scores, or None
    (computed again from ``k``)."""
    n, b, d_in, d_out = k.shape[0], q.shape[0], q.shape[1], v.shape[1]
    f32 = jnp.float32
    wg = row_grads and kern.normalised
    out = (jax.ShapeDtypeStruct((b, d_in), f32), jax.ShapeDtypeStruct((), f32),
           jax.ShapeDtypeStruct((n * d_in if row_grads else 0,), f32),
           jax.ShapeDtypeStruct((n * d_out if row_grads else 0,), f32),
           jax.ShapeDtypeStruct((n if wg else 0,), f32))
    kept = jnp.zeros((0,), f32) if kept is None else kept.reshape(-1)
    qbar, s_sbar, kbar, vbar, wbar = jax.ffi.ffi_call(BWD_TARGET, out, vmap_method="sequential")(
        *_row_args(kern, q, k, v, w, c, size, alpha), m.astype(f32), num_bar.astype(f32), den_bar.astype(f32), kept,
        **_attrs(kern, isa))
    if not row_grads:
        return qbar, s_sbar, None, None, None
    return qbar, s_sbar, kbar.reshape(n, d_in), vbar.reshape(n, d_out), wbar if wg else None
