"""The order-free baselines (growmem.order_free): kNN, NCM and streaming LDA, each checked against an
independent numpy computation written here (brute-force kNN, np.mean class means, the batch pooled
covariance, an explicit shrunk LDA), order-freeness, the byte budget, non-finite inputs, the state
round trip and the errors."""
import ml_dtypes
import numpy as np
import pytest

from growmem import keyspaces, order_free as of

D, C = 12, 5


def _data(n, seed=0, d=D, classes=C, spread=2.0):
    """Gaussian classes around random centres (so class means and within-class scatter both matter)."""
    rng = np.random.default_rng(seed)
    centres = spread * rng.standard_normal((classes, d))
    y = rng.integers(0, classes, n)
    x = (centres[y] + rng.standard_normal((n, d)) * rng.uniform(0.5, 1.5, d)).astype(np.float32)
    return x, y


def _raw(d=D):
    return keyspaces.Identity(d, normalise=False)


def _feed(model, x, y, sizes):
    """Observe ``x, y`` in consecutive batches of the given sizes (cycled)."""
    a, i = 0, 0
    while a < len(x):
        b = sizes[i % len(sizes)]
        model.observe(x[a:a + b], y[a:a + b])
        a, i = a + b, i + 1
    return model


# ----------------------------------------------------------------------------- independent references

def brute_knn_scores(keys, labels, queries, k, metric, classes):
    """Full float64 distance matrix by direct differences, stable sort, votes + 1/(2 + nearest distance)."""
    keys, queries = keys.astype(np.float64), queries.astype(np.float64)
    if metric == "cosine":
        kn = keys / np.linalg.norm(keys, axis=1, keepdims=True)
        qn = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        dist = 1.0 - qn @ kn.T
    else:
        dist = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    out = np.zeros((len(queries), classes))
    nn = np.argsort(dist, axis=1, kind="stable")[:, :k]
    for b in range(len(queries)):
        for c in range(classes):
            mine = [dist[b, i] for i in nn[b] if labels[i] == c]
            if mine:
                out[b, c] = len(mine) + 1.0 / (2.0 + min(mine))
    return out, nn


def batch_stats(x, y, classes):
    x = x.astype(np.float64)
    mu = np.zeros((classes, x.shape[1]))
    for c in np.unique(y):
        mu[c] = np.mean(x[y == c], axis=0)
    xc = x - mu[y]
    return mu, xc.T @ xc / len(x)


# ----------------------------------------------------------------------------- kNN

@pytest.mark.parametrize("metric,k", [("euclidean", 1), ("euclidean", 3), ("cosine", 5)])
def test_knn_matches_a_brute_force_knn(metric, k):
    x, y = _data(300, seed=1)
    q, _ = _data(40, seed=2)
    m = _feed(of.KNN(_raw(), C, k=k, metric=metric, row_dtype="float32", chunk=37), x, y, [64, 1, 29])
    want, nn = brute_knn_scores(x, y, q, k, metric, C)
    np.testing.assert_allclose(m.predict(q, batch_size=16), want, rtol=1e-5, atol=1e-6)
    _, idx = m.neighbours(q)
    assert np.array_equal(np.sort(idx, axis=1), np.sort(nn, axis=1))


def test_knn_ties_in_votes_go_to_the_nearer_class():
    keys = np.array([[0.0, 0.0], [3.0, 0.0], [10.0, 0.0]], np.float32)
    m = of.KNN(_raw(2), 3, k=2, row_dtype="float32")
    m.observe(keys, [0, 1, 2])
    s = m.predict(np.array([[1.0, 0.0], [2.0, 0.0]], np.float32))
    assert list(s.argmax(1)) == [0, 1]              # one vote each for 0 and 1: the nearer wins
    assert s[0, 2] == 0 and s[0, 0] == pytest.approx(1 + 1 / 3) and s[0, 1] == pytest.approx(1 + 1 / 6)


