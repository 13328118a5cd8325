"""The fused native CPU kernel (growmem.native, csrc/) against the XLA path of growmem.kernels and
against the float64 reference formulas of conftest.py (``ref``): values and gradients of every
kernel of the table, float32 and bfloat16 rows, every instruction set this CPU runs (AVX-512,
AVX2, the portable bodies), row counts that leave empty, partial and several parts of blocks,
``size = 0``, B = 1, 16, 256, and widths that are not a multiple of any vector width.
"""
import math
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import kernels, native
from test_kernels import _fd_grad   # central finite differences of a float64 formula

KERNEL_NAMES = tuple(kernels.KERNELS)   # linear, rbf, weighted_softmax, nadaraya_watson
TEMP = 0.7
#: rows per block of the native kernel (csrc/isa.h kBlockRows) and rows per part (kMinPartRows): sizes
#: around them leave a partial last block, a block of one row, and several parts to merge
BLOCK = 64
PART = 8 * BLOCK


def _require_native():
    if not native.available():
        if os.environ.get("CI"):
            pytest.fail("CI needs the native kernel built (pip install -e .): " + native._state.get("reason", ""))
        pytest.skip("the native kernel is not built here: " + native._state.get("reason", ""))


def _use(monkeypatch, mode, isa=None):
    monkeypatch.setenv("GROWMEM_KERNELS", mode)
    if isa is None:
        monkeypatch.delenv("GROWMEM_NATIVE_ISA", raising=False)
    else:
        monkeypatch.setenv("GROWMEM_NATIVE_ISA", isa)
    jax.clear_caches()   # the path is chosen at trace time


@pytest.fixture(params=["avx512", "avx2", "generic"])
def isa(request, monkeypatch):
    """Each instruction set of the native kernel this CPU runs (the others are skipped: an AVX2-only
    machine runs the avx2 and generic bodies)."""
    _require_native()
    if request.param not in native.isas():
        pytest.skip(f"this CPU does not run {request.param} (usable: {native.isas()})")
    _use(monkeypatch, "native", request.param)
    before = native.stats()["calls"]
    yield request.param
    after = native.stats()["calls"]
    ran = {name for name in after if after[name] > before.get(name, 0)}
    # the instruction set asked for is the one that ran (a test of a path that never reaches the kernel
    # uses no isa fixture)
    assert ran == {request.param}, f"asked for {request.param}, the kernel ran {sorted(ran) or 'nothing'}"
    jax.clear_caches()


def rows(seed, b, n, d_in, d_out, row_dtype=jnp.float32):
    r = np.random.default_rng(seed)
    q = r.normal(size=(b, d_in)).astype(np.float32)
    k = (r.normal(size=(n, d_in)) / math.sqrt(d_in) * 1.5).astype(np.float32)
    v = r.normal(size=(n, d_out)).astype(np.float32)
    w = r.uniform(0.1, 1.5, size=(n,)).astype(np.float32)
    c = r.uniform(0.2, 2.0, size=(n,)).astype(np.float32)
    if row_dtype == jnp.bfloat16:   # the float64 reference sees the rows the kernel reads
        k, v = (np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32)) for a in (k, v))
    return q, k, v, w, c


