"""Target memories (growmem.nadaraya) and key spaces (growmem.keyspaces), each against an
independent computation: numpy sums for (NW-1) and (KS-1), finite differences for ∂/∂log T,
brute-force leave-one-out, scipy for the deskew and the DCT."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import config, kernels, keyspaces, nadaraya, units
from growmem.memory import row_bytes


def _nw_numpy(zs, offsets, ks, vs, t, d):
    """(NW-1) with δ = r_j + ‖z_j − k‖² over all regimes, in float64."""
    num, den = 0.0, 0.0
    logits = []
    for z, r, k, v in zip(zs, offsets, ks, vs):
        d2 = r[:, None] + ((z[:, None, :] - k[None, :, :]) ** 2).sum(-1)
        logits.append((-d2 / (2 * t * math.sqrt(d)), v))
    m = np.max([lg.max(axis=1) for lg, _ in logits], axis=0)
    for lg, v in logits:
        e = np.exp(lg - m[:, None])
        num = num + e @ v
        den = den + e.sum(1)
    return num / den[:, None]


def test_nadaraya_watson_kernel_is_the_normalised_gaussian_estimator():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(5, 7)), rng.normal(size=(40, 7)), rng.normal(size=(40, 3))
    y = kernels.retrieve(kernels.NADARAYA_WATSON, jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                         jnp.asarray(v, jnp.float32), jnp.ones(40, jnp.float32), temperature=0.7, size=31, chunk=8)
    want = _nw_numpy([q], [np.zeros(5)], [k[:31]], [v[:31]], 0.7, 7)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=1e-6)


def test_target_rule_recovers_the_target_from_a_squared_error_gradient():
    from growmem import rules
    rng = np.random.default_rng(1)
    q, s, y = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((4, 3), (4, 2), (4, 2)))
    # g: the per-sample gradient of ℓ_n = ½‖s_n − y_n‖², by autodiff (not by the formula the rule inverts)
    g = jax.grad(lambda s_: 0.5 * jnp.sum((s_ - y) ** 2))(s)
    rows = rules.target(q, s, g)
    np.testing.assert_allclose(np.asarray(rows.v), np.asarray(y), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(rows.k), np.asarray(q))
    np.testing.assert_array_equal(np.asarray(rows.w), np.ones(4))


def _two_regime_memory(rng, t=0.9, n=(30, 20), d=12, dim=4):
    ks = keyspaces.Subspaces(d, dim=dim, n_fit=dim + 1, rho=0.5, param_dtype="float32")
    mus = [rng.normal(size=d).astype(np.float32) for _ in n]
    us = [np.linalg.qr(rng.normal(size=(d, dim)))[0].T.astype(np.float32) for _ in n]
    ks.load_state({"n_regimes": np.asarray(2), "buf_x": np.zeros((0, d), np.float16),
                   "mu_0": mus[0], "U_0": us[0], "mu_1": mus[1], "U_1": us[1]})
    m = nadaraya.TargetMemory(ks, 3, temperature=t, row_dtype="float32", learn_temperature=False)
    codes, labels = [], []
    for j, nj in enumerate(n):
        x = (mus[j] + rng.normal(size=(nj, dim)) @ us[j] + 0.1 * rng.normal(size=(nj, d))).astype(np.float32)
        y = rng.integers(0, 3, nj)
        m._store(j, x, np.eye(3, dtype=np.float32)[y])
        codes.append((x - mus[j]) @ us[j].T)
        labels.append(y)
    return m, mus, us, codes, labels


def test_target_memory_over_two_regimes_equals_the_numpy_sum_with_residual_offsets():
    rng = np.random.default_rng(2)
    m, mus, us, codes, labels = _two_regime_memory(rng)
    x = rng.normal(size=(6, 12)).astype(np.float32) + mus[0]
    zs = [(x - mu) @ u.T for mu, u in zip(mus, us)]
    offs = [((x - mu) ** 2).sum(1) - (z ** 2).sum(1) for mu, z in zip(mus, zs)]
    want = _nw_numpy(zs, offs, codes, [np.eye(3)[y] for y in labels], 0.9, 4)
    np.testing.assert_allclose(m.predict(x), want, rtol=1e-4, atol=1e-6)


def test_the_bandwidth_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    m, mus, us, codes, labels = _two_regime_memory(rng)
    x = (mus[1] + rng.normal(size=(8, 4)) @ us[1] + 0.1 * rng.normal(size=(8, 12))).astype(np.float32)
    y = rng.integers(0, 3, 8)

    def loss(log_t):
        zs = [(x - mu) @ u.T for mu, u in zip(mus, us)]
        offs = [((x - mu) ** 2).sum(1) - (z ** 2).sum(1) for mu, z in zip(mus, zs)]
        p = _nw_numpy(zs, offs, codes, [np.eye(3)[c] for c in labels], math.exp(log_t), 4)
        return float(np.mean(-np.log(p[np.arange(8), y])))

    lt = math.log(0.9)
    fd = (loss(lt + 1e-4) - loss(lt - 1e-4)) / 2e-4
    val, g = nadaraya.loss_and_grad(jnp.float32(lt), m.mems, m.keys.params(), jnp.asarray(x),
                                    jnp.asarray(np.eye(3, dtype=np.float32)[y]), classify=True,
                                    project=m.keys.project, chunk=m.chunk)
    assert float(val) == pytest.approx(loss(lt), rel=1e-4)
    assert float(g) == pytest.approx(fd, rel=2e-3, abs=1e-5)


def test_observe_takes_one_clipped_sgd_step_on_log_t_before_storing_the_batch():
    rng = np.random.default_rng(4)
    ks = keyspaces.Identity(5, normalise=False)
    m = nadaraya.TargetMemory(ks, 2, temperature=1.0, lr=0.1, row_dtype="float32")
    x0, y0 = rng.normal(size=(16, 5)).astype(np.float32), rng.integers(0, 2, 16)
    m.observe(x0, y0)                                  # empty memory: nothing to learn T from
    assert m.temperature == pytest.approx(1.0)
    x1, y1 = rng.normal(size=(8, 5)).astype(np.float32), rng.integers(0, 2, 8)
    lt = 0.0

    def loss(log_t):
        p = _nw_numpy([x1.astype(np.float64)], [np.zeros(8)], [x0], [np.eye(2)[y0]], math.exp(log_t), 5)
        return np.mean(-np.log(p[np.arange(8), y1]))
    g = (loss(lt + 1e-4) - loss(lt - 1e-4)) / 2e-4
    m.observe(x1, y1)
    assert math.log(m.temperature) == pytest.approx(lt - 0.1 * max(-1.0, min(1.0, g)), abs=1e-5)
    assert m.rows_in_use() == 24


def test_no_forgetting_the_answers_do_not_depend_on_the_order_of_the_stream():
    """With T fixed and every row kept, a class-incremental order and a shuffled order store the
    same rows and answer the same (the sum (NW-1) does not depend on row order)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + 2 * (x[:, 1] > 0)
    by_class = np.argsort(y, kind="stable")
    shuffled = rng.permutation(400)
    preds = []
    for order in (by_class, shuffled):
        m = nadaraya.TargetMemory(keyspaces.Identity(6), 4, temperature=0.05, learn_temperature=False,
                                  row_dtype="float32")
        for a in range(0, 400, 32):
            m.observe(x[order[a:a + 32]], y[order[a:a + 32]])
        preds.append(m.predict(x[:50]))
    np.testing.assert_allclose(preds[0], preds[1], rtol=1e-5, atol=1e-6)


