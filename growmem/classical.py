"""The nonparametric baselines of App. F.10: k-nearest neighbours and RBF kernel ridge
regression (LS-SVM), exact and chunked in JAX.

Nothing here materialises a ``(N_test, N_train)`` matrix: test points are processed in
chunks of ``test_chunk`` and, for each, the training set is streamed in chunks of
``train_chunk`` (a ``lax.scan``) with a running top-k (kNN) or a running sum (kernel
prediction). The exact kernel ridge solver does build the ``(N, N)`` Gram matrix (it has
to); see :func:`fit_kernel_ridge` for its size limit and the Nyström option.

Distances use ``‖a‖² − 2⟨a, b⟩ + ‖b‖²`` with matrix products at ``Precision.HIGHEST``
(clipped at 0), so GPU/TPU runs do not fall back to TF32/bf16 products.

Inputs are flattened, channel-wise normalised vectors (F.10.1–2; :func:`flatten_normalize`).
"""
from __future__ import annotations

import functools
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ConfigError, NumericalError

__all__ = [
    "KNN_METRICS", "KNN_WEIGHTINGS", "KNN_K_GRID", "KRR_GAMMA_MULT_GRID", "KRR_LAMBDA_GRID", "MEDIAN_SUBSAMPLE",
    "flatten_normalize", "sq_distances", "similarity", "knn_search", "knn_class_scores", "knn_predict", "knn_grid",
    "rbf_kernel", "median_heuristic", "KernelRidge", "fit_kernel_ridge", "kernel_ridge_predict",
]

_HI = jax.lax.Precision.HIGHEST

#: F.10.2: similarity scores, label weightings and the grid of k swept for Fig. 2/Right
KNN_METRICS = ("euclidean", "dot")
KNN_WEIGHTINGS = ("uniform", "proportional")
KNN_K_GRID = (5, 10, 15, 20, 25)
#: F.10.1 / Table 14: bandwidth multipliers γ_mult and ridge regularisers λ
KRR_GAMMA_MULT_GRID = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0)
KRR_LAMBDA_GRID = (0.001, 0.01, 0.1, 0.3, 1.0)
#: F.10.1: the median of pairwise distances is taken over a subsample of 2048 images
MEDIAN_SUBSAMPLE = 2048
#: F.10.2: ``w_i = 1 / (‖x − x_i‖₂ + 10⁻⁵)`` for proportional euclidean weighting
INV_DIST_EPS = 1e-5
#: the exact kernel ridge solver refuses more training points than this by default
#: (an N×N float32 Gram matrix: 20k -> 1.6 GB; MNIST's 60k would be 14.4 GB)
MAX_EXACT = 20_000


# ----------------------------------------------------------------------------- inputs

def flatten_normalize(x, mean=None, std=None, *, channel_axis: Optional[int] = -1):
    """F.1.1 / F.10: subtract the per-channel mean, divide by the per-channel std, flatten.

    ``x: (N, ...)`` images (e.g. ``(N, 32, 32, 3)`` with ``channel_axis=-1``; MNIST's
    ``(N, 28, 28)`` with ``channel_axis=None``: one global mean/std). ``mean``/``std``
    default to the statistics of ``x`` itself (pass the training set's for the test set).
    -> ``(x_flat: (N, D) float32, mean, std)``.
    """
    x = np.asarray(x, np.float32)
    if channel_axis is None:
        axes = tuple(range(x.ndim))
    else:
        ca = channel_axis % x.ndim
        axes = tuple(a for a in range(x.ndim) if a != ca)
    if mean is None:
        mean = x.mean(axis=axes, keepdims=True)
    if std is None:
        std = x.std(axis=axes, keepdims=True)
    z = (x - mean) / np.maximum(std, 1e-12)
    return z.reshape(len(z), -1), mean, std


def sq_distances(a, b):
    """``(na, d), (nb, d) -> (na, nb)`` squared euclidean distances ``‖a_i − b_j‖²`` (≥ 0)."""
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    d2 = (jnp.sum(a * a, -1)[:, None] - 2.0 * jnp.matmul(a, b.T, precision=_HI) + jnp.sum(b * b, -1)[None, :])
    return jnp.maximum(d2, 0.0)


