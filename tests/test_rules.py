"""Growth rules (growmem.rules) against the paper's formulas and properties.

Alg. 3 (weighted softmax rule), Alg. 2 / Thm. C.4 (gauge rule as an explicit
shift-append-shift-back), Prop. C.3 (gauge invariance), Remark B.1 (merging rows with
equal keys), and first-order descent of one rule step. Predictions of databases are
evaluated with the float64 numpy formula of Eq. 8 (``ref`` fixture, conftest.py).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import kernels, memory, rules


def rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


def database(seed, n=12, d_in=8, d_out=3, w_low=0.05):
    """A random weighted-softmax database ``(w, k, ṽ)`` with positive weights."""
    r = np.random.default_rng(seed)
    w = r.uniform(w_low, 1.0, n)
    k = rms(r.normal(size=(n, d_in)))
    vt = w[:, None] * r.normal(size=(n, d_out))
    return w, k, vt


# ---------------------------------------------------------------- rule formulas


def test_sgd_rule_formula():
    r = np.random.default_rng(0)
    q, s, g = r.normal(size=(5, 4)), r.normal(size=(5, 3)), r.normal(size=(5, 3))
    rows = rules.sgd(jnp.asarray(q), jnp.asarray(s), jnp.asarray(g), eta=0.3)
    np.testing.assert_allclose(np.asarray(rows.k), q, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rows.v), -0.3 * g, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(rows.w), 1.0)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_weighted_softmax_rule_is_alg3(clip):
    r = np.random.default_rng(1)
    b = 64
    q = r.normal(size=(b, 5)).astype(np.float32)
    s = (2 * r.normal(size=(b, 3))).astype(np.float32)
    g = r.normal(size=(b, 3)).astype(np.float32)
    g[0] = 0.0
    eta, beta = 0.7, 1.9
    rows = rules.weighted_softmax(q, s, g, eta=eta, beta=beta, clip=clip)
    delta = np.einsum("bi,bi->b", s.astype(np.float64), g)      # δ = ⟨s, g⟩ (Alg. 3 line 7)
    if clip is not None:
        delta = np.clip(delta, -clip, clip)
        assert (np.abs(np.einsum("bi,bi->b", s, g)) > clip).any()  # the clip is exercised
    expect_w = np.maximum(0.0, eta * delta)
    assert (expect_w == 0).any() and (expect_w > 0).any()
    np.testing.assert_allclose(np.asarray(rows.w), expect_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(rows.k), q)
    np.testing.assert_allclose(np.asarray(rows.v), -beta * g, rtol=1e-6)
    assert np.asarray(rows.w)[0] == 0 and np.all(np.asarray(rows.v)[0] == 0)


def test_unknown_rule_raises():
    with pytest.raises(ValueError):
        rules.get("adam")


# ---------------------------------------------------------------- gauge rule (Alg. 2, Thm. C.4)


def explicit_gauge_step(ref, db, q, s, g, *, eta, beta, alpha, temperature):
    """Thm. C.4, done the long way for one sample (float64 numpy).

    1. shift every stored value into the virtual frame: ṽ_i + w_i b_t, with
       b_t = (-⟨s,g⟩/‖g‖² + α_t) g and α_t = α/‖g‖ (Eq. 81, C.7.5);
    2. append (w_new, q, -βg) with w_new = η⟨g, s_{D_b}(q)⟩ (Eq. 80), the prediction of
       the *shifted* database evaluated explicitly;
    3. shift every row (old and new) back by -b_t.
    """
    w, k, vt = db
    gn2 = g @ g
    alpha_t = alpha / np.sqrt(gn2)
    b = (-(s @ g) / gn2 + alpha_t) * g
    vt_virtual = vt + w[:, None] * b
    s_virtual = ref.weighted_softmax(q[None], k, vt_virtual, w, temperature)[0]
    w_new = eta * (g @ s_virtual)
    w_all = np.concatenate([w, [w_new]])
    k_all = np.concatenate([k, q[None]])
    vt_all = np.concatenate([vt_virtual, -beta * g[None]])
    return w_all, k_all, vt_all - w_all[:, None] * b


@pytest.mark.parametrize("hyper", [dict(eta=0.5, beta=0.3, alpha=2.0, temperature=1.0),
                                   dict(eta=0.03, beta=100.0, alpha=10.0, temperature=5.0)])  # App. G.2
def test_gauge_rule_equals_explicit_shift_append_shift_back(ref, hyper):
    temperature = hyper["temperature"]
    rule_hyper = {k: v for k, v in hyper.items() if k != "temperature"}
    db = database(2)
    w, k, vt = db
    r = np.random.default_rng(2)
    b = 4
    q = rms(r.normal(size=(b, k.shape[1])))
    y = r.normal(size=(b, vt.shape[1]))
    s = ref.weighted_softmax(q, k, vt, w, temperature)          # s_t: prediction of D^(t)
    g = 2.0 * (s - y)                                             # per-sample ∂‖s-y‖²/∂s
    rows = rules.gauge(jnp.asarray(q, jnp.float32), jnp.asarray(s, jnp.float32),
                       jnp.asarray(g, jnp.float32), **rule_hyper)
    rw, rk, rv = (np.asarray(a, np.float64) for a in rows)
    probe = rms(r.normal(size=(6, k.shape[1])))
    probe[0] = q[0]
    mem0 = memory.from_rows(w.astype(np.float32), k.astype(np.float32), vt.astype(np.float32))

    @jax.jit
    def retrieve_with_row(rw_, rk_, rv_):
        mem = memory.append(mem0, rw_, rk_, rv_, born=1)
        return kernels.weighted_softmax(jnp.asarray(probe, jnp.float32), mem.k, mem.v, mem.w,
                                        temperature=temperature, size=mem.size, chunk=8)

    for n in range(b):
        w2, k2, vt2 = explicit_gauge_step(ref, db, q[n], s[n], g[n], temperature=temperature, **rule_hyper)
        # Eq. 82: w_new = η α_t ‖g‖² = η α ‖g‖ > 0
        assert w2[-1] > 0
        # Thm. C.4: old rows return unchanged; the new row is the rule's row
        np.testing.assert_allclose(w2[:-1], w, rtol=1e-12)
        np.testing.assert_allclose(vt2[:-1], vt, rtol=1e-9, atol=1e-9 * np.abs(vt2).max())
        np.testing.assert_allclose(rw[n], w2[-1], rtol=1e-5)
        np.testing.assert_allclose(rk[n], k2[-1], rtol=1e-6)
        np.testing.assert_allclose(rv[n], vt2[-1], rtol=1e-4, atol=1e-5 * np.abs(vt2[-1]).max())
        # retrieval: database + rule row (through growmem.memory and growmem.kernels)
        # equals the explicit database on random queries
        got = retrieve_with_row(rows.w[n:n + 1], rows.k[n:n + 1], rows.v[n:n + 1])
        expect = ref.weighted_softmax(probe, k2, vt2, w2, temperature)
        np.testing.assert_allclose(np.asarray(got), expect, rtol=2e-4, atol=2e-4 * np.abs(expect).max())


def test_gauge_rule_weight_positive_for_any_nonzero_gradient():
    r = np.random.default_rng(3)
    b = 200
    q = r.normal(size=(b, 4)).astype(np.float32)
    g = r.normal(size=(b, 3)) * 10.0 ** r.uniform(-4, 3, size=(b, 1))
    s = -g * r.uniform(0.0, 50.0, size=(b, 1)) + r.normal(size=(b, 3))   # mostly ⟨s, g⟩ < 0
    s, g = s.astype(np.float32), g.astype(np.float32)
    sg = np.einsum("bi,bi->b", s.astype(np.float64), g)
    assert (sg < 0).mean() > 0.5
    gauge_w = np.asarray(rules.gauge(q, s, g, eta=0.03, beta=100.0, alpha=10.0).w)
    assert np.all(gauge_w > 0)
    np.testing.assert_allclose(gauge_w, 0.03 * 10.0 * np.linalg.norm(g.astype(np.float64), axis=1), rtol=1e-5)
    # ... whereas Alg. 3 clips those rows to weight 0
    wsm_w = np.asarray(rules.weighted_softmax(q, s, g, eta=0.03, beta=100.0).w)
    np.testing.assert_array_equal(wsm_w[sg < 0], 0.0)


# ---------------------------------------------------------------- descent


@pytest.mark.parametrize("rule", ["weighted_softmax", "gauge"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_one_rule_step_lowers_squared_error(ref, rule, seed):
    """Append the rows one rule step proposes for a batch and re-evaluate on the same queries:
    for small η, β the loss ‖s - y‖² must go down (functional gradient descent)."""
    r = np.random.default_rng(100 + seed)
    d_in, d_out, b, temperature = 16, 3, 8, 1.0
    # D0 as in F.3: RMS-normalised random keys and values, w = 1/B, ṽ = w v
    w0 = np.full(b, 1.0 / b)
    k0 = rms(r.normal(size=(b, d_in)))
    vt0 = w0[:, None] * rms(r.normal(size=(b, d_out)))
    q = rms(r.normal(size=(b, d_in)))
    y = r.normal(size=(b, d_out))
    s = ref.weighted_softmax(q, k0, vt0, w0, temperature)
    loss0 = np.sum((s - y) ** 2)
    g = 2.0 * (s - y)                                     # per-sample gradient (Alg. 3 unit)
    hyper = dict(eta=1e-3, beta=1e-3)
    if rule == "gauge":
        hyper["alpha"] = 1.0
    rows = rules.get(rule)(jnp.asarray(q, jnp.float32), jnp.asarray(s, jnp.float32),
                           jnp.asarray(g, jnp.float32), **hyper)
    w1 = np.concatenate([w0, np.asarray(rows.w, np.float64)])
    k1 = np.concatenate([k0, np.asarray(rows.k, np.float64)])
    vt1 = np.concatenate([vt0, np.asarray(rows.v, np.float64)])
    loss1 = np.sum((ref.weighted_softmax(q, k1, vt1, w1, temperature) - y) ** 2)
    assert loss1 < loss0 - 1e-4 * loss0, (loss0, loss1)


# ---------------------------------------------------------------- invariances of Eq. 8


def test_merging_rows_with_equal_keys_leaves_outputs_unchanged(ref):
    """Remark B.1: (w1, k, ṽ1) and (w2, k, ṽ2) -> (w1 + w2, k, ṽ1 + ṽ2) (ṽ = w v)."""
    w, k, vt = database(4, n=10)
    w[7] = 0.0                                    # a zero-weight row (Alg. 3) shares a key too
    k[3] = k[8]
    k[7] = k[1]
    r = np.random.default_rng(4)
    q = np.concatenate([rms(r.normal(size=(5, k.shape[1]))), k[[3, 1]]])
    wm, km, vtm = w.copy(), k.copy(), vt.copy()
    wm[3] += w[8]; vtm[3] += vt[8]
    wm[1] += w[7]; vtm[1] += vt[7]
    keep = np.setdiff1d(np.arange(10), [7, 8])
    wm, km, vtm = wm[keep], km[keep], vtm[keep]
    f = lambda w_, k_, v_: np.asarray(kernels.weighted_softmax(
        jnp.asarray(q, jnp.float32), jnp.asarray(k_, jnp.float32), jnp.asarray(v_, jnp.float32),
        jnp.asarray(w_, jnp.float32), temperature=0.5, chunk=3))
    full, merged = f(w, k, vt), f(wm, km, vtm)
    np.testing.assert_allclose(merged, full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(full, ref.weighted_softmax(q, k, vt, w, 0.5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_coeff", [False, True])
def test_shifting_values_by_w_xi_shifts_outputs_by_xi(with_coeff):
    """Prop. C.3 (Eq. 77): ṽ_i -> ṽ_i + w_i ξ gives s(q) -> s(q) + ξ, for every query."""
    w, k, vt = database(5, n=23, d_out=4)
    r = np.random.default_rng(5)
    q = rms(r.normal(size=(9, k.shape[1])))
    xi = 3.0 * r.normal(size=(4,))
    coeff = r.uniform(0.2, 3.0, size=w.shape) if with_coeff else None
    f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
    f = lambda v_: np.asarray(kernels.weighted_softmax(f32(q), f32(k), f32(v_), f32(w), temperature=0.3,
                                                       coeff=f32(coeff), chunk=5))
    s0 = f(vt)
    s1 = f(vt + w[:, None] * xi[None, :])
    np.testing.assert_allclose(s1 - s0, np.broadcast_to(xi, s0.shape), rtol=1e-4, atol=2e-5)


# ---------------------------------------------------------------- through the trainer


def test_first_step_of_empty_weighted_softmax_layer_appends_alg3_rows():
    """An empty memory predicts s = 0, so Alg. 3 appends w = max(0, η⟨0, g⟩) = 0, k = q,
    ṽ = -β g with the per-sample gradient g = 2(s - y) = -2y."""
    from growmem import GrowingLayer, GrowingSpec, Trainer
    r = np.random.default_rng(6)
    x = r.normal(size=(4, 3)).astype(np.float32)
    y = r.normal(size=(4, 2)).astype(np.float32)
    spec = GrowingSpec.make("weighted_softmax", eta=0.5, beta=0.25, init="empty")
    trainer = Trainer(GrowingLayer(spec, 2), loss="squared_error", sample_input=x)
    loss = float(trainer.step(x, y)["loss"])
    np.testing.assert_allclose(loss, np.mean(np.sum(y.astype(np.float64) ** 2, -1)), rtol=1e-6)
    rows = trainer.memories()[()].rows()
    np.testing.assert_array_equal(rows["w"], 0.0)
    np.testing.assert_array_equal(rows["k"], x)
    np.testing.assert_allclose(rows["v"], -0.25 * (-2.0 * y), rtol=1e-6)