def test_leave_one_out_margins_equal_a_brute_force_recomputation():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(60, 5)).astype(np.float32)
    y = rng.integers(0, 3, 60)
    m = nadaraya.TargetMemory(keyspaces.Identity(5, normalise=False), 3, temperature=0.3, learn_temperature=False,
                              row_dtype="float32")
    m.observe(x, y)
    rows = np.array([0, 7, 33, 59])
    got = np.asarray(nadaraya._loo_margins(jnp.float32(math.log(0.3)), m.mems[0], jnp.asarray(rows),
                                           jnp.asarray(y[rows], jnp.int32), chunk=m.chunk))
    for i, r in enumerate(rows):
        keep = np.arange(60) != r
        p = _nw_numpy([x[r:r + 1].astype(np.float64)], [np.zeros(1)], [x[keep]], [np.eye(3)[y[keep]]], 0.3, 5)[0]
        want = p[y[r]] - np.max(np.delete(p, y[r]))
        assert got[i] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("evict", [e for e in nadaraya.EVICTIONS if e != "merge"])
def test_a_budget_bounds_the_bytes_in_use_and_allocated_and_evicts_from_the_largest_class(evict):
    rng = np.random.default_rng(7)
    d, n_cls = 8, 4
    per_row = 4 + 2 * (d + n_cls) + 4                           # w f32, k and ṽ bf16, born i32
    assert row_bytes(d, n_cls, jnp.bfloat16) == per_row
    budget = 1200 * per_row + 8                                 # 1200 rows beside T and the step
    in_use_cap = 1200 - 64                                      # one allocation of 1200 rows, a batch kept free
    m = nadaraya.TargetMemory(keyspaces.Identity(d), n_cls, temperature=0.1, budget_bytes=budget, evict=evict)
    y = np.r_[np.zeros(1000, int), rng.integers(1, 4, 300)]     # class 0 dominates
    x = rng.normal(size=(1300, d)).astype(np.float32)
    for a in range(0, 1300, 64):
        m.observe(x[a:a + 64], y[a:a + 64])
        arrays = m.mems[0].rows()
        in_use = sum(a.nbytes for a in arrays.values()) + 8
        allocated = sum(getattr(m.mems[0], f).nbytes for f in ("w", "k", "v", "born")) + 8
        assert in_use == m.nbytes()["bytes_in_use"] <= budget
        assert allocated == m.nbytes()["bytes_allocated"] <= budget
    lab = np.argmax(m.mems[0].rows()["v"].astype(np.float32), axis=1)
    np.testing.assert_array_equal(lab, m.labels[0])
    assert m.rows_in_use() == in_use_cap and m.counts["evicted"] == 1300 - in_use_cap
    assert np.bincount(lab, minlength=4)[1:].sum() == 300               # only the largest class lost rows
    if evict == "oldest":
        born = np.sort(m.mems[0].rows()["born"][lab == 0])
        kept0 = len(born)                                           # class 0's newest rows are the ones kept
        assert born[0] >= (1000 - kept0) // 64 - 1