def similarity(a, b, metric: str = "euclidean"):
    """F.10.2 similarity score ``s(x, x_i)``: ``−‖x − x_i‖²`` (euclidean) or ``xᵀx_i``
    (unnormalised dot product). ``(na, d), (nb, d) -> (na, nb)``."""
    if metric == "euclidean":
        return -sq_distances(a, b)
    if metric == "dot":
        return jnp.matmul(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32).T, precision=_HI)
    raise ConfigError(f"metric must be one of {KNN_METRICS}, got {metric!r}")


def _check_chunks(*chunks):
    for c in chunks:
        if int(c) <= 0:
            raise ConfigError(f"chunk sizes must be positive, got {c}")


def _pad_rows(x, multiple: int):
    n = x.shape[0]
    pad = (-n) % multiple
    return jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)) if pad else x


def _test_chunks(x_test, test_chunk: int):
    """Yield ``(start, padded chunk)`` with a fixed chunk shape (one compilation)."""
    n = x_test.shape[0]
    c = min(int(test_chunk), max(n, 1))
    for i in range(0, n, c):
        yield i, _pad_rows(jnp.asarray(x_test[i:i + c], jnp.float32), c)


# ----------------------------------------------------------------------------- kNN

@functools.partial(jax.jit, static_argnames=("k", "metric", "chunk"))
def _topk_stream(q, train, n_train, *, k: int, metric: str, chunk: int):
    """Running top-k of ``similarity(q, train)`` over train chunks.

    Ties: ``lax.top_k`` puts the lower position first; the running top-k (earlier, i.e.
    lower, train indices) sits before each new chunk, whose rows are in index order, so
    among equal scores the lower train index wins throughout.
    """
    n_chunks = train.shape[0] // chunk
    b = q.shape[0]

    def body(carry, c):
        s_top, i_top = carry
        block = jax.lax.dynamic_slice_in_dim(train, c * chunk, chunk)
        idx = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        s = jnp.where(idx[None, :] < n_train, similarity(q, block, metric), -jnp.inf)
        s_all = jnp.concatenate([s_top, s], axis=1)
        i_all = jnp.concatenate([i_top, jnp.broadcast_to(idx, (b, chunk))], axis=1)
        s_new, pos = jax.lax.top_k(s_all, k)
        return (s_new, jnp.take_along_axis(i_all, pos, axis=1)), None

    init = (jnp.full((b, k), -jnp.inf, jnp.float32), jnp.full((b, k), -1, jnp.int32))
    (s_top, i_top), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
    return s_top, i_top


def knn_search(x_test, x_train, k: int, *, metric: str = "euclidean", test_chunk: int = 1024,
               train_chunk: int = 4096) -> Tuple[jax.Array, jax.Array]:
    """Exact top-k neighbours by the F.10.2 similarity, streamed over train chunks.

    ``x_test: (N_test, D)``, ``x_train: (N_train, D)`` -> ``(scores, indices)``, both
    ``(N_test, k)``, sorted by decreasing similarity; among equal (computed) scores the
    lower training index comes first. Memory: ``test_chunk × (train_chunk + k)`` scores.
    """
    if metric not in KNN_METRICS:
        raise ConfigError(f"metric must be one of {KNN_METRICS}, got {metric!r}")
    n_train = x_train.shape[0]
    if not 1 <= int(k) <= n_train:
        raise ConfigError(f"k must be in [1, N_train={n_train}], got {k}")
    _check_chunks(test_chunk, train_chunk)
    chunk = min(int(train_chunk), n_train)
    train = _pad_rows(jnp.asarray(x_train, jnp.float32), chunk)
    scores, idx = [], []
    for i, q in _test_chunks(x_test, test_chunk):
        s, j = _topk_stream(q, train, n_train, k=int(k), metric=metric, chunk=chunk)
        n = min(q.shape[0], x_test.shape[0] - i)
        scores.append(s[:n])
        idx.append(j[:n])
    return jnp.concatenate(scores), jnp.concatenate(idx)


def _neighbour_weights(scores, metric: str, weighting: str):
    """F.10.2 weights ``w_i`` of the top-k: uniform 1; proportional euclidean
    ``1/(‖x − x_i‖₂ + 10⁻⁵)``; proportional dot: softmax of ``xᵀx_i`` over the top-k."""
    if weighting == "uniform":
        return jnp.ones_like(scores)
    if weighting != "proportional":
        raise ConfigError(f"weighting must be one of {KNN_WEIGHTINGS}, got {weighting!r}")
    if metric == "euclidean":
        return 1.0 / (jnp.sqrt(jnp.maximum(-scores, 0.0)) + INV_DIST_EPS)
    return jax.nn.softmax(scores, axis=-1)


