"""growmem.index: inverted-file retrieval against the exact scan of growmem.kernels."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import index as I
from growmem import kernels as K
from growmem.errors import ConfigError, GrowmemError

LOCAL = ("weighted_softmax", "rbf", "nadaraya_watson")


def _clustered(n=3000, d=16, clusters=24, seed=0, spread=3.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, d)) * spread
    k = (centres[rng.integers(0, clusters, n)] + rng.normal(size=(n, d))).astype(np.float32)
    q = (centres[rng.integers(0, clusters, 12)] + rng.normal(size=(12, d))).astype(np.float32)
    v = rng.normal(size=(n, 5)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    c = rng.uniform(0.2, 1.0, n).astype(np.float32)
    return q, k, v, w, c


def _index(kernel, k, n_lists=24, list_capacity=400, **kw):
    return I.build(kernel, k, n_lists=n_lists, list_capacity=list_capacity, key=jax.random.key(1), **kw)


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("shared", [False, True], ids=["per_query", "shared"])
@pytest.mark.parametrize("kernel", LOCAL)
def test_probing_every_list_is_the_exact_scan_values_and_gradients(kernel, shared):
    q, k, v, w, c = _clustered()
    ix = _index(kernel, k)
    T = 0.5

    def loss_ix(q, k, v, w, T):
        return jnp.sum(jnp.sin(I.retrieve(kernel, ix, q, k, v, w, nprobe=ix.n_lists, temperature=T, coeff=c,
                                          shared=shared)))

    def loss_exact(q, k, v, w, T):
        return jnp.sum(jnp.sin(K.retrieve(kernel, q, k, v, w, temperature=T, coeff=c)))

    args = tuple(map(jnp.asarray, (q, k, v, w))) + (jnp.float32(T),)
    assert loss_ix(*args) == pytest.approx(float(loss_exact(*args)), rel=1e-4)   # float32, another summation order
    g_ix = jax.grad(loss_ix, argnums=(0, 1, 2, 3, 4))(*args)
    g_ex = jax.grad(loss_exact, argnums=(0, 1, 2, 3, 4))(*args)
    for name, a, b in zip("qkvwT", g_ix, g_ex):
        if kernel != "weighted_softmax" and kernel != "nadaraya_watson" and name == "w":
            continue                                  # RBF reads no weights: both gradients are None / 0
        assert _rel(a, b) < 1e-3, name                 # float32 sums in another order


def test_every_row_is_indexed_once_in_a_list_or_the_overflow_list():
    q, k, v, w, c = _clustered(n=1000)
    ix = _index("weighted_softmax", k, list_capacity=30, overflow=1000)   # 24 x 30 = 720 < 1000 rows
    ids = np.concatenate([np.asarray(ix.lists).ravel(), np.asarray(ix.overflow)])
    ids = ids[ids >= 0]
    assert sorted(ids.tolist()) == list(range(1000))
    assert int(ix.n_overflow) == 1000 - int(np.asarray(ix.counts).sum()) > 0
    assert int(ix.unindexed) == 0
    # the overflow rows are read by every query, so the full probe is still the exact scan
    y = I.retrieve("weighted_softmax", ix, q, k, v, w, nprobe=ix.n_lists, temperature=0.5)
    assert _rel(y, K.retrieve("weighted_softmax", q, k, v, w, temperature=0.5)) < 1e-5


def test_without_a_list_capacity_every_row_lands_in_its_nearest_list():
    q, k, v, w, c = _clustered(n=3000)
    ix = I.build("weighted_softmax", k, n_lists=24, key=jax.random.key(1))
    d = ((k[:, None, :] - np.asarray(ix.centroids)[None]) ** 2).sum(-1)       # numpy, float64 distances
    nearest = d.argmin(1)
    lists = np.asarray(ix.lists)
    home = np.full(len(k), -1)
    for j in range(ix.n_lists):
        home[lists[j][lists[j] >= 0]] = j
    assert int(ix.n_overflow) == 0 and (home == nearest).mean() > 0.999    # ties in float32 aside
    assert ix.list_capacity >= int(np.asarray(ix.counts).max()) and ix.list_capacity % 8 == 0


def test_a_full_list_sends_its_row_to_the_next_nearest_list_with_room():
    centroids = jnp.asarray([[0.0, 0.0], [10.0, 0.0], [100.0, 0.0]])
    ix = I.empty(centroids, 2, overflow=0, kernel="rbf")
    ix = I.add(ix, jnp.asarray([[0.1, 0.0], [0.2, 0.0], [0.3, 0.0]]), jnp.asarray([7, 8, 9]), alternatives=2)
    assert np.asarray(ix.lists).tolist() == [[7, 8], [9, -1], [-1, -1]]


def test_rows_that_find_no_room_raise_and_leave_the_index_as_it_was():
    centroids = jnp.asarray([[0.0, 0.0], [10.0, 0.0]])
    ix = I.empty(centroids, 1, overflow=1, kernel="rbf")
    ix = I.add(ix, jnp.asarray([[0.0, 0.0]]), jnp.asarray([0]))
    with pytest.raises(I.IndexFullError, match="found no room.*more lists, a larger list_capacity or overflow"):
        I.add(ix, jnp.asarray([[0.0, 0.1], [0.0, 0.2], [0.0, 0.3]]), jnp.asarray([1, 2, 3]))
    assert np.asarray(ix.lists).tolist() == [[0], [-1]] and int(ix.n_overflow) == 0
    assert issubclass(I.IndexFullError, GrowmemError)


def test_masked_rows_are_not_indexed():
    centroids = jnp.asarray([[0.0, 0.0], [10.0, 0.0]])
    ix = I.empty(centroids, 4, kernel="rbf")
    ix = I.add(ix, jnp.asarray([[0.0, 0.0], [10.0, 0.0], [np.nan, 0.0]]), jnp.asarray([0, 1, 2]),
               mask=jnp.asarray([True, True, False]))
    assert np.asarray(ix.counts).tolist() == [1, 1] and int(ix.size) == 2


@pytest.mark.parametrize("kernel", LOCAL)
def test_a_few_lists_of_clustered_rows_recall_the_nearest_rows_and_the_result(kernel):
    q, k, v, w, c = _clustered(n=4000, spread=4.0)
    ix = _index(kernel, k, list_capacity=600)
    exact = K.retrieve(kernel, q, k, v, w, temperature=0.3)
    one = I.retrieve(kernel, ix, q, k, v, w, nprobe=1, temperature=0.3)
    four = I.retrieve(kernel, ix, q, k, v, w, nprobe=4, temperature=0.3)
    assert float(I.recall(ix, q, k, nprobe=4, top=10).mean()) >= 0.95
    assert _rel(four, exact) < 0.01
    assert _rel(four, exact) <= _rel(one, exact)


def test_a_shared_probe_reads_every_list_its_queries_would_read_alone_each_once():
    q, k, v, w, c = _clustered(n=2000)
    ix = _index("weighted_softmax", k)
    own = np.asarray(I.candidates(ix, q, 2))
    union = np.asarray(I.shared_candidates(ix, q, 2))
    valid = union[union >= 0]
    assert len(valid) == len(set(valid.tolist()))                            # no row twice
    assert set(own[own >= 0].tolist()) == set(valid.tolist())
    exact = K.retrieve("weighted_softmax", q, k, v, w, temperature=0.3)
    alone = I.retrieve("weighted_softmax", ix, q, k, v, w, nprobe=2, temperature=0.3)
    shared = I.retrieve("weighted_softmax", ix, q, k, v, w, nprobe=2, temperature=0.3, shared=True)
    # each query's rows in the shared read include its own: on clustered rows no worse than alone
    assert _rel(shared, exact) <= _rel(alone, exact) + 1e-6


def test_the_partial_merges_with_the_exact_partial_of_rows_not_yet_indexed():
    q, k, v, w, c = _clustered(n=2000)
    ix = _index("weighted_softmax", k[:1500])
    cold = I.reduce("weighted_softmax", ix, q, k, v, w, nprobe=ix.n_lists, temperature=0.4)
    hot = K.reduce("weighted_softmax", q, k[1500:], v[1500:], w[1500:], temperature=0.4)
    y = K.WEIGHTED_SOFTMAX.finish(K.merge(cold, hot))
    assert _rel(y, K.retrieve("weighted_softmax", q, k, v, w, temperature=0.4)) < 1e-5


def test_retrieval_runs_under_jit_with_bfloat16_rows():
    q, k, v, w, c = _clustered(n=1000)
    ix = _index("weighted_softmax", k)
    kb, vb = jnp.asarray(k, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16)
    f = jax.jit(lambda ix, q: I.retrieve("weighted_softmax", ix, q, kb, vb, w, nprobe=ix.n_lists, temperature=0.5))
    y = f(ix, jnp.asarray(q))
    assert y.dtype == jnp.float32
    # the rows are widened to the queries' dtype, as the exact scan widens each chunk
    assert _rel(y, K.retrieve("weighted_softmax", q, kb, vb, w, temperature=0.5)) < 1e-5


def test_an_empty_probe_gives_zero_like_an_empty_memory():
    ix = I.empty(jnp.zeros((2, 3)), 4, kernel="weighted_softmax")
    k, v, w = jnp.zeros((8, 3)), jnp.ones((8, 2)), jnp.ones((8,))
    y = I.retrieve("weighted_softmax", ix, jnp.ones((2, 3)), k, v, w, nprobe=2, temperature=1.0)
    assert np.asarray(y).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_kmeanspp_seeds_rows_spread_over_the_clusters_and_evens_out_the_lists():
    rng = np.random.default_rng(4)
    clusters, d = 48, 16
    centres = rng.normal(size=(clusters, d)) * 6.0                 # far apart: a row's cluster is its nearest centre
    which = rng.integers(0, clusters, 4000)
    x = (centres[which] + rng.normal(size=(4000, d))).astype(np.float32)
    seeds = np.asarray(I._kmeanspp(jnp.asarray(x), jax.random.key(3), 40))
    at = [int(np.flatnonzero((x == s).all(axis=1))[0]) for s in seeds]    # each seed is one of the rows
    assert len(set(at)) == 40
    covered = len(set(which[at].tolist()))
    rand = np.asarray(jax.random.choice(jax.random.key(3), 4000, (40,), replace=False))
    assert covered >= 38 and covered > len(set(which[rand].tolist()))   # uniform draws repeat clusters
    caps = {init: I.list_capacity_for(x, I.train_centroids(x, 40, key=jax.random.key(3), init=init), headroom=1.0)
            for init in I.INITS}
    assert caps["kmeans++"] < caps["random"], caps


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v, w, ix: I.build("linear", k, n_lists=4, list_capacity=10, key=jax.random.key(0)),
     "linear kernel is not local"),
    (lambda q, k, v, w, ix: I.retrieve("weighted_softmax", ix, q, k, v, w, nprobe=0), r"nprobe must be .* \[1, 24\]"),
    (lambda q, k, v, w, ix: I.retrieve("weighted_softmax", ix, q, k, v, w, nprobe=25), r"nprobe must be"),
    (lambda q, k, v, w, ix: I.retrieve("rbf", ix, q, k, v, w, nprobe=2), "build it with kernel='rbf'"),
    (lambda q, k, v, w, ix: I.build("rbf", k[:3], n_lists=4, list_capacity=10, key=jax.random.key(0)),
     "at least n_lists = 4 rows"),
    (lambda q, k, v, w, ix: I.train_centroids(np.full((10, 2), np.nan), 2, key=jax.random.key(0)), "non-finite"),
    (lambda q, k, v, w, ix: I.train_centroids(k, 2, key=jax.random.key(0), init="forgy"), "unknown k-means init"),
    (lambda q, k, v, w, ix: I.add(ix, k[:2, :3], jnp.arange(2)), r"keys must be \(n, 16\)"),
    (lambda q, k, v, w, ix: I.add(ix, k[:2], jnp.arange(3)), r"ids must be \(2,\)"),
    (lambda q, k, v, w, ix: I.add(ix, np.where(np.arange(16) == 3, np.inf, k[:1]), jnp.arange(1)), "non-finite"),
    (lambda q, k, v, w, ix: I.empty(jnp.zeros((2, 3)), 0), "list_capacity must be an integer >= 1"),
])
def test_bad_input_is_one_clear_error(call, match):
    q, k, v, w, c = _clustered(n=500)
    ix = _index("weighted_softmax", k)
    with pytest.raises(ConfigError, match=match):
        call(q, k, v, w, ix)


def test_the_benchmark_smoke_preset_writes_its_json_and_plot(tmp_path):
    import json

    from conftest import benchmark
    summary = benchmark("indexed").main(["--preset", "smoke", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "indexed.json").read_text())
    assert doc["summary"]["n"] == 6_000 and (tmp_path / "indexed.png").read_bytes()[:4] == b"\x89PNG"
    for r in doc["results"]:
        ix = r["indexed"]["per_query"]
        # more lists probed: every exact top row found so far stays found, and the error does not grow
        assert ix["2"]["recall_at_10"] <= ix["8"]["recall_at_10"]
        for t in ("0.05", "0.5"):
            assert ix["8"]["errors_by_temperature"][t]["rel_error_y"] <= ix["2"]["errors_by_temperature"][t]["rel_error_y"]
        # the sharper kernel puts more of its weight on the nearest lists
        assert ix["8"]["errors_by_temperature"]["0.05"]["rel_error_y"] < ix["8"]["errors_by_temperature"]["0.5"]["rel_error_y"]
        assert ix["8"]["scores_per_batch"] == 4 * (8 * r["list_capacity"] + r["overflow"])        # B = 4
        sh = r["indexed"]["shared"]
        assert sh["8"]["scores_per_batch"] == 4 * (4 * 8 * r["list_capacity"] + r["overflow"])
        assert sh["8"]["errors_by_temperature"]["0.05"]["rel_error_y"] <= ix["8"]["errors_by_temperature"]["0.05"]["rel_error_y"] + 1e-6
    assert set(summary["by_mode_and_nprobe"]) == {"per_query", "shared"}


def test_the_training_part_trains_through_the_index_beside_the_exact_run(tmp_path, monkeypatch):
    """``--part training``: probing every list, the indexed teacher-student run is the exact one (the same
    samples, seed and model), so the benchmark's two runs agree where they overlap; its summary is read off
    the runs' curves."""
    import json

    from conftest import benchmark
    mod = benchmark("indexed")
    cfg = mod.TRAINING["smoke"]
    monkeypatch.setitem(mod.TRAINING, "smoke", dict(cfg, nprobe=cfg["n_lists"]))
    summary = mod.main(["--part", "training", "--preset", "smoke", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "indexed_training.json").read_text())
    assert (tmp_path / "indexed_training.png").read_bytes()[:4] == b"\x89PNG"
    ix, ex = (next(r for r in doc["runs"] if r["mode"] == m) for m in ("indexed", "exact"))
    assert [n for n, _ in ix["curve"]] == [0, 1_024, 2_048, 4_096] and [n for n, _ in ex["curve"]] == [0, 1_024, 2_048]
    assert ix["rows"] >= cfg["rows"] > ex["rows"] >= cfg["exact_rows"]       # a row a sample, and the first B rows
    assert all(b[1] > a[1] for a, b in zip(ix["wall"], ix["wall"][1:]))
    s = summary["by_seed"]["0"]
    assert s["compared_at_rows"] == 2_048 and s["indexed_rows"] == ix["rows"]
    at = {"indexed": dict(map(tuple, ix["curve"]))[2_048], "exact": dict(map(tuple, ex["curve"]))[2_048]}
    assert s["relative_test_loss_at_compared"] == at and 0 < at["exact"] < 1
    np.testing.assert_allclose(at["indexed"], at["exact"], rtol=1e-2)
    assert s["weight_read"] == ix["weight_read"] and abs(s["weight_read"] - 1) < 1e-4   # every list probed