def test_a_budget_too_small_for_the_key_space_is_refused():
    with pytest.raises(ValueError, match="cannot hold the key space's state"):
        nadaraya.TargetMemory(keyspaces.Subspaces(784, dim=30, n_fit=1000), 10, temperature=1.0,
                              budget_bytes=1_000_000)


def test_non_finite_inputs_never_enter_the_memory():
    m = nadaraya.TargetMemory(keyspaces.Identity(3, normalise=False), 2, temperature=1.0, row_dtype="float32")
    x = np.array([[1, 2, 3], [np.nan, 0, 0], [0, np.inf, 1], [4, 5, 6]], np.float32)
    m.observe(x, np.array([0, 1, 0, 1]))
    assert m.rows_in_use() == 2 and m.counts["dropped"] == 2
    assert np.all(np.isfinite(m.mems[0].rows()["k"]))
    assert np.all(np.isfinite(m.predict(x[[0, 3]])))


def test_bad_inputs_are_refused_with_a_clear_error():
    ks = keyspaces.Identity(3)
    with pytest.raises(ValueError, match="temperature"):
        nadaraya.TargetMemory(ks, 2, temperature=0.0)
    with pytest.raises(ValueError, match="eviction"):
        nadaraya.TargetMemory(ks, 2, temperature=1.0, evict="lru")
    m = nadaraya.TargetMemory(ks, 2, temperature=1.0)
    with pytest.raises(ValueError, match="outside the memory's 2 classes"):
        m.observe(np.zeros((2, 3), np.float32), np.array([0, 2]))
    with pytest.raises(ValueError, match="DCT keys take images of 28x28"):
        keyspaces.DCT(28, 10).prepare(np.zeros((2, 100), np.float32))


def test_state_round_trip_answers_and_continues_identically():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(480, 10)).astype(np.float32)
    y = rng.integers(0, 3, 480)
    make = lambda: nadaraya.TargetMemory(keyspaces.Subspaces(10, dim=3, n_fit=20, rho=0.5), 3,  # noqa: E731
                                         temperature=0.5, budget_bytes=12008, seed=3)  # the smallest budget
    a = make()
    for i in range(0, 320, 16):
        a.observe(x[i:i + 16], y[i:i + 16])
    assert a.counts["evicted"] > 0                     # the state carries an evicting memory
    b = make()
    b.load_state({k: np.array(v) for k, v in a.state().items()})
    for i in range(320, 480, 16):
        a.observe(x[i:i + 16], y[i:i + 16])
        b.observe(x[i:i + 16], y[i:i + 16])
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert a.temperature == b.temperature and a.counts == b.counts