def test_knn_bfloat16_stores_the_rounded_keys_and_answers_from_them():
    x, y = _data(200, seed=3)
    q, _ = _data(30, seed=4)
    m = _feed(of.KNN(_raw(), C, k=3), x, y, [50])
    rounded = x.astype(ml_dtypes.bfloat16)
    assert m.state()["rows_k"].dtype == rounded.dtype
    assert np.array_equal(m.state()["rows_k"].view(np.uint16), rounded.view(np.uint16))
    want, _ = brute_knn_scores(rounded.astype(np.float32), y, q, 3, "euclidean", C)
    np.testing.assert_allclose(m.predict(q), want, rtol=1e-5, atol=1e-6)
    assert m.row_bytes == 2 * D + 1 and m.nbytes()["rows_in_use_bytes"] == 200 * (2 * D + 1)


MNIST_NORM = (0.1307, 0.3081)


def _pixels(n, d=D, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 256, (n, d)).astype(np.uint8)
    return p, ((p / np.float32(255) - MNIST_NORM[0]) / MNIST_NORM[1]).astype(np.float32), rng.integers(0, C, n)


def test_knn_uint8_stores_the_pixels_and_answers_as_float32():
    p, x, y = _pixels(250)
    _, q, _ = _pixels(30, seed=1)
    m = _feed(of.KNN(_raw(), C, k=3, row_dtype="uint8", normalize=MNIST_NORM, chunk=64), x, y, [100])
    assert np.array_equal(m.state()["rows_k"], p)
    want, _ = brute_knn_scores(x, y, q, 3, "euclidean", C)
    np.testing.assert_allclose(m.predict(q), want, rtol=1e-5, atol=1e-6)
    b = m.nbytes()
    assert b["rows_in_use_bytes"] == 250 * (D + 1) and b["bytes_in_use"] == b["rows_in_use_bytes"] + 8
    with pytest.raises(ValueError, match="not an 8-bit level.*normalize"):
        m.observe(x[:4] + 0.3, y[:4])                 # off the grid of this normalisation
    assert m.rows_in_use() == 250                    # nothing stored by the failed batch
    with pytest.raises(ValueError, match="not an 8-bit level"):
        of.KNN(_raw(), C, row_dtype="uint8", normalize=(0.0, 1.0)).observe(x[:4], y[:4])
    with pytest.raises(ValueError, match="needs normalize"):
        of.KNN(_raw(), C, row_dtype="uint8")
    with pytest.raises(ValueError, match="raw inputs as keys"):
        of.KNN(keyspaces.DCT(side=4, n=2), C, row_dtype="uint8", normalize=MNIST_NORM)
    with pytest.raises(ValueError, match="drop it"):
        of.KNN(_raw(), C, row_dtype="float32", normalize=MNIST_NORM)