def _vote(scores, idx, y_train, k, metric, weighting, n_classes):
    s, j = scores[:, :k], idx[:, :k]
    w = _neighbour_weights(s, metric, weighting)
    onehot = jax.nn.one_hot(jnp.asarray(y_train)[j], n_classes, dtype=jnp.float32)   # (N, k, C)
    num = jnp.einsum("nk,nkc->nc", w, onehot)
    return num / jnp.sum(w, axis=-1, keepdims=True)


def _n_classes(y_train, n_classes):
    return int(np.max(np.asarray(y_train))) + 1 if n_classes is None else int(n_classes)


def knn_class_scores(x_test, x_train, y_train, *, k: int, metric: str = "euclidean",
                     weighting: str = "uniform", n_classes: Optional[int] = None, test_chunk: int = 1024,
                     train_chunk: int = 4096):
    """F.10.2 class scores ``Σ_{i∈N_k(x)} w_i 1[y_i = c] / Σ_{i∈N_k(x)} w_i``.

    ``y_train: (N_train,)`` integer labels -> ``(N_test, n_classes)``.
    """
    s, j = knn_search(x_test, x_train, k, metric=metric, test_chunk=test_chunk, train_chunk=train_chunk)
    return _vote(s, j, y_train, int(k), metric, weighting, _n_classes(y_train, n_classes))


def knn_predict(x_test, x_train, y_train, *, k: int, metric: str = "euclidean", weighting: str = "uniform",
                n_classes: Optional[int] = None, test_chunk: int = 1024, train_chunk: int = 4096):
    """``(N_test,)`` predicted labels: the argmax of :func:`knn_class_scores` (a tie between
    classes goes to the lowest class index)."""
    return jnp.argmax(knn_class_scores(x_test, x_train, y_train, k=k, metric=metric, weighting=weighting,
                                       n_classes=n_classes, test_chunk=test_chunk, train_chunk=train_chunk), -1)


def knn_grid(x_test, x_train, y_train, *, ks: Sequence[int] = KNN_K_GRID, metrics: Sequence[str] = KNN_METRICS,
             weightings: Sequence[str] = KNN_WEIGHTINGS, n_classes: Optional[int] = None, test_chunk: int = 1024,
             train_chunk: int = 4096) -> Dict[Tuple[str, str, int], jax.Array]:
    """The F.10.2 sweep: ``{(metric, weighting, k): (N_test,) predictions}`` over the grid
    (default: 2 metrics × 2 weightings × k ∈ {5, 10, 15, 20, 25}); one neighbour search per
    metric with the largest k (the top-k of a smaller k is its prefix)."""
    nc = _n_classes(y_train, n_classes)
    out = {}
    for metric in metrics:
        s, j = knn_search(x_test, x_train, max(ks), metric=metric, test_chunk=test_chunk, train_chunk=train_chunk)
        for weighting in weightings:
            for k in ks:
                out[(metric, weighting, int(k))] = jnp.argmax(_vote(s, j, y_train, int(k), metric, weighting, nc), -1)
    return out


# ----------------------------------------------------------------------------- kernel ridge

def rbf_kernel(a, b, gamma):
    """F.10.1: ``k(x, x') = exp(−γ ‖x − x'‖²)``; ``(na, d), (nb, d) -> (na, nb)``."""
    return jnp.exp(-gamma * sq_distances(a, b))


def median_heuristic(x, *, n_subsample: int = MEDIAN_SUBSAMPLE, key=None):
    """``median_{i<j} ‖x_i − x_j‖²`` over all distinct pairs of a subsample (F.10.1).

    The paper approximates the sample median "on all pairwise distances of a subsample of
    2048 images"; we take the ``n(n−1)/2`` pairs ``i < j`` (no self-pairs, each pair once)
    of ``n_subsample`` points drawn without replacement with ``key`` (all points, in order,
    when ``N ≤ n_subsample``). An even count gives the mean of the two middle values
    (numpy's convention). The bandwidth is then ``γ = γ_mult / median``. -> scalar.
    """
    x = jnp.asarray(x, jnp.float32)
    n = x.shape[0]
    if n < 2:
        raise ConfigError("the median heuristic needs at least 2 points")
    if n > n_subsample:
        key = jax.random.key(0) if key is None else key
        x = x[jax.random.choice(key, n, (int(n_subsample),), replace=False)]
    m = x.shape[0]
    iu, ju = np.triu_indices(m, k=1)
    return jnp.median(sq_distances(x, x)[iu, ju])