def test_subspaces_open_a_new_regime_when_the_inputs_change_and_not_otherwise():
    rng = np.random.default_rng(9)
    d = 40
    bases = [np.linalg.qr(rng.normal(size=(d, 3)))[0].T for _ in range(2)]
    draw = lambda j, n: (rng.normal(size=(n, 3)) @ bases[j] + 0.01 * rng.normal(size=(n, d))).astype(np.float32)  # noqa
    m = nadaraya.TargetMemory(keyspaces.Subspaces(d, dim=3, n_fit=50, rho=0.5), 2, temperature=0.5)
    for _ in range(10):
        m.observe(draw(0, 16), rng.integers(0, 2, 16))
    assert m.keys.n_regimes == 1
    for _ in range(10):
        m.observe(draw(1, 16), rng.integers(0, 2, 16))
    assert m.keys.n_regimes == 2
    assert m.rows() == {"regime0": 160, "regime1": 160}          # every input stored once: buffered ones after the fit
    assert m.nbytes()["key_space_bytes"] == 2 * (d + 3 * d) * 2 + 0   # float16 μ and U, empty buffer


def test_deskew_matches_scipys_affine_transform():
    import scipy.ndimage as scipy_ndimage
    rng = np.random.default_rng(10)
    imgs = np.zeros((3, 28, 28), np.float32)
    for i in range(3):                                   # slanted strokes
        for r in range(5, 23):
            c = 8 + i * 3 + (r * (i + 1)) // 6
            imgs[i, r, c:c + 3] = rng.uniform(0.5, 1.0, 3)
    got = np.asarray(keyspaces.deskew(imgs))
    ii, jj = np.mgrid[:28, :28]
    for n, x in enumerate(imgs):
        s = x.sum()
        ci, cj = (ii * x).sum() / s, (jj * x).sum() / s
        alpha = ((ii - ci) * (jj - cj) * x).sum() / ((ii - ci) ** 2 * x).sum()
        a = np.array([[1, 0], [alpha, 1]])
        off = np.array([ci, cj]) - a @ np.array([13.5, 13.5])
        want = scipy_ndimage.affine_transform(x, a, offset=off, order=1, mode="grid-constant")
        np.testing.assert_allclose(got[n], want, atol=1e-4)


def test_dct_keys_are_the_orthonormal_dct_of_the_deskewed_image_and_ignore_pixel_normalisation():
    import scipy.fft as fft
    c = keyspaces.dct_matrix(28, 28)
    np.testing.assert_allclose(c @ c.T, np.eye(28), atol=1e-5)
    rng = np.random.default_rng(11)
    x = rng.uniform(0, 1, size=(4, 784)).astype(np.float32)
    x[:, :30] = 0.0
    ks = keyspaces.DCT(28, 6, deskew=False)
    want = fft.dctn(x.reshape(4, 28, 28) - x.reshape(4, -1).min(1)[:, None, None], norm="ortho", axes=(1, 2))
    want = want[:, :6, :6].reshape(4, -1)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(np.asarray(ks.prepare(x)), want, atol=1e-5)
    ks = keyspaces.DCT(28, 10)
    np.testing.assert_allclose(np.asarray(ks.prepare((x - 0.1307) / 0.3081)), np.asarray(ks.prepare(x)), atol=1e-4)


def test_target_presets_load_validate_and_build_memories(tmp_path):
    p = config.load("target_dct")
    assert p.kind == "target" and p.settings["batch_size"] == 32
    m = p.memory(784, 10)
    assert isinstance(m.keys, keyspaces.DCT) and m.row_bytes == 228 and m.budget_bytes is None
    s = config.load("target_subspaces")
    assert s.budget_bytes == 15_700_000
    bad = tmp_path / "bad.toml"
    bad.write_text('description = "x"\n[target]\ntemperature = 1.0\n[keys]\nkind = "dct"\ndim = 3\n')
    with pytest.raises(config.ConfigError, match="keys.dim' does not apply to key space 'dct'"):
        config.load(bad)
    bad.write_text('description = "x"\n[target]\nevict = "lru"\ntemperature = 1.0\n')
    with pytest.raises(config.ConfigError, match="target.evict"):
        config.load(bad)
    bad.write_text('description = "x"\n[target]\nlr = 0.1\n')
    with pytest.raises(config.ConfigError, match="target.temperature' is missing"):
        config.load(bad)


def test_sizes_are_si_for_mb_and_binary_for_mib():
    assert units.parse_size("15.7MB") == 15_700_000
    assert units.parse_size("1MiB") == 1 << 20
    assert units.parse_size("2 kB") == 2000
    with pytest.raises(ValueError, match="cannot read"):
        units.parse_size("12 parsecs")


