"""Retrieval kernels (growmem.kernels) against plain float64 numpy formulas.

Reference formulas live in conftest.py (``ref`` fixture): Eq. 1 (linear), Alg. 5 (RBF),
Eq. 8 / Alg. 3 (weighted softmax).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import kernels

KERNEL_NAMES = ("linear", "rbf", "weighted_softmax")
TEMP = 0.7


def call(name, q, k, v, w, **kw):
    """growmem kernel by name (``w`` only goes to the weighted softmax)."""
    if name == "linear":
        return kernels.linear(q, k, v, **kw)
    if name == "rbf":
        return kernels.rbf(q, k, v, temperature=TEMP, **kw)
    return kernels.weighted_softmax(q, k, v, w, temperature=TEMP, **kw)


#: jitted entry point: one compilation per (kernel, chunk, shapes), shared across tests
jcall = jax.jit(call, static_argnames=("name", "chunk"))


def call_ref(ref, name, q, k, v, w, coeff=None):
    if name == "linear":
        return ref.linear(q, k, v, coeff)
    if name == "rbf":
        return ref.rbf(q, k, v, TEMP, coeff)
    return ref.weighted_softmax(q, k, v, w, TEMP, coeff)


def make_rows(seed, b=5, n=37, d_in=6, d_out=3):
    r = np.random.default_rng(seed)
    q = r.normal(size=(b, d_in)).astype(np.float32)
    k = r.normal(size=(n, d_in)).astype(np.float32)
    v = r.normal(size=(n, d_out)).astype(np.float32)
    w = r.uniform(0.1, 1.5, size=(n,)).astype(np.float32)
    return q, k, v, w


@pytest.fixture(params=["rows_first", "queries_first"])
def layout(request, monkeypatch):
    """Both layouts of the score blocks on the same (small) shapes: a small batch works on
    ``(n, B)`` scores, a large one on ``(B, n)`` (kernels.ROWS_FIRST_MAX_B)."""
    monkeypatch.setattr(kernels, "ROWS_FIRST_MAX_B", 1 << 30 if request.param == "rows_first" else 0)
    jax.clear_caches()   # a program traced under the other layout must not be reused
    yield request.param
    jax.clear_caches()


def test_small_batches_work_rows_first_and_large_ones_queries_first():
    assert kernels.rows_first(16) and kernels.rows_first(kernels.ROWS_FIRST_MAX_B)
    assert not kernels.rows_first(kernels.ROWS_FIRST_MAX_B + 1) and not kernels.rows_first(1000)


# ---------------------------------------------------------------- formulas, chunking


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("tail_split", [1, 8])
def test_chunked_equals_unchunked_and_numpy_formula(ref, name, tail_split, monkeypatch, layout):
    # N = 37 is not a multiple of the chunk. TAIL_SPLIT 1: the last chunk is shifted back and overlaps;
    # 8: whole chunks, then tail chunks of chunk // 8 rows (chunk 16: 2-row tail chunks, the last
    # shifted back to overlap; 24: 3-row ones)
    monkeypatch.setattr(kernels, "TAIL_SPLIT", tail_split)
    q, k, v, w = make_rows(0)
    expect = call_ref(ref, name, q, k, v, w)
    whole = np.asarray(jcall(name, q, k, v, w, chunk=4096))   # one chunk: no scan
    np.testing.assert_allclose(whole, expect, rtol=2e-5, atol=2e-5)
    for chunk in (1, 8, 16, 24):
        got = np.asarray(jcall(name, q, k, v, w, chunk=chunk))
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6, err_msg=f"chunk={chunk}")
        np.testing.assert_allclose(got, expect, rtol=2e-5, atol=2e-5, err_msg=f"chunk={chunk}")


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("chunk", [8, 4096])
def test_size_on_padded_rows_equals_sliced_rows(ref, name, chunk):
    q, k, v, w = make_rows(2, n=37)
    r = np.random.default_rng(99)
    # garbage padding that would dominate if it leaked in: keys equal to the queries
    # (the largest RBF / softmax scores), huge values and weights
    pad_k = np.concatenate([q, 30 * r.normal(size=(14, q.shape[1]))]).astype(np.float32)
    pad_v = (1e3 * r.normal(size=(pad_k.shape[0], v.shape[1]))).astype(np.float32)
    pad_w = np.full((pad_k.shape[0],), 1e3, np.float32)
    kp, vp, wp = (np.concatenate([a, p]) for a, p in ((k, pad_k), (v, pad_v), (w, pad_w)))
    for size in (1, 8, 9, 16, 30, 37):
        # size is traced: one compilation serves every size
        got = np.asarray(jcall(name, q, kp, vp, wp, size=jnp.asarray(size, jnp.int32), chunk=chunk))
        expect = call_ref(ref, name, q, k[:size], v[:size], w[:size])
        np.testing.assert_allclose(got, expect, rtol=2e-5, atol=2e-5, err_msg=f"size={size}")
    # a python-int size (not traced) agrees too
    got = np.asarray(call(name, q, kp, vp, wp, size=9, chunk=chunk))
    np.testing.assert_allclose(got, call_ref(ref, name, q, k[:9], v[:9], w[:9]), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name,chunk", [
    ("linear", 8), ("linear", 4096), ("rbf", 8), ("rbf", 4096), ("weighted_softmax", 8),
    ("weighted_softmax", 4096),  # single chunk with no valid row: once gave exp(-inf - -inf) = NaN
])
def test_size_zero_on_padded_rows_returns_zero(name, chunk):
    """No rows in use (an ``init='empty'`` memory before its first step) -> output 0."""
    q, k, v, w = make_rows(12, n=37)
    got = np.asarray(jcall(name, q, k, v, w, size=jnp.asarray(0, jnp.int32), chunk=chunk))
    np.testing.assert_array_equal(got, 0.0)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_coeff_multiplies_each_row(ref, name):
    chunk = 6  # several chunks, the last one ragged
    q, k, v, w = make_rows(3)
    r = np.random.default_rng(3)
    c = r.uniform(0.0, 2.5, size=(k.shape[0],)).astype(np.float32)
    c[[0, 17]] = 0.0  # rows switched off entirely
    got = np.asarray(jcall(name, q, k, v, w, coeff=c, chunk=chunk))
    np.testing.assert_allclose(got, call_ref(ref, name, q, k, v, w, coeff=c), rtol=2e-5, atol=2e-5)
    # and it is not a no-op: differs from the output without coefficients
    assert not np.allclose(got, call_ref(ref, name, q, k, v, w), rtol=1e-3, atol=1e-3)
    # equivalently (for the kernels of Eqs. 1, 8 and Alg. 5) c scales each row's value(s)
    if name == "weighted_softmax":
        alt = ref.weighted_softmax(q, k, v * c[:, None], w * c, TEMP)
    else:
        alt = call_ref(ref, name, q, k, v * c[:, None], w)
    np.testing.assert_allclose(got, alt, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------- extreme temperature


def _rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


@pytest.mark.parametrize("chunk", [4, 4096])
def test_weighted_softmax_finite_at_low_temperature_high_dim(ref, chunk):
    """T = 0.01, d_in = 3072, RMS-normalised q and k: a_i reaches √d/T ≈ 5543 (e^a overflows
    float64). Rows with w = 0 whose key equals a query (Alg. 3 appends k = q with
    w = max(0, ηδ), often 0) must not produce NaN/Inf."""
    r = np.random.default_rng(4)
    d_in, d_out, temp = 3072, 4, 0.01
    q = _rms(r.normal(size=(8, d_in))).astype(np.float32)
    keys, w = [], []
    keys += [q[0], q[1]]; w += [0.0, 0.0]           # zero-weight rows matching queries 0, 1
    keys += [q[2], q[3]]; w += [0.3, 2.0]           # positive-weight rows matching queries 2, 3
    keys += [q[2]]; w += [0.0]                      # a zero-weight twin of the key of query 2
    # query 6: its own zero-weight row plus a weighted near-duplicate (score gap ≈ 40):
    # the output is ≈ e^{40}·ṽ — huge but representable, so it must come out right
    keys += [q[6], _rms(q[6] + 0.12 * r.normal(size=d_in))]; w += [0.0, 1.0]
    keys += list(_rms(r.normal(size=(20, d_in)))); w += list(r.uniform(0.0, 1.0, 20))
    keys += list(_rms(r.normal(size=(8, d_in)))); w += [1.0 / 8] * 8  # D0 rows, w = 1/B
    k = np.asarray(keys, np.float32)
    w = np.asarray(w, np.float32)
    w[12:16] = 0.0                                  # more zero weights among random keys
    vt = (-0.5 * r.normal(size=(k.shape[0], d_out))).astype(np.float32)   # ṽ = -β g

    got = np.asarray(kernels.weighted_softmax(jnp.asarray(q), jnp.asarray(k), jnp.asarray(vt),
                                              jnp.asarray(w), temperature=temp, chunk=chunk))
    assert np.all(np.isfinite(got)), got
    expect, ok = ref.weighted_softmax_logspace(q, k, vt, w, temp)
    # queries 2..7 have representable outputs: 2, 3 match a weighted row, 4, 5, 7 are fresh
    assert ok[2:].all()
    fresh = [2, 3, 4, 5, 7]
    np.testing.assert_allclose(got[fresh], expect[fresh], rtol=2e-3, atol=1e-5)
    # float32 scores of size ~5500 carry ~1e-3 absolute error, amplified by e^{gap}
    assert np.abs(expect[6]).max() > 1e12
    np.testing.assert_allclose(got[6], expect[6], rtol=3e-2)
    # query 2: the weighted row and its zero-weight twin share the key -> (ṽ_2 + ṽ_4) / w_2
    np.testing.assert_allclose(got[2], (vt[2] + vt[4]) / w[2], rtol=2e-3)
    np.testing.assert_allclose(got[3], vt[3] / w[3], rtol=2e-3)


def test_weighted_softmax_no_overflow_when_scores_are_huge():
    """Same key for all rows but wildly different weights: the plain formula overflows
    (e^{a} with a ≈ 5543) but the ratio is Σṽ / Σw."""
    r = np.random.default_rng(5)
    d = 3072
    key = _rms(r.normal(size=(1, d))).astype(np.float32)
    k = np.repeat(key, 6, axis=0)
    w = np.asarray([1e-20, 1e-3, 0.5, 2.0, 0.0, 7.0], np.float32)
    vt = r.normal(size=(6, 3)).astype(np.float32)
    got = np.asarray(kernels.weighted_softmax(jnp.asarray(key), jnp.asarray(k), jnp.asarray(vt),
                                              jnp.asarray(w), temperature=0.01, chunk=4))
    np.testing.assert_allclose(got[0], vt.astype(np.float64).sum(0) / w.astype(np.float64).sum(), rtol=1e-3)


# ---------------------------------------------------------------- gradients


def _fd_grad(f, arrays, idx, eps=1e-6):
    """Central finite differences of scalar ``f(*arrays)`` w.r.t. ``arrays[idx]`` (numpy float64)."""
    base = [np.array(a, np.float64) for a in arrays]
    x = base[idx]
    g = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[j] += eps
        xm[j] -= eps
        ap, am = list(base), list(base)
        ap[idx], am[idx] = xp, xm
        g[j] = (f(*ap) - f(*am)) / (2 * eps)
    return g


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("keep_scores,chunk", [(True, 2), (True, 3), (False, 3)])
def test_gradients_match_finite_differences_of_formula(ref, name, keep_scores, chunk, monkeypatch, layout):
    # keep_scores: the backward pass reads the scores the forward pass kept; else it computes them
    # again (a batch too large for kernels.SCORE_BYTES). chunk 3 over 5 of 8 rows
    monkeypatch.setattr(kernels, "SCORE_BYTES", kernels.SCORE_BYTES if keep_scores else 0)
    assert kernels.keeps_scores(3, 8) is keep_scores
    r = np.random.default_rng(6)
    b, n, d_in, d_out, pad = 3, 5, 4, 2, 3
    q = r.normal(size=(b, d_in))
    k = r.normal(size=(n, d_in))
    v = r.normal(size=(n, d_out))
    w = r.uniform(0.2, 1.5, size=(n,))
    proj = r.normal(size=(b, d_out))  # random cotangent: L = Σ proj ⊙ y

    def loss_ref(q, k, v, w):
        return float(np.sum(proj * call_ref(ref, name, q, k, v, w)))

    with jax.enable_x64(True):
        # padded rows past `size` (they must get zero gradient) and chunk < n
        kp = jnp.asarray(np.concatenate([k, r.normal(size=(pad, d_in))]))
        vp = jnp.asarray(np.concatenate([v, r.normal(size=(pad, d_out))]))
        wp = jnp.asarray(np.concatenate([w, r.uniform(0.2, 1.5, pad)]))

        def loss(q, k, v, w):
            return jnp.sum(jnp.asarray(proj) * call(name, q, k, v, w, size=n, chunk=chunk))

        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(jnp.asarray(q), kp, vp, wp)
        grads = [np.asarray(g) for g in grads]
    assert grads[0].dtype == np.float64
    names = ("q", "k", "v", "w") if name == "weighted_softmax" else ("q", "k", "v")
    for i, nm in enumerate(names):
        fd = _fd_grad(loss_ref, (q, k, v, w), i)
        g = grads[i][:n] if i else grads[i]
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8, err_msg=f"d/d{nm}")
        if i:
            np.testing.assert_array_equal(grads[i][n:], 0.0, err_msg=f"padding rows of {nm}")


# ---------------------------------------------------------------- partial results, edge cases


def test_merge_parts_of_two_halves_equals_whole(ref):
    temperature, split = 0.02, 11  # halves whose maxima differ by hundreds: exercises the rescaling
    r = np.random.default_rng(7)
    d = 16
    q = _rms(r.normal(size=(6, d))).astype(np.float32)
    k = _rms(r.normal(size=(29, d))).astype(np.float32)
    k[3] = q[0]  # one query has its best key in the first half
    k[20] = q[1]  # another in the second half
    v = r.normal(size=(29, 3)).astype(np.float32)
    w = r.uniform(0.1, 1.0, size=(29,)).astype(np.float32)

    @jax.jit
    def run(q, k, v, w):   # one compilation for all the pieces
        parts = lambda *rows, **kw: kernels.weighted_softmax_parts(q, *rows, temperature=temperature,
                                                                   chunk=4, **kw)
        whole = parts(k, v, w)
        merged = kernels.merge_parts([parts(k[:split], v[:split], w[:split]),
                                      parts(k[split:], v[split:], w[split:])])
        empty = parts(k, v, w, size=0)   # a shard with no rows in use: m = -inf
        return (whole, merged, empty, kernels.finish_parts(merged),
                kernels.finish_parts(kernels.merge_parts([empty, whole])),
                kernels.finish_parts(kernels.merge_parts([empty, empty])))

    whole, merged, empty, out, out_with_empty, out_empty = jax.tree.map(np.asarray, run(q, k, v, w))
    for a, b in zip(merged, whole):   # same (m, num, den) as one pass over all rows
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-30)
    expect, ok = ref.weighted_softmax_logspace(q, k, v, w, temperature)
    assert ok.all()
    np.testing.assert_allclose(out, expect, rtol=1e-3, atol=1e-5)
    # the empty shard is the identity of the merge
    assert np.all(np.isneginf(empty[0]))
    np.testing.assert_allclose(out_with_empty, whole[1] / whole[2][:, None], rtol=1e-6)
    np.testing.assert_array_equal(out_empty, 0.0)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_empty_memory_returns_zero(name):
    q = jnp.asarray(np.random.default_rng(8).normal(size=(4, 5)), jnp.float32)
    out = call(name, q, jnp.zeros((0, 5)), jnp.zeros((0, 3)), jnp.zeros((0,)))
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(out), 0.0)


def test_weighted_softmax_all_zero_weights_returns_zero():
    q, k, v, w = make_rows(9)
    out = kernels.weighted_softmax(q, k, v, np.zeros_like(w), temperature=1.0, chunk=8)
    np.testing.assert_array_equal(np.asarray(out), 0.0)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_bad_shapes_raise_value_error(name):
    q, k, v, w = make_rows(10, b=2, n=4, d_in=3, d_out=2)
    bad = [
        (q[0], k, v, w, {}),                      # q not 2-D
        (q, k[:, :2], v, w, {}),                  # key dim != query dim
        (q, k, v[:3], w, {}),                     # k and v disagree on N
        (q, k[0], v, w, {}),                      # k not 2-D
        (q, k, v[:, 0], w, {}),                   # v not 2-D
        (q, k, v, w, {"coeff": np.ones(3, np.float32)}),   # coeff wrong length
    ]
    if name == "weighted_softmax":
        bad.append((q, k, v, w[:3], {}))          # w wrong length
        bad.append((q, k, v, w[:, None], {}))     # w not 1-D
    for args in bad:
        with pytest.raises(ValueError):
            call(name, *args[:4], **args[4])
    with pytest.raises(ValueError):
        kernels.retrieve("cosine", q, k, v, w)


@pytest.mark.parametrize("name", ["weighted_softmax", "rbf"])
def test_bfloat16_rows_over_many_chunks_equal_the_same_values_in_float32(name):
    """bf16 rows cross the chunk loop as their uint16 bits: the result and ∂/∂q equal the float32
    computation on the same (bf16-rounded) values, over a ragged multi-chunk table."""
    r = np.random.default_rng(4)
    n, d, b = 1000, 24, 5
    k16 = jnp.asarray(r.normal(size=(n, d)) / math.sqrt(d), jnp.bfloat16)
    v16 = jnp.asarray(r.normal(size=(n, 3)), jnp.bfloat16)
    w = jnp.asarray(r.uniform(0.1, 1.0, n), jnp.float32)
    q = jnp.asarray(r.normal(size=(b, d)), jnp.float32)

    def out(q, k, v):
        p = kernels.reduce(name, q, k, v, w, temperature=0.7, size=937, chunk=128)
        return jnp.sum(kernels.get(name).finish(p) ** 2), kernels.get(name).finish(p)

    (l16, y16), g16 = jax.value_and_grad(out, has_aux=True)(q, k16, v16)
    (l32, y32), g32 = jax.value_and_grad(out, has_aux=True)(q, k16.astype(jnp.float32), v16.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(y16), np.asarray(y32), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g16), np.asarray(g32), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("keep_scores", [True, False])
@pytest.mark.parametrize("size", [37, 30])
@pytest.mark.parametrize("tail_split", [1, 8])
def test_gradients_over_whole_and_shifted_tail_chunks_equal_one_chunk(name, keep_scores, size, tail_split,
                                                                      monkeypatch):
    # chunk 24 over 37 rows. TAIL_SPLIT 8: one whole chunk, then 3-row tail chunks, the last shifted
    # back to rows 34-36 (its first row masked) when all 37 rows are in use; 1: two chunks, the second
    # shifted back to rows 13-36. One chunk over the whole table (no loop) is the independent
    # computation: test_gradients_match_finite_differences_of_formula checks it
    monkeypatch.setattr(kernels, "SCORE_BYTES", kernels.SCORE_BYTES if keep_scores else 0)
    monkeypatch.setattr(kernels, "TAIL_SPLIT", tail_split)
    q, k, v, w = (jnp.asarray(a) for a in make_rows(4))
    proj = jnp.asarray(np.random.default_rng(5).normal(size=(q.shape[0], v.shape[1])), jnp.float32)

    def grads(chunk):
        def loss(q, k, v, w, t):
            kern = kernels.get(name)
            y = kernels.retrieve(kern, q, k, v, w if kern.normalised else None, temperature=t, size=size,
                                 chunk=chunk)
            return jnp.sum(proj * y)
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, w, jnp.float32(2.0))

    for g, ref_g, nm in zip(grads(24), grads(4096), ("q", "k", "v", "w", "T")):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref_g), rtol=2e-5, atol=2e-6, err_msg=f"d/d{nm}")