@pytest.mark.parametrize("kernel", ["weighted_softmax", "rbf"])
def test_weight_read_is_the_probed_share_of_the_exact_weight(kernel):
    """Against a float64 sum over the rows each query's lists hold (an independent computation), 1 when every
    list is probed, and smaller for the broader kernel (a larger T) on the same probe."""
    q, k, v, w, _ = _clustered(n=900)
    ix = _index(kernel, k, n_lists=12, list_capacity=300)
    T = 20.0
    got = np.asarray(I.weight_read(kernel, ix, q, k, w, nprobe=2, temperature=T, chunk=256))
    kern = K.get(kernel)
    a = kern.scale / (T * math.sqrt(k.shape[1]))                     # alpha = scale / (T sqrt(d))
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    s = a * q64 @ k64.T if kernel == "weighted_softmax" else -a * ((q64[:, None, :] - k64[None]) ** 2).sum(-1)
    wt = (w[None].astype(np.float64) if kern.normalised else 1.0) * np.exp(s - s.max(1, keepdims=True))  # RBF: no w
    cand = np.asarray(I.candidates(ix, q, 2))
    want = np.array([wt[i, c[c >= 0]].sum() / wt[i].sum() for i, c in enumerate(cand)])
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert 0.05 < want.min() and want.max() < 0.999                  # the probe misses some of the weight
    np.testing.assert_allclose(np.asarray(I.weight_read(kernel, ix, q, k, w, nprobe=12, temperature=T)), 1.0,
                               rtol=1e-4)
    broad = np.asarray(I.weight_read(kernel, ix, q, k, w, nprobe=2, temperature=50 * T))
    assert broad.mean() < got.mean()