def test_continual_learner_runs_a_target_preset_and_resumes_from_a_checkpoint_exactly(tmp_path):
    from growmem.checkpoint import Checkpointer
    from growmem.continual import GrowmemConfig, GrowmemLearner

    rng = np.random.default_rng(12)
    x = rng.uniform(0, 1, size=(480, 784)).astype(np.float32)
    y = rng.integers(0, 10, 480)
    make = lambda: GrowmemLearner(GrowmemConfig(preset="target_dct"), num_classes=10, input_size=784,  # noqa: E731
                                  budget_bytes=400 * 228 + 1128, seed=1)   # 400 rows beside the DCT factor
    a = make()
    for i in range(0, 96, 32):
        a.step(x[i:i + 32], y[i:i + 32])
    b_ = a.memory_bytes()
    tm = a.trainers["task0"]
    rows = tm.mems[0].rows()
    assert b_["rows_in_use_bytes"] == sum(v.nbytes for v in rows.values()) == 96 * 228
    assert b_["bytes_in_use"] == b_["rows_in_use_bytes"] + tm.keys.nbytes() + 8
    with Checkpointer(tmp_path / "ck") as ck:
        a.save(ck, 1, config={"k": 1})
    b = make()
    with Checkpointer(tmp_path / "ck") as ck:
        b.restore(ck, config={"k": 1})
    for i in range(96, 480, 32):
        a.step(x[i:i + 32], y[i:i + 32])
        b.step(x[i:i + 32], y[i:i + 32])
    cap = 400 - 32                                                        # 400 rows allocated, a batch kept free
    assert a.rows_in_use() == b.rows_in_use() == {"task0/regime0": cap}
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    with pytest.raises(ValueError, match="target memory"):
        GrowmemConfig(preset="target_dct", max_rows=10).load()


# ----------------------------------------------------------------------------- rows that become prototypes

def _merge_memory(d, n_cls, rows, **kw):
    per_row = row_bytes(d, n_cls, jnp.float32)
    return nadaraya.TargetMemory(keyspaces.Identity(d, normalise=False), n_cls, temperature=0.5, row_dtype="float32",
                                 budget_bytes=rows * per_row + 8, evict="merge", learn_temperature=False, **kw)


def test_merge_keeps_every_sample_within_one_allocation_of_the_budget():
    """Nothing is thrown away: per class, Σ w equals the samples seen and Σ w·k their sum (a weighted mean
    and a running mean both conserve it) — checked against numpy sums of the inputs; the rows as allocated
    never pass the budget, and the classes end with equal shares."""
    rng = np.random.default_rng(21)
    d, n_cls, rows = 5, 3, 30
    m = _merge_memory(d, n_cls, rows, candidates=4, seed=2)
    budget = m.budget_bytes
    y = np.r_[np.zeros(300, int), rng.integers(1, 3, 300)]          # class 0 first, then 1 and 2
    x = (rng.normal(size=(600, d)) + 3 * y[:, None]).astype(np.float32)
    for a in range(0, 600, 10):
        m.observe(x[a:a + 10], y[a:a + 10])
        nb = m.nbytes()
        assert nb["bytes_in_use"] <= nb["bytes_allocated"] <= budget and m.rows_in_use() <= rows
    r = m.mems[0].rows()
    lab = np.argmax(r["v"], axis=1)
    np.testing.assert_array_equal(lab, m.labels[0])
    assert m.rows_in_use() == rows and m.counts["evicted"] == 0 and m.counts["merged"] == 600 - rows
    for c in range(n_cls):
        sel = lab == c
        assert r["w"][sel].sum() == pytest.approx((y == c).sum())
        np.testing.assert_allclose((r["w"][sel, None] * r["k"][sel]).sum(0), x[y == c].sum(0), rtol=1e-4, atol=1e-3)
    assert np.bincount(lab, minlength=n_cls).tolist() == [10, 10, 10]
    np.testing.assert_array_equal(r["v"], r["w"][:, None] * np.eye(n_cls)[lab])    # ṽ: the targets absorbed
    # the estimator weighs each prototype by the samples it stands for: (NW-1) with w, in float64
    want = _nw_weighted(x[:50].astype(np.float64), r["k"].astype(np.float64), r["v"].astype(np.float64),
                        r["w"].astype(np.float64), 0.5, d)
    np.testing.assert_allclose(m.predict(x[:50]), want, rtol=1e-4, atol=1e-5)