def close(got, want, tol, msg=""):
    """``|got − want| <= tol · max|want|`` everywhere: float32 sums of many rows round relative to
    their largest terms, not to each output."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = np.max(np.abs(want)) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale + 1e-30, err_msg=msg)


def nw_ref(ref, q, k, vt, w, t, coeff=None):
    """The Nadaraya–Watson kernel Σ c e^{−‖q−k‖²/(2T√d)} ṽ / Σ c w e^{−‖q−k‖²/(2T√d)} (ṽ = w·v) from
    the RBF reference (Alg. 5) applied to ṽ and to w."""
    return ref.rbf(q, k, vt, t, coeff) / ref.rbf(q, k, np.asarray(w, np.float64)[:, None], t, coeff)


def reference(ref, name, q, k, v, w, c=None, t=TEMP):
    if name == "linear":
        return ref.linear(q, k, v, c)
    if name == "rbf":
        return ref.rbf(q, k, v, t, c)
    if name == "weighted_softmax":
        return ref.weighted_softmax(q, k, v, w, t, c)
    return nw_ref(ref, q, k, v, w, t, c)


def retrieve(name, q, k, v, w, c=None, size=None, t=TEMP, row_dtype=jnp.float32, row_grads=True):
    kern = kernels.get(name)
    return kernels.retrieve(kern, q, k.astype(row_dtype), v.astype(row_dtype), w if kern.normalised else None,
                            temperature=t, coeff=c, size=size, row_grads=row_grads)


_jretrieve = jax.jit(retrieve, static_argnames=("name", "row_dtype", "row_grads"))


def test_native_is_the_default_on_cpu_for_float32_and_bfloat16_rows_only(monkeypatch):
    _require_native()
    _use(monkeypatch, "native")
    q, k, v, w, _ = rows(0, 4, 100, 9, 3)
    for dt in (jnp.float32, jnp.bfloat16):
        hlo = jax.jit(retrieve, static_argnames=("name", "row_dtype")).lower(
            "weighted_softmax", q, k, v, w, row_dtype=dt).as_text()
        assert native.FWD_TARGET in hlo, dt
    assert native.isa_for(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)) == native.isas()[0]
    # float64 and float16 operands, and the XLA switch, take the XLA loops
    with jax.enable_x64(True):
        assert native.isa_for(jnp.asarray(q, jnp.float64), jnp.asarray(k, jnp.float64), jnp.asarray(v)) is None
    assert native.isa_for(jnp.asarray(q), jnp.asarray(k, jnp.float16), jnp.asarray(v)) is None
    _use(monkeypatch, "xla")
    hlo = jax.jit(retrieve, static_argnames=("name", "row_dtype")).lower("weighted_softmax", q, k, v, w).as_text()
    assert native.FWD_TARGET not in hlo


def test_an_unknown_mode_names_the_choices(monkeypatch):
    monkeypatch.setenv("GROWMEM_KERNELS", "fast")
    with pytest.raises(ValueError, match="native.*xla"):
        native.mode()


def test_a_missing_build_falls_back_to_xla_with_one_warning(monkeypatch, ref):
    monkeypatch.setattr(native, "_native", None)
    monkeypatch.setattr(native, "_IMPORT_ERROR", ImportError("no module named growmem._native"))
    monkeypatch.setattr(native, "_state", {"registered": None, "warned": set()})
    _use(monkeypatch, "native")
    q, k, v, w, _ = rows(1, 3, 40, 5, 2)
    with pytest.warns(RuntimeWarning, match="not available.*growmem._native is not built.*pip install") as rec:
        out = np.asarray(retrieve("weighted_softmax", q, k, v, w))
        again = np.asarray(retrieve("rbf", q, k, v, w))
    assert len([r for r in rec if issubclass(r.category, RuntimeWarning)]) == 1
    np.testing.assert_allclose(out, ref.weighted_softmax(q, k, v, w, TEMP), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(again, ref.rbf(q, k, v, TEMP), rtol=2e-5, atol=2e-5)
    # and with GROWMEM_KERNELS=xla nothing is said
    monkeypatch.setattr(native, "_state", {"registered": None, "warned": set()})
    _use(monkeypatch, "xla")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retrieve("weighted_softmax", q, k, v, w)


def test_an_instruction_set_the_cpu_lacks_falls_back_with_a_warning(monkeypatch):
    _require_native()
    monkeypatch.setattr(native, "_state", {**native._state, "warned": set()})
    _use(monkeypatch, "native", "avx1024")
    q, k, v, _, _ = rows(2, 2, 10, 3, 2)
    with pytest.warns(RuntimeWarning, match="GROWMEM_NATIVE_ISA='avx1024' is not usable"):
        assert native.isa_for(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)) == native.isas()[0]


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("b,n", [(1, 300), (16, 300), (256, 70), (16, 5 * PART + 37)])
def test_values_equal_the_float64_formula_and_the_xla_path(ref, isa, monkeypatch, name, b, n):
    # d_in = 45, d_out = 13: no multiple of 8 or 16. n = 300: four whole blocks and one of 44 rows;
    # 5·512 + 37 rows: several parts, merged; 256 queries: 16 (AVX-512) or 32 (AVX2) query groups
    q, k, v, w, c = rows(3, b, n, 45, 13)
    for coeff in (None, c):
        got = _jretrieve(name, q, k, v, w, coeff)
        close(got, reference(ref, name, q, k, v, w, coeff), 1e-5, f"{isa} coeff={coeff is not None}")
    _use(monkeypatch, "xla")
    xla = _jretrieve(name, q, k, v, w, c)
    _use(monkeypatch, "native", isa)
    close(_jretrieve(name, q, k, v, w, c), xla, 1e-5)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_rows_past_size_are_never_read(ref, isa, name):
    # rows past `size` hold what would dominate every kernel if it leaked in (keys equal to the queries,
    # huge values and weights, NaN); sizes on and around the block and part boundaries, and 0
    b, n_pad = 16, 2 * PART + 3 * BLOCK
    q, k, v, w, _ = rows(4, b, n_pad, 21, 5)
    for size in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, PART + 5, 2 * PART + BLOCK):
        kp, vp, wp = k.copy(), v.copy(), w.copy()
        kp[size:] = np.resize(q, (n_pad - size, q.shape[1]))
        vp[size:], wp[size:] = 1e4, 1e4
        kp[size::7], vp[size::5] = np.nan, np.nan
        got = _jretrieve(name, q, kp, vp, wp, None, jnp.asarray(size, jnp.int32))
        if size == 0:
            np.testing.assert_array_equal(np.asarray(got), 0.0)
        else:
            close(got, reference(ref, name, q, k[:size], v[:size], w[:size]), 1e-5, f"size={size}")


@pytest.mark.parametrize("name", ["weighted_softmax", "rbf"])
def test_bfloat16_rows_equal_the_formula_on_the_rounded_rows_and_the_xla_path(ref, isa, monkeypatch, name):
    q, k, v, w, c = rows(5, 16, PART + 100, 30, 7, row_dtype=jnp.bfloat16)
    got = _jretrieve(name, q, k, v, w, c, row_dtype=jnp.bfloat16)
    close(got, reference(ref, name, q, k, v, w, c), 1e-5)
    _use(monkeypatch, "xla")
    close(got, _jretrieve(name, q, k, v, w, c, row_dtype=jnp.bfloat16), 1e-5)


def test_partials_merge_across_calls_as_the_xla_partials(isa, monkeypatch):
    """The partial (m, num, den) itself, not only num / den: the backends merge partials of row
    sets (shards, hot and cold tiers) from both paths alike."""
    q, k, v, w, c = rows(6, 16, 900, 40, 6)
    q = q * 3.0   # spread scores: the stabiliser matters

    def parts(q, k, v, w, c):
        return kernels.weighted_softmax_parts(q, k, v, w, temperature=0.05, coeff=c)

    got = jax.jit(parts)(q, k, v, w, c)
    _use(monkeypatch, "xla")
    want = jax.jit(parts)(q, k, v, w, c)
    np.testing.assert_allclose(np.asarray(got.m), np.asarray(want.m), rtol=1e-6)
    close(got.num, want.num, 1e-5)
    close(got.den, want.den, 1e-5)


@pytest.mark.xdist_group("native_threads")   # both instruction sets in one worker: not racing each other for cores
def test_results_do_not_depend_on_the_threads(isa, monkeypatch):
    """The same pass on one thread and on every thread of XLA's pool: bitwise the same, the pass split into
    the same parts whichever threads take them (``stats()["last_workers"]`` says how many did). The pass is
    large (milliseconds a part) so that on a loaded machine a woken helper thread starts before the calling
    thread has taken every part."""
    q, k, v, w, c = rows(7, 16, 128 * PART, 33, 9)

    def run(threads):
        monkeypatch.setenv("GROWMEM_NATIVE_THREADS", str(threads))
        jax.clear_caches()          # the thread cap is an attribute of the traced call
        f = jax.jit(jax.value_and_grad(lambda q: jnp.sum(retrieve("weighted_softmax", q, k, v, w, c) ** 2)))
        outs, workers = [], set()
        for i in range(100):
            outs.append([np.asarray(a) for a in jax.block_until_ready(f(q))])
            workers.add(native.stats()["last_workers"])
            if i >= 4 and (threads == 1 or max(workers) >= 2):
                break
        return outs, workers

    one, w1 = run(1)
    assert w1 == {1}
    pool, wn = run(0)
    if len(os.sched_getaffinity(0)) > 1:
        assert max(wn) >= 2, f"every pass ran on one thread ({wn}): the comparison would not test the threads"
    for got in one[1:] + pool:
        for a, b_ in zip(one[0], got):
            np.testing.assert_array_equal(a, b_)
    monkeypatch.setenv("GROWMEM_NATIVE_THREADS", "two")
    with pytest.raises(ValueError, match="GROWMEM_NATIVE_THREADS='two'"):
        native.threads()


def test_vmap_over_calls_equals_each_call(isa):
    q, k, v, w, _ = rows(8, 6, 200, 12, 4)
    qs = np.stack([q, -q, 2 * q])
    out = jax.vmap(lambda q: retrieve("weighted_softmax", q, k, v, w))(qs)
    for i in range(3):
        close(out[i], retrieve("weighted_softmax", qs[i], k, v, w), 1e-6)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("keep_scores", [True, False])
def test_gradients_equal_finite_differences_of_the_float64_formula(ref, isa, monkeypatch, name, keep_scores):
    # keep_scores: the backward pass reads the forward pass's scores; else it computes them from k
    monkeypatch.setattr(kernels, "SCORE_BYTES", kernels.SCORE_BYTES if keep_scores else 0)
    r = np.random.default_rng(9)
    b, n, d_in, d_out, pad = 3, 7, 5, 3, 4
    q, k, v, w, c = rows(9, b, n + pad, d_in, d_out)
    proj = r.normal(size=(b, d_out))
    kern = kernels.get(name)

    def loss_ref(q, k, v, w, t):
        return float(np.sum(proj * reference(ref, name, q, k[:n], v[:n], w[:n], c[:n], float(t))))

    def loss(q, k, v, w, t):
        y = kernels.retrieve(kern, q, k, v, w if kern.normalised else None, temperature=t, coeff=c, size=n)
        return jnp.sum(jnp.asarray(proj, jnp.float32) * y)

    t = np.float32(TEMP)
    hlo = jax.jit(jax.grad(loss)).lower(q, k, v, w, t).as_text()
    assert native.BWD_TARGET in hlo
    grads = [np.asarray(g) for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, w, t)]
    names = ("q", "k", "v", "w", "T")
    for i, nm in enumerate(names):
        if nm == "w" and not kern.normalised:
            continue
        fd = _fd_grad(loss_ref, (q, k, v, w, t), i)
        g = grads[i][:n] if nm in ("k", "v", "w") else grads[i]
        fd = fd[:n] if nm in ("k", "v", "w") else fd
        close(g, fd, 5e-5, f"{isa} d/d{nm}")
        if nm in ("k", "v", "w"):
            np.testing.assert_array_equal(grads[i][n:], 0.0, err_msg=f"rows past size, d/d{nm}")


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("b", [1, 16, 256])
@pytest.mark.parametrize("row_dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_gradients_equal_the_xla_path(isa, monkeypatch, name, b, row_dtype):
    # several parts (PART + 3 blocks + 9 rows in use of more), d_in 19 and d_out 11; the rows'
    # gradients (hybrid layers) and without them (the backward pass then computes only q̄, T̄)
    n, size = 2 * PART, PART + 3 * BLOCK + 9
    q, k, v, w, c = rows(10, b, n, 19, 11, row_dtype=row_dtype)
    proj = np.random.default_rng(11).normal(size=(b, 11)).astype(np.float32)
    kern = kernels.get(name)
    k, v = jnp.asarray(k, row_dtype), jnp.asarray(v, row_dtype)

    def grads(row_grads):
        def loss(q, k, v, w, t):
            y = kernels.retrieve(kern, q, k, v, w if kern.normalised else None, temperature=t, coeff=c,
                                 size=size, row_grads=row_grads)
            return jnp.sum(proj * y)
        argnums = (0, 1, 2, 3, 4) if row_grads else (0, 4)
        return jax.jit(jax.grad(loss, argnums=argnums))(q, k, v, w, jnp.float32(1.3))

    got = {rg: grads(rg) for rg in (True, False)}
    _use(monkeypatch, "xla")
    want = {rg: grads(rg) for rg in (True, False)}
    for rg in (True, False):
        names = ("q", "k", "v", "w", "T") if rg else ("q", "T")
        for g, h, nm in zip(got[rg], want[rg], names):
            if nm == "w" and not kern.normalised:
                continue
            assert g.dtype == h.dtype and g.shape == h.shape
            # bfloat16 row gradients are rounded to bfloat16 on both paths: one unit in the last place;
            # ∂T sums s̄·s over every row and query into one float32
            tol = 1e-2 if (row_dtype == jnp.bfloat16 and nm in ("k", "v")) else 1e-4 if nm == "T" else 1e-5
            close(np.asarray(g, np.float32), np.asarray(h, np.float32), tol, f"{isa} row_grads={rg} d/d{nm}")
        if rg:
            np.testing.assert_array_equal(np.asarray(got[rg][1], np.float32)[size:], 0.0)


def test_size_zero_gives_the_empty_partial_and_zero_gradients(isa):
    q, k, v, w, c = rows(12, 16, 300, 8, 3)

    def f(q, k, v, w):
        p = kernels.reduce("weighted_softmax", q, k, v, w, temperature=TEMP, size=jnp.int32(0))
        return jnp.sum(kernels.WEIGHTED_SOFTMAX.finish(p)), p

    (val, p), g = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, w)
    assert np.all(np.isneginf(np.asarray(p.m)))
    np.testing.assert_array_equal(np.asarray(p.num), 0.0)
    np.testing.assert_array_equal(np.asarray(p.den), 0.0)
    assert float(val) == 0.0
    for a in g:
        np.testing.assert_array_equal(np.asarray(a), 0.0)


def test_the_package_runs_without_the_native_build(tmp_path):
    """An install where the extension could not be built (setup.py marks it optional: no compiler on PATH)
    has no ``growmem._native``: the package imports, says once that it takes the XLA path, and a training
    step gives what the XLA path gives."""
    import subprocess
    import sys

    script = r'''
import sys, warnings
sys.modules["growmem._native"] = None          # as if it was never built: importing it raises ImportError
import numpy as np, jax, jax.numpy as jnp
from growmem import kernels, native
assert native._native is None and not native.available() and native.isas() == ()
r = np.random.default_rng(0)
q, k, v = (jnp.asarray(r.normal(size=s), jnp.float32) for s in ((4, 6), (50, 6), (50, 3)))
w = jnp.ones(50, jnp.float32)
kern = kernels.get("weighted_softmax")
f = lambda q: jnp.sum(kernels.retrieve(kern, q, k, v, w, temperature=1.0) ** 2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    a = jax.grad(f)(q)
    b = jax.grad(lambda q: f(q) * 1.0)(q)
said = [str(c.message) for c in caught if "native CPU kernel is not available" in str(c.message)]
assert len(said) == 1, said
import os
os.environ["GROWMEM_KERNELS"] = "xla"
jax.clear_caches()
np.testing.assert_allclose(np.asarray(a), np.asarray(jax.grad(f)(q)), rtol=1e-6)
print("ok")
'''
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