def test_dct_keys_are_those_of_the_key_space_whatever_the_pixel_normalisation():
    p, x, y = _pixels(64, d=64, seed=5)
    ks = keyspaces.DCT(side=8, n=4, deskew=True)
    m = of.KNN(ks, C, k=1)
    m.observe(x, y)
    want = np.asarray(ks.prepare(x)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(m.state()["rows_k"].view(np.uint16), want.view(np.uint16))
    plain = of.KNN(keyspaces.DCT(side=8, n=4, deskew=True), C, k=1)
    plain.observe(p / np.float32(255), y)            # the same images without Normalize
    _, q, _ = _pixels(20, d=64, seed=6)
    assert np.array_equal(m.predict(q).argmax(1), plain.predict(q).argmax(1))


# ----------------------------------------------------------------------------- NCM and SLDA

def test_ncm_means_are_the_class_means_and_scores_minus_distances():
    x, y = _data(400, seed=7)
    y[y == 4] = 3                                    # class 4 never observed
    q, _ = _data(25, seed=8)
    m = _feed(of.NCM(_raw(), C), x, y, [1, 7, 64])
    mu, _ = batch_stats(x, y, C)
    np.testing.assert_allclose(m.means[:4], mu[:4], rtol=1e-5, atol=1e-5)
    assert list(m.class_counts) == [int((y == c).sum()) for c in range(C)]
    s = m.predict(q)
    want = -np.sqrt(((q[:, None, :].astype(np.float64) - mu[None, :4]) ** 2).sum(-1))
    np.testing.assert_allclose(s[:, :4], want, rtol=1e-5, atol=1e-5)
    assert np.all(s[:, 4] < s[:, :4].min(1))         # an unseen class never wins
    assert m.rows_in_use() == 4


def test_slda_streaming_update_gives_the_batch_means_and_pooled_covariance():
    x, y = _data(500, seed=9)
    m = of.SLDA(_raw(), C)
    for i in range(40):                              # one sample at a time first, then batches
        m.observe(x[i:i + 1], y[i:i + 1])
    _feed(m, x[40:], y[40:], [3, 100, 17])
    mu, cov = batch_stats(x, y, C)
    np.testing.assert_allclose(m.means, mu, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.cov, cov, rtol=1e-4, atol=1e-5)
    assert m.cov.dtype == np.float32 and m.class_counts.sum() == 500


@pytest.mark.parametrize("eps", [1e-4, 0.3])
def test_slda_predicts_as_an_explicit_shrunk_lda(eps):
    x, y = _data(400, seed=10)
    q, _ = _data(30, seed=11)
    m = _feed(of.SLDA(_raw(), C, shrinkage=eps), x, y, [50])
    mu, cov = batch_stats(x, y, C)
    lam = np.linalg.inv((1 - eps) * cov + eps * np.eye(D))
    want = q.astype(np.float64) @ lam @ mu.T - 0.5 * np.einsum("cd,de,ce->c", mu, lam, mu)
    np.testing.assert_allclose(m.predict(q), want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert np.array_equal(m.predict(q).argmax(1), want.argmax(1))


def test_slda_unseen_classes_never_win():
    x, y = _data(200, seed=12)
    m = of.SLDA(_raw(), C)
    m.observe(x[y < 2], y[y < 2])
    s = m.predict(x)
    assert set(s.argmax(1)) <= {0, 1} and np.all(s[:, 2:] < s[:, :2].min(1, keepdims=True))


# ----------------------------------------------------------------------------- order-freeness

def test_class_incremental_and_shuffled_orders_give_the_same_models():
    x, y = _data(600, seed=13)
    inc = np.argsort(y, kind="stable")               # classes arrive one after another
    shuf = np.random.default_rng(0).permutation(len(y))
    q, _ = _data(40, seed=14)
    for make in (lambda: of.NCM(_raw(), C), lambda: of.SLDA(_raw(), C)):
        a, b = _feed(make(), x[inc], y[inc], [32]), _feed(make(), x[shuf], y[shuf], [32])
        for key, v in a.state().items():
            if key != "rng":
                np.testing.assert_allclose(v, b.state()[key], rtol=1e-5, atol=1e-5)
        assert np.array_equal(a.predict(q).argmax(1), b.predict(q).argmax(1))
    budget = 600 * (2 * D + 1) + 10                 # holds every sample: nothing evicted
    a = _feed(of.KNN(_raw(), C, budget_bytes=budget), x[inc], y[inc], [32])
    b = _feed(of.KNN(_raw(), C, budget_bytes=budget), x[shuf], y[shuf], [32])

    def rows(m):
        st = m.state()
        r = np.concatenate([st["rows_k"].view(np.uint16), st["rows_y"][:, None].astype(np.uint16)], axis=1)
        return r[np.lexsort(r.T[::-1])]
    assert a.counts["evicted"] == 0 and np.array_equal(rows(a), rows(b))
    np.testing.assert_array_equal(a.predict(q), b.predict(q))


# ----------------------------------------------------------------------------- budgets

def test_knn_budget_holds_the_bytes_and_evicts_class_balanced():
    x, y = _data(1200, seed=15)
    inc = np.argsort(y, kind="stable")
    row = 2 * D + 1
    budget = 400 * row + 5
    m = of.KNN(_raw(), C, budget_bytes=budget)
    for a in range(0, len(x), 50):
        m.observe(x[inc][a:a + 50], y[inc][a:a + 50])
        b = m.nbytes()
        assert b["bytes_in_use"] <= budget and b["bytes_allocated"] <= budget
    counts = np.bincount(m.state()["rows_y"], minlength=C)
    assert counts.sum() == 400 and m.counts["evicted"] == 1200 - 400
    assert counts.max() - counts.min() <= max(2, 0.03 * counts.max()), counts   # every class kept alike
    with pytest.raises(ValueError, match=r"holds 3 samples of 25 B.*at least 125 B"):
        of.KNN(_raw(), C, budget_bytes=3 * row + 1)


@pytest.mark.parametrize("keep", [240, 122])          # 122 rows: the classes cannot hold equal shares
def test_knn_budget_keeps_every_domain_of_a_class_that_comes_back(keep):
    """A class-balanced *reservoir*: on a domain-incremental stream (every class in each of 8 domains, one
    after the other) each class's rows stay a uniform sample of its stream, so every domain keeps about an
    eighth of them. Random replacement would keep a stored row for ~``max_rows / batch`` batches: the first
    domains would be gone (so would a CBRS without its "stays full" rule when the classes do not divide the
    rows). Checked against the binomial spread of a uniform sample."""
    rng = np.random.default_rng(21)
    domains, per = 8, 300
    x = rng.normal(size=(domains * per, D)).astype(np.float32)
    x[:, 0] = np.repeat(np.arange(domains), per) * 10.0          # the domain, readable from the stored keys
    y = rng.integers(0, C, len(x))
    m = of.KNN(_raw(), C, budget_bytes=keep * (4 * D + 1) + 5, row_dtype="float32", seed=4)
    for a in range(0, len(x), 32):
        m.observe(x[a:a + 32], y[a:a + 32])
    st = m.state()
    dom = np.rint(np.asarray(st["rows_k"], np.float32)[:, 0] / 10.0).astype(int)
    counts = np.bincount(dom, minlength=domains)
    assert counts.sum() == keep and m.counts["evicted"] == len(x) - keep
    sd = np.sqrt(keep * (1 / domains) * (1 - 1 / domains))
    assert np.all(np.abs(counts - keep / domains) <= 4 * sd), counts   # the first domain too
    held = np.bincount(st["rows_y"], minlength=C)
    assert held.max() - held.min() <= 1, held


@pytest.mark.parametrize("cls", [of.NCM, of.SLDA])
def test_fixed_size_models_refuse_a_budget_below_their_size(cls):
    size = C * D * 4 + C * 8 + (D * D * 4 if cls is of.SLDA else 0)
    assert cls(_raw(), C).nbytes()["bytes_in_use"] == size
    cls(_raw(), C, budget_bytes=size)
    with pytest.raises(ValueError, match=rf"fixed size of {size} B.*budget of {size - 1} B"):
        cls(_raw(), C, budget_bytes=size - 1)


# ----------------------------------------------------------------------------- non-finite inputs, empty models

@pytest.mark.parametrize("make", [lambda: of.KNN(_raw(), C, row_dtype="float32"), lambda: of.NCM(_raw(), C),
                                  lambda: of.SLDA(_raw(), C)], ids=["knn", "ncm", "slda"])
def test_non_finite_inputs_are_dropped_and_counted(make):
    x, y = _data(120, seed=16)
    bad = x.copy()
    bad[[3, 50, 77], [0, 5, 11]] = [np.nan, np.inf, -np.inf]
    m, clean = make(), make()
    assert not make().predict(x[:4]).any()           # zeros while empty
    out = m.observe(bad, y)
    ok = np.ones(120, bool)
    ok[[3, 50, 77]] = False
    clean.observe(x[ok], y[ok])
    assert out["dropped"] == 3 and m.counts["dropped"] == 3 and m.counts["stored"] == 117
    for key, v in m.state().items():
        if key not in ("counts", "rng"):
            assert np.array_equal(v, clean.state()[key]), key
    s = m.predict(bad[:6])
    assert np.all(np.isfinite(s)) and not s[3].any() and s[0].any()


# ----------------------------------------------------------------------------- state

@pytest.mark.parametrize("make", [lambda: of.KNN(_raw(), C, budget_bytes=150 * (2 * D + 1), seed=3),
                                  lambda: of.NCM(_raw(), C), lambda: of.SLDA(_raw(), C, shrinkage=0.01)],
                         ids=["knn", "ncm", "slda"])
def test_state_round_trip_is_exact_and_training_continues_identically(make):
    x, y = _data(500, seed=17)
    q, _ = _data(30, seed=18)
    a = _feed(make(), x[:250], y[:250], [40])
    st = {k: v.copy() for k, v in a.state().items()}
    if "rows_k" in st:                               # a checkpoint gives bfloat16 back as 2-byte voids
        st["rows_k"] = st["rows_k"].view(np.dtype("V2"))
    b = make()
    b.load_state(st)
    np.testing.assert_array_equal(a.predict(q), b.predict(q))
    _feed(a, x[250:], y[250:], [40])
    _feed(b, x[250:], y[250:], [40])
    assert a.counts == b.counts and (a.counts["evicted"] > 0) == isinstance(a, of.KNN)
    sa, sb = a.state(), b.state()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
    np.testing.assert_array_equal(a.predict(q), b.predict(q))


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("build,match", [
    (lambda: of.KNN(_raw(), C, k=0), "k .* integer >= 1"),
    (lambda: of.KNN(_raw(), C, k=2.5), "k .* integer >= 1"),
    (lambda: of.KNN(_raw(), C, metric="manhattan"), "metric must be one of"),
    (lambda: of.KNN(_raw(), C, row_dtype="float16"), "row_dtype must be one of"),
    (lambda: of.KNN(_raw(), C, chunk=0), "chunk"),
    (lambda: of.SLDA(_raw(), C, shrinkage=0.0), r"shrinkage .* \(0, 1\]"),
    (lambda: of.SLDA(_raw(), C, shrinkage=1.5), r"shrinkage .* \(0, 1\]"),
    (lambda: of.SLDA(_raw(), C, shrinkage=float("nan")), r"shrinkage .* \(0, 1\]"),
    (lambda: of.NCM(_raw(), 0), "d_out must be >= 1"),
    (lambda: of.NCM(_raw(), C, budget_bytes=0), "budget_bytes must be a positive number of bytes"),
    (lambda: of.NCM(np.eye(3), C), "must be a growmem.keyspaces.KeySpace"),
    (lambda: of.SLDA(keyspaces.Subspaces(D, dim=2, n_fit=10), C), "fixed key space with one regime"),
])
def test_bad_arguments_are_named(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_inputs_are_named():
    m = of.NCM(_raw(), C)
    x, y = _data(10)
    with pytest.raises(ValueError, match=r"\(B, features\)"):
        m.observe(x[0], y[:1])
    with pytest.raises(ValueError, match="outside the memory's 5 classes"):
        m.observe(x, np.full(10, 5))
    with pytest.raises(ValueError, match="integers"):
        m.observe(x, np.full(10, 0.5))
    with pytest.raises(ValueError, match="got 9 labels for 10 inputs"):
        m.observe(x, y[:9])
    assert m.counts["seen"] == 0
    st = of.SLDA(_raw(), C).state()
    with pytest.raises(ValueError, match="does not fit"):
        of.SLDA(_raw(D + 1), C).load_state(st)


def test_describe_names_the_model_and_its_settings():
    m = of.KNN(_raw(), C, k=4, metric="cosine")
    m.observe(*_data(20))
    d = m.describe()
    assert (d["model"], d["k"], d["metric"], d["row_dtype"], d["stored"], d["keys"]["name"]) == \
        ("knn", 4, "cosine", "bfloat16", 20, "identity")
    assert of.SLDA(_raw(), C, shrinkage=0.2).describe()["shrinkage"] == 0.2


def test_a_state_saved_with_the_generator_as_text_by_an_earlier_growmem_still_resumes_exactly():
    x, y = _data(400, seed=5)
    a = _feed(of.KNN(_raw(), C, budget_bytes=100 * (2 * D + 1), seed=3), x[:200], y[:200], [40])
    st = {k: v.copy() for k, v in a.state().items()}
    assert st["rng"].dtype == np.uint64 and st["rng"].shape == (6,)
    st["rng"] = np.frombuffer(repr(a.rng.bit_generator.state).encode(), np.uint8)   # the earlier format
    st["rows_k"] = st["rows_k"].view(np.dtype("V2"))
    b = of.KNN(_raw(), C, budget_bytes=100 * (2 * D + 1), seed=99)
    b.load_state(st)
    _feed(a, x[200:], y[200:], [40])
    _feed(b, x[200:], y[200:], [40])
    assert a.counts == b.counts and a.counts["evicted"] > 0
    sa, sb = a.state(), b.state()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
