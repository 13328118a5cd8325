"""kNN and RBF kernel ridge (App. F.10) against brute-force numpy (float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import classical


# ------------------------------------------------------------------ numpy references (F.10.2)


def np_similarity(a, b, metric):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if metric == "euclidean":
        return -((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return a @ b.T


def np_knn(x_test, x_train, y_train, k, metric, weighting, n_classes):
    """Brute force: sort by (score desc, index asc); weights and vote as in F.10.2."""
    s = np_similarity(x_test, x_train, metric)
    idx = np.argsort(-s, axis=1, kind="stable")[:, :k]          # stable: lower index first on ties
    top = np.take_along_axis(s, idx, axis=1)
    if weighting == "uniform":
        w = np.ones_like(top)
    elif metric == "euclidean":
        w = 1.0 / (np.sqrt(np.maximum(-top, 0)) + 1e-5)
    else:
        e = np.exp(top - top.max(1, keepdims=True))
        w = e / e.sum(1, keepdims=True)
    scores = np.zeros((len(x_test), n_classes))
    for c in range(n_classes):
        scores[:, c] = (w * (y_train[idx] == c)).sum(1) / w.sum(1)
    return idx, top, scores, scores.argmax(1)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x_train = rng.normal(size=(157, 12)).astype(np.float32)
    y_train = rng.integers(0, 4, size=157)
    x_test = rng.normal(size=(23, 12)).astype(np.float32)
    return x_train, y_train, x_test


@pytest.mark.parametrize("metric", classical.KNN_METRICS)
def test_knn_search_equals_brute_force(data, metric):
    x_train, y_train, x_test = data
    s, idx = classical.knn_search(x_test, x_train, 25, metric=metric, test_chunk=10, train_chunk=32)
    ref_idx, ref_s, _, _ = np_knn(x_test, x_train, y_train, 25, metric, "uniform", 4)
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(s), ref_s, rtol=1e-4, atol=1e-3)


def test_knn_grid_equals_brute_force_for_every_setting(data):
    x_train, y_train, x_test = data
    preds = classical.knn_grid(x_test, x_train, y_train, n_classes=4, test_chunk=8, train_chunk=50)
    assert len(preds) == 2 * 2 * 5
    for (metric, weighting, k), p in preds.items():
        _, _, ref_scores, ref_pred = np_knn(x_test, x_train, y_train, k, metric, weighting, 4)
        np.testing.assert_array_equal(np.asarray(p), ref_pred, err_msg=f"{metric} {weighting} k={k}")
        if k not in (5, 25):   # the class scores themselves at the two ends of the k grid
            continue
        got = classical.knn_class_scores(x_test, x_train, y_train, k=k, metric=metric, weighting=weighting,
                                         n_classes=4)
        np.testing.assert_allclose(np.asarray(got), ref_scores, rtol=1e-4, atol=1e-5)


def test_knn_ties_go_to_the_lower_train_index_across_chunks():
    """Integer data with many exact duplicates: the neighbour sets, including the ones cut
    inside a group of equal scores, match the stable brute force."""
    rng = np.random.default_rng(1)
    base = rng.integers(-2, 3, size=(6, 5))
    x_train = base[rng.integers(0, 6, size=90)].astype(np.float32)   # 90 rows, 6 distinct
    y_train = rng.integers(0, 3, size=90)
    x_test = rng.integers(-2, 3, size=(17, 5)).astype(np.float32)
    for metric in classical.KNN_METRICS:
        for chunk in (7, 90):
            _, idx = classical.knn_search(x_test, x_train, 20, metric=metric, test_chunk=5, train_chunk=chunk)
            ref_idx, _, _, ref_pred = np_knn(x_test, x_train, y_train, 20, metric, "uniform", 3)
            np.testing.assert_array_equal(np.asarray(idx), ref_idx)
            pred = classical.knn_predict(x_test, x_train, y_train, k=20, metric=metric, train_chunk=chunk)
            np.testing.assert_array_equal(np.asarray(pred), ref_pred)


def test_knn_class_tie_goes_to_the_lowest_class():
    x_train = np.array([[0.0], [1.0], [-1.0], [10.0]], np.float32)
    y_train = np.array([2, 1, 1, 0])
    # k=2 neighbours of 0.1: rows 0 (class 2) and 1 (class 1): a tie, resolved to class 1
    pred = classical.knn_predict(np.array([[0.1]], np.float32), x_train, y_train, k=2, n_classes=3)
    assert int(pred[0]) == 1


def test_knn_chunked_equals_unchunked(data):
    x_train, y_train, x_test = data
    for metric in classical.KNN_METRICS:
        a = classical.knn_search(x_test, x_train, 10, metric=metric, test_chunk=3, train_chunk=11)
        b = classical.knn_search(x_test, x_train, 10, metric=metric, test_chunk=1000, train_chunk=10_000)
        np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
        np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6, atol=1e-5)


def test_knn_rejects_bad_arguments(data):
    x_train, y_train, x_test = data
    with pytest.raises(ValueError, match="metric"):
        classical.knn_search(x_test, x_train, 5, metric="cosine")
    with pytest.raises(ValueError, match="k must be"):
        classical.knn_search(x_test, x_train, 158)
    with pytest.raises(ValueError, match="weighting"):
        classical.knn_predict(x_test, x_train, y_train, k=5, weighting="rank")
    with pytest.raises(ValueError, match="chunk"):
        classical.knn_search(x_test, x_train, 5, train_chunk=0)


# ------------------------------------------------------------------ kernel ridge (F.10.1)


def np_rbf(a, b, gamma):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.exp(-gamma * ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    labels = (x[:, 0] + np.sin(2 * x[:, 1]) > 0).astype(int) + (x[:, 2] > 1).astype(int)
    y = np.eye(3)[labels].astype(np.float32)
    x_test = rng.normal(size=(31, 6)).astype(np.float32)
    return x, y, x_test


def test_median_heuristic_equals_numpy_median_of_the_same_pairs(regression):
    x, _, _ = regression
    d2 = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    iu = np.triu_indices(len(x), k=1)
    np.testing.assert_allclose(float(classical.median_heuristic(x)), np.median(d2[iu]), rtol=1e-5)
    # a subsample: the median over all distinct pairs of the drawn points
    key = jax.random.key(3)
    sub = np.asarray(jax.random.choice(key, len(x), (40,), replace=False))
    d2s = d2[np.ix_(sub, sub)]
    iu = np.triu_indices(40, k=1)
    np.testing.assert_allclose(float(classical.median_heuristic(x, n_subsample=40, key=key)), np.median(d2s[iu]),
                               rtol=1e-5)


@pytest.mark.parametrize("lam", [0.01, 0.3])
def test_exact_kernel_ridge_equals_numpy_solve(regression, lam):
    x, y, x_test = regression
    gamma = 0.5 / float(classical.median_heuristic(x))
    model = classical.fit_kernel_ridge(x, y, gamma=gamma, lam=lam, chunk=17)
    alpha = np.linalg.solve(np_rbf(x, x, gamma) + lam * np.eye(len(x)), y.astype(np.float64))
    ref = np_rbf(x_test, x, gamma) @ alpha
    got = classical.kernel_ridge_predict(model, x_test, test_chunk=8, train_chunk=25)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-3, atol=2e-4)
    np.testing.assert_array_equal(np.asarray(got).argmax(1), ref.argmax(1))


def test_kernel_prediction_chunked_equals_unchunked(regression):
    x, y, x_test = regression
    model = classical.fit_kernel_ridge(x, y, gamma=0.05, lam=0.1)
    a = classical.kernel_ridge_predict(model, x_test, test_chunk=4, train_chunk=13)
    b = classical.kernel_ridge_predict(model, x_test, test_chunk=1000, train_chunk=1000)
    # a different summation order: float32 rounding of Σ_i α_i k_i is ~ eps·Σ|α_i|
    tol = 4 * np.finfo(np.float32).eps * np.abs(np.asarray(model.alpha)).sum(0).max()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)
    # the exact solver's Gram matrix, built in row blocks, equals the one-block matrix
    g7 = classical._gram(jnp.asarray(x), jnp.float32(0.05), chunk=7)
    np.testing.assert_allclose(np.asarray(g7), np.asarray(classical.rbf_kernel(x, x, 0.05)), rtol=1e-6, atol=1e-7)


def test_nystrom_with_all_points_equals_exact_and_subset_matches_numpy(regression):
    x, y, x_test = regression
    gamma, lam = 0.05, 0.3
    exact = classical.kernel_ridge_predict(classical.fit_kernel_ridge(x, y, gamma=gamma, lam=lam), x_test)
    full = classical.fit_kernel_ridge(x, y, gamma=gamma, lam=lam, method="nystrom", n_centres=10_000, chunk=16,
                                      eig_rtol=1e-7)
    np.testing.assert_allclose(np.asarray(classical.kernel_ridge_predict(full, x_test)), np.asarray(exact),
                               atol=1e-3)
    # m < N: the subset-of-regressors solution (K_ZX K_XZ + λ K_ZZ)⁻¹ K_ZX Y, in numpy
    key = jax.random.key(4)
    sub = classical.fit_kernel_ridge(x, y, gamma=gamma, lam=lam, method="nystrom", n_centres=30, key=key, chunk=16)
    z = x[np.asarray(jax.random.choice(key, len(x), (30,), replace=False))]
    kxz, kzz = np_rbf(x, z, gamma), np_rbf(z, z, gamma)
    alpha = np.linalg.solve(kxz.T @ kxz + lam * kzz, kxz.T @ y.astype(np.float64))
    np.testing.assert_allclose(np.asarray(classical.kernel_ridge_predict(sub, x_test)), np_rbf(x_test, z, gamma) @ alpha,
                               atol=2e-3)


def test_kernel_ridge_rejects_bad_arguments(regression):
    x, y, _ = regression
    with pytest.raises(ValueError, match="max_exact"):
        classical.fit_kernel_ridge(x, y, gamma=0.1, lam=0.1, max_exact=100)
    with pytest.raises(ValueError, match="method"):
        classical.fit_kernel_ridge(x, y, gamma=0.1, lam=0.1, method="cg")
    with pytest.raises(ValueError, match="λ"):
        classical.fit_kernel_ridge(x, y, gamma=0.1, lam=0.0)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        classical.fit_kernel_ridge(x, y[:, 0], gamma=0.1, lam=0.1)


def test_flatten_normalize_uses_per_channel_train_statistics():
    rng = np.random.default_rng(5)
    imgs = rng.normal(loc=[1.0, -2.0, 3.0], scale=[1.0, 2.0, 0.5], size=(40, 4, 4, 3))
    flat, mean, std = classical.flatten_normalize(imgs)
    assert flat.shape == (40, 48)
    per_channel = flat.reshape(40, 4, 4, 3)
    np.testing.assert_allclose(per_channel.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(per_channel.std(axis=(0, 1, 2)), 1.0, atol=1e-5)
    test_flat, _, _ = classical.flatten_normalize(imgs[:5], mean, std)
    np.testing.assert_allclose(test_flat, flat[:5], atol=1e-6)