class KernelRidge(NamedTuple):
    """A fitted RBF kernel machine ``f(x) = Σ_i α_i k(x, c_i)``: ``centres (m, D)`` (all
    training points for the exact solver, the Nyström centres otherwise), ``alpha (m, C)``,
    ``gamma`` the RBF γ."""

    centres: jax.Array
    alpha: jax.Array
    gamma: float


@functools.partial(jax.jit, static_argnames=("chunk",))
def _gram(x, gamma, *, chunk: int):
    """``(N, N)`` RBF Gram matrix built in row blocks of ``chunk``."""
    n = x.shape[0]
    xp = _pad_rows(x, chunk)
    blocks = jax.lax.map(lambda r: rbf_kernel(r, x, gamma), xp.reshape(-1, chunk, x.shape[1]))
    return blocks.reshape(-1, n)[:n]


@jax.jit
def _exact_solve(K, y, lam):
    n = K.shape[0]
    A = K + lam * jnp.eye(n, dtype=K.dtype)
    return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(A, lower=True), y)


@functools.partial(jax.jit, static_argnames=("chunk",))
def _nystrom_normal_equations(x, y, centres, proj, gamma, n, *, chunk: int):
    """``Σ_chunks Φ_cᵀΦ_c`` and ``Σ_chunks Φ_cᵀ Y_c`` with ``Φ = k(X, Z) proj``."""
    m = proj.shape[1]

    def body(carry, c):
        g, r = carry
        xb = jax.lax.dynamic_slice_in_dim(x, c * chunk, chunk)
        yb = jax.lax.dynamic_slice_in_dim(y, c * chunk, chunk)
        valid = (c * chunk + jnp.arange(chunk)) < n
        phi = jnp.matmul(rbf_kernel(xb, centres, gamma), proj, precision=_HI) * valid[:, None]
        return (g + jnp.matmul(phi.T, phi, precision=_HI), r + jnp.matmul(phi.T, yb, precision=_HI)), None

    init = (jnp.zeros((m, m), jnp.float32), jnp.zeros((m, y.shape[1]), jnp.float32))
    (g, r), _ = jax.lax.scan(body, init, jnp.arange(x.shape[0] // chunk))
    return g, r


def fit_kernel_ridge(x, y, *, gamma: float, lam: float, method: str = "exact", n_centres: int = 4096,
                     key=None, chunk: int = 2048, max_exact: int = MAX_EXACT, eig_rtol: float = 1e-6) -> KernelRidge:
    """RBF kernel ridge regression / LS-SVM on targets ``y`` (F.10.1).

    ``x: (N, D)`` flattened normalised inputs, ``y: (N, C)`` targets (one-hot labels for
    classification: ``jax.nn.one_hot(labels, C)``), ``gamma`` the RBF γ (e.g.
    ``γ_mult / median_heuristic(x)``), ``lam`` the ridge λ.

    ``method="exact"``: ``α = (K + λ I_N)⁻¹ Y`` by a float32 Cholesky solve of the full
    ``(N, N)`` Gram matrix (built in row blocks of ``chunk``). That matrix is ``4 N²``
    bytes — 1.6 GB at N = 20k, 14.4 GB for MNIST's 60k — so N above ``max_exact``
    (default 20 000) is refused; raise it knowingly on a machine that holds it. In float32
    a very small λ (≲ 1e-3 relative to N) can make the Cholesky fail; this raises then.

    ``method="nystrom"``: the subset-of-regressors approximation with ``n_centres`` centres
    ``Z`` drawn from ``x`` without replacement (``key``): ``f(x) = k(x, Z) α`` with
    ``α = (K_ZX K_XZ + λ K_ZZ)⁻¹ K_ZX Y``, the minimiser of ``‖Y − K_XZ α‖² + λ αᵀK_ZZα``.
    It is computed stably via Nyström features ``Φ = K_XZ U S^{-1/2}`` (``K_ZZ = U S Uᵀ``,
    eigenvalues below ``eig_rtol · S_max`` dropped) and ``(ΦᵀΦ + λI)⁻¹ ΦᵀY``, streaming
    over ``chunk`` training rows (memory ``O(m² + chunk·m)``, never ``N × m``). With all
    points as centres it equals the exact solution. -> :class:`KernelRidge`.
    """
    x = jnp.asarray(x, jnp.float32)
    y = jnp.asarray(y, jnp.float32)
    if y.ndim != 2 or y.shape[0] != x.shape[0]:
        raise ConfigError(f"y must be (N, C) targets for x of shape {x.shape}, got {y.shape}")
    if not lam > 0:
        raise ConfigError(f"ridge λ must be > 0, got {lam}")
    _check_chunks(chunk)
    n = x.shape[0]
    chunk = min(int(chunk), n)
    if method == "exact":
        if n > max_exact:
            raise ConfigError(f"exact kernel ridge with N={n} needs a {n}x{n} Gram matrix "
                              f"({4 * n * n / 1e9:.1f} GB in float32), above max_exact={max_exact}; "
                              f"use method='nystrom' (n_centres) or raise max_exact")
        alpha = _exact_solve(_gram(x, jnp.float32(gamma), chunk=chunk), y, jnp.float32(lam))
        if not bool(jnp.all(jnp.isfinite(alpha))):
            raise NumericalError(f"Cholesky of K + λI failed in float32 (λ={lam}, N={n}); use a larger λ")
        return KernelRidge(x, alpha, float(gamma))
    if method != "nystrom":
        raise ConfigError(f"method must be 'exact' or 'nystrom', got {method!r}")
    m = min(int(n_centres), n)
    if m < 1:
        raise ConfigError(f"n_centres must be >= 1, got {n_centres}")
    if m < n:
        key = jax.random.key(0) if key is None else key
        centres = x[jax.random.choice(key, n, (m,), replace=False)]
    else:
        centres = x
    s, u = jnp.linalg.eigh(rbf_kernel(centres, centres, gamma))
    keep = s > eig_rtol * jnp.max(s)
    proj = u * jnp.where(keep, jax.lax.rsqrt(jnp.where(keep, s, 1.0)), 0.0)[None, :]      # U S^{-1/2}
    g, r = _nystrom_normal_equations(_pad_rows(x, chunk), _pad_rows(y, chunk), centres, proj,
                                     jnp.float32(gamma), n, chunk=chunk)
    beta = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(g + lam * jnp.eye(m), lower=True), r)
    return KernelRidge(centres, jnp.matmul(proj, beta, precision=_HI), float(gamma))


@functools.partial(jax.jit, static_argnames=("chunk",))
def _predict_stream(q, centres, alpha, gamma, *, chunk: int):
    def body(acc, c):
        zb = jax.lax.dynamic_slice_in_dim(centres, c * chunk, chunk)
        ab = jax.lax.dynamic_slice_in_dim(alpha, c * chunk, chunk)     # padded rows have α = 0
        return acc + jnp.matmul(rbf_kernel(q, zb, gamma), ab, precision=_HI), None

    acc, _ = jax.lax.scan(body, jnp.zeros((q.shape[0], alpha.shape[1]), jnp.float32),
                          jnp.arange(centres.shape[0] // chunk))
    return acc


def kernel_ridge_predict(model: KernelRidge, x_test, *, test_chunk: int = 1024, train_chunk: int = 4096):
    """``f(x) = Σ_i α_i k(x, c_i)`` for ``x_test: (N_test, D)`` -> ``(N_test, C)``, streamed
    over ``train_chunk`` centres per ``test_chunk`` test points (F.10.1; classify by argmax)."""
    _check_chunks(test_chunk, train_chunk)
    m = model.centres.shape[0]
    chunk = min(int(train_chunk), m)
    centres = _pad_rows(jnp.asarray(model.centres, jnp.float32), chunk)
    alpha = _pad_rows(jnp.asarray(model.alpha, jnp.float32), chunk)
    outs = []
    for i, q in _test_chunks(x_test, test_chunk):
        f = _predict_stream(q, centres, alpha, jnp.float32(model.gamma), chunk=chunk)
        outs.append(f[:min(q.shape[0], x_test.shape[0] - i)])
    return jnp.concatenate(outs)