def _nw_weighted(q, k, v, w, t, d):
    """Σ e^{a_i} ṽ_i / Σ w_i e^{a_i} (Eq. 8's weighted form), float64."""
    a = -((q[:, None, :] - k[None]) ** 2).sum(-1) / (2 * t * math.sqrt(d))
    e = np.exp(a - a.max(1, keepdims=True))
    return (e @ v) / (e @ w)[:, None]


def test_merge_follows_wards_criterion():
    """Three rows of one class at 0, 1 and 10: a sample at 10.2 costs ½·0.04 to absorb, less than the
    cheapest merge (0 and 1: ½·1), so the row at 10 becomes their mean; a sample at 5 would cost
    ⅔·5.1² to absorb, so 0 and 1 merge (w = 2 at 0.5) and the sample takes the freed row. A sample of
    the other class then frees a row of the larger class by its cheapest merge."""
    m = _merge_memory(1, 2, 3, candidates=8)
    m.observe(np.array([[0.0], [1.0], [10.0]], np.float32), np.array([0, 0, 0]))
    m.observe(np.array([[10.2]], np.float32), np.array([0]))
    rows = lambda: sorted(zip(np.argmax(r["v"], 1).tolist(), np.round(r["k"][:, 0].astype(float), 4).tolist(),  # noqa: E731
                              r["w"].tolist(), r["v"].max(1).tolist()))
    r = m.mems[0].rows()
    assert rows() == [(0, 0.0, 1.0, 1.0), (0, 1.0, 1.0, 1.0), (0, 10.1, 2.0, 2.0)]       # ṽ: the targets absorbed
    m.observe(np.array([[5.0]], np.float32), np.array([0]))
    r = m.mems[0].rows()
    assert rows() == [(0, 0.5, 2.0, 2.0), (0, 5.0, 1.0, 1.0), (0, 10.1, 2.0, 2.0)]
    m.observe(np.array([[-3.0]], np.float32), np.array([1]))         # class 1 takes a row of class 0
    r = m.mems[0].rows()
    got = [g[:3] for g in rows()]
    # cheapest merge of class 0: (0.5, w 2) with (5, w 1) costs ⅔·20.25 = 13.5 < (5, 10.1): ⅔·26.01
    assert got == [(0, 2.0, 3.0), (0, 10.1, 2.0), (1, -3.0, 1.0)]


def test_merge_state_round_trip_continues_identically_and_refuses_several_regimes():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = rng.integers(0, 3, 400)
    a = _merge_memory(4, 3, 24, seed=9)
    for i in range(0, 200, 8):
        a.observe(x[i:i + 8], y[i:i + 8])
    b = _merge_memory(4, 3, 24, seed=9)
    b.load_state({k: np.array(v) for k, v in a.state().items()})
    for i in range(200, 400, 8):
        a.observe(x[i:i + 8], y[i:i + 8])
        b.observe(x[i:i + 8], y[i:i + 8])
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert a.counts == b.counts and a.counts["merged"] == 400 - 24
    with pytest.raises(ValueError, match="one regime"):
        nadaraya.TargetMemory(keyspaces.Subspaces(10, dim=3, n_fit=20), 3, temperature=1.0, evict="merge",
                              budget_bytes=100_000)


def test_merge_drops_non_finite_samples_and_a_budget_holds_any_batch_it_can():
    m = _merge_memory(3, 2, 6)
    x = np.array([[0, 0, 0], [np.nan, 1, 1], [1, 1, np.inf], [2, 2, 2]], np.float32)
    m.observe(x, np.array([0, 1, 0, 1]))
    assert m.rows_in_use() == 2 and m.counts["dropped"] == 2 and np.all(np.isfinite(m.mems[0].rows()["k"]))
    big = np.zeros((40, 3), np.float32)
    m.observe(big, np.zeros(40, int))                                 # merging needs no room for the batch
    assert m.rows_in_use() == 6 and m.mems[0].rows()["w"].sum() == 42
    other = nadaraya.TargetMemory(keyspaces.Identity(3, normalise=False), 2, temperature=0.5, row_dtype="float32",
                                  budget_bytes=6 * row_bytes(3, 2, jnp.float32) + 8, evict="random")
    with pytest.raises(ValueError, match="does not fit a target memory whose budget holds 6 rows"):
        other.observe(big[:5], np.zeros(5, int))
