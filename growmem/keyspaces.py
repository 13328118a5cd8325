"""Key spaces: where the keys of a target memory (:mod:`growmem.nadaraya`) live.

A key space turns inputs ``x:(B, D)`` into queries and keys. It has one or more *regimes*; a
row belongs to one regime and is compared only with queries projected into that regime, and a
query's distance to a row of regime ``j`` is

    δ_j(x, row) = r_j(x) + ‖z_j(x) − k_row‖²                                       (KS-1)

with ``z_j`` the regime's key map and ``r_j ≥ 0`` a per-query offset (0 for a single fixed
regime; the part of ``x`` regime ``j`` does not represent for :class:`Subspaces`). The memory's
Gaussian Nadaraya–Watson kernel over all regimes then needs only each regime's partial sums and
the offset (``growmem.nadaraya``).

* :class:`Identity` — the input itself, optionally L2-normalised (one regime);
* :class:`DCT` — a fixed, data-independent map for images: intensities relative to the image's
  darkest pixel, moment deskew, the lowest ``n × n`` 2-D DCT-II coefficients, L2 normalisation
  (one regime; nothing is fitted, so nothing drifts);
* :class:`Subspaces` — a mixture of PCA subspaces created on novelty: while no regime explains
  an input well (relative residual ``r_j(x)/‖x − μ_j‖² > ρ`` for every ``j``), inputs are held in
  a buffer; when it has ``n_fit`` of them a new regime ``(μ, U)`` (PCA, ``dim`` components) is
  fitted to it and the buffer is stored through it. ``z_j(x) = U_j (x − μ_j)``,
  ``r_j(x) = ‖x − μ_j‖² − ‖z_j(x)‖²``, so δ_j is the squared pixel distance from ``x`` to the
  row's reconstruction. Regimes are chosen by the inputs alone, never by task labels.

Every key space reports the bytes of its own state (:meth:`KeySpace.nbytes`) so that memory
budgets count it, and saves / restores it as a dict of numpy arrays.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ConfigError


# ----------------------------------------------------------------------------- image transforms

def _deskew_one(img):
    """One ``(h, w)`` image sheared so that its principal axis is vertical (moment deskew)."""
    h, w = img.shape
    ii, jj = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
    s = jnp.sum(img) + 1e-9
    ci = jnp.sum(ii * img) / s
    cj = jnp.sum(jj * img) / s
    vii = jnp.sum((ii - ci) ** 2 * img) / s
    vij = jnp.sum((ii - ci) * (jj - cj) * img) / s
    alpha = jnp.where(vii > 0, vij / jnp.where(vii > 0, vii, 1.0), 0.0)
    oi, oj = (h - 1) / 2.0, (w - 1) / 2.0
    # output (i, j) reads input (i + ci − oi, α i + j + cj − α oi − oj): the affine map [[1, 0], [α, 1]]
    src_i = ii + ci - oi
    src_j = alpha * ii + jj + cj - alpha * oi - oj
    return jax.scipy.ndimage.map_coordinates(img, [src_i, src_j], order=1, mode="constant", cval=0.0)


@jax.jit
def deskew(images):
    """Moment deskew of ``images:(B, h, w)`` (bilinear, zeros outside): each image is sheared
    about its centre of mass so that its second moment ``v_ij`` vanishes and recentred."""
    return jax.vmap(_deskew_one)(jnp.asarray(images, jnp.float32))


def dct_matrix(n: int, k: int) -> np.ndarray:
    """The first ``k`` rows of the orthonormal DCT-II matrix of size ``n`` (``(k, n)`` float32)."""
    i = np.arange(n)
    c = np.cos(np.pi * (i[None, :] + 0.5) * np.arange(k)[:, None] / n) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c.astype(np.float32)


def _l2_normalise(z, eps: float = 1e-8):
    return z / (jnp.linalg.norm(z, axis=1, keepdims=True) + eps)


# ----------------------------------------------------------------------------- key spaces

class KeySpace:
    """The interface (module docstring). Subclasses set ``name``, ``key_dim`` and ``input_dim``
    (the features of an input ``x``; None: any)."""

    name = "keyspace"
    key_dim: int
    input_dim: Optional[int] = None
    n_regimes: int = 1

    def prepare(self, x) -> jax.Array:
        """``x:(B, D)`` float32 -> the vectors the regimes project (jittable)."""
        return jnp.asarray(x, jnp.float32)

    def params(self) -> tuple:
        """The regimes' parameters as a pytree of arrays (an argument of jitted functions)."""
        return ()

    @staticmethod
    def project(params, u) -> Tuple[List[jax.Array], jax.Array]:
        """``([z_j(u):(B, key_dim)] per regime, r:(B, n_regimes))`` (jittable; (KS-1))."""
        raise NotImplementedError

    def route(self, u: np.ndarray, y: np.ndarray) -> List[Tuple[int, np.ndarray, np.ndarray]]:
        """Where to store prepared inputs ``u`` with targets ``y``: ``[(regime, u_j, y_j)]`` — possibly
        none yet (held in a buffer) or more than given (a buffer released by a new regime)."""
        return [(0, u, y)] if len(u) else []

    def nbytes(self) -> int:
        """Bytes of the key space's own state (parameters, buffers)."""
        return 0

    def reserved_bytes(self) -> int:
        """Bytes the key space can need beyond its present state before any row is stored (a
        budget smaller than this cannot be honoured)."""
        return self.nbytes()

    def state(self) -> Dict[str, np.ndarray]:
        return {}

    def load_state(self, state: Dict[str, np.ndarray]) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name, "key_dim": self.key_dim, "regimes": self.n_regimes}


class _Single(KeySpace):
    """One fixed regime: ``z(u) = u`` (after :meth:`prepare`), no offset."""

    @staticmethod
    def project(params, u):
        return [u], jnp.zeros((u.shape[0], 1), u.dtype)


class Identity(_Single):
    """Keys are the inputs (``normalise``: L2-normalised, so the kernel is a cosine kernel)."""

    name = "identity"

    def __init__(self, d: int, normalise: bool = True):
        if d < 1:
            raise ConfigError(f"key dimension must be >= 1, got {d}")
        self.key_dim = self.input_dim = int(d)
        self.normalise = bool(normalise)

    def prepare(self, x):
        x = jnp.asarray(x, jnp.float32)
        return _l2_normalise(x) if self.normalise else x

    def describe(self):
        return {**super().describe(), "normalise": self.normalise}


class DCT(_Single):
    """Fixed image keys (module docstring): ``side × side`` images (row-major, ``side²``
    features), optional moment deskew, the lowest ``n × n`` DCT-II coefficients, L2-normalised."""

    name = "dct"

    def __init__(self, side: int = 28, n: int = 10, deskew: bool = True):
        if not 1 <= n <= side:
            raise ConfigError(f"DCT keys need 1 <= n <= side, got n={n}, side={side}")
        self.side, self.n, self.deskew = int(side), int(n), bool(deskew)
        self.key_dim = self.n * self.n
        self.input_dim = self.side * self.side
        self._c = jnp.asarray(dct_matrix(self.side, self.n))

    def prepare(self, x):
        x = jnp.asarray(x, jnp.float32)
        if x.ndim != 2 or x.shape[1] != self.side * self.side:
            raise ConfigError(f"DCT keys take images of {self.side}x{self.side} = {self.side ** 2} features, got "
                              f"inputs of shape {tuple(x.shape)}")
        img = x.reshape(-1, self.side, self.side)
        # intensities relative to each image's darkest pixel: the keys are the same for any
        # affine pixel normalisation a·x + b (a > 0), e.g. Avalanche's Normalize((0.1307,), (0.3081,))
        img = img - jnp.min(img, axis=(1, 2), keepdims=True)
        if self.deskew:
            img = deskew(img)
        z = jnp.einsum("ai,bij,cj->bac", self._c, img, self._c).reshape(x.shape[0], -1)   # C X Cᵀ
        return _l2_normalise(z)

    def nbytes(self) -> int:
        return int(self._c.size) * 4                # the separable DCT factor (float32)

    def describe(self):
        return {**super().describe(), "side": self.side, "n": self.n, "deskew": self.deskew}


class Subspaces(KeySpace):
    """A mixture of PCA subspaces created on novelty (module docstring).

    ``dim``: components per regime; ``n_fit``: inputs buffered to fit a new regime; ``rho``:
    the relative residual above which an input is novel; ``param_dtype``: how ``μ, U`` are
    stored (``float16`` halves their bytes; they are widened to float32 to compute);
    ``buffer_dtype``: how buffered inputs are held until a regime is fitted; ``max_regimes``:
    a cap (a novel input past it goes to the best existing regime).
    """

    name = "subspaces"

    def __init__(self, d: int, dim: int = 30, n_fit: int = 1000, rho: float = 0.6, *,
                 param_dtype: str = "float16", buffer_dtype: str = "float16", max_regimes: int = 64):
        if not 1 <= dim <= d:
            raise ConfigError(f"subspace dimension must be in [1, {d}], got {dim}")
        if n_fit < dim:
            raise ConfigError(f"n_fit (inputs to fit a regime) must be >= dim = {dim}, got {n_fit}")
        if not 0.0 < rho < 1.0:
            raise ConfigError(f"rho (relative residual of a novel input) must be in (0, 1), got {rho}")
        self.d, self.key_dim, self.n_fit, self.rho = int(d), int(dim), int(n_fit), float(rho)
        self.input_dim = self.d
        self.param_dtype, self.buffer_dtype = np.dtype(param_dtype), np.dtype(buffer_dtype)
        self.max_regimes = int(max_regimes)
        self.mu: List[np.ndarray] = []
        self.U: List[np.ndarray] = []
        self.buf_x = np.zeros((0, self.d), self.buffer_dtype)
        self.buf_y: Optional[np.ndarray] = None
        self._params = ()

    @property
    def n_regimes(self) -> int:
        return len(self.mu)

    def params(self):
        return self._params

    def _refresh(self):
        self._params = tuple((jnp.asarray(m.astype(np.float32)), jnp.asarray(u.astype(np.float32)))
                             for m, u in zip(self.mu, self.U))

    @staticmethod
    def project(params, u):
        zs, rs = [], []
        for mu, U in params:
            c = u - mu
            z = c @ U.T
            zs.append(z)
            rs.append(jnp.maximum(jnp.sum(c * c, axis=1) - jnp.sum(z * z, axis=1), 0.0))
        return zs, jnp.stack(rs, axis=1) if rs else jnp.zeros((u.shape[0], 0), u.dtype)

    def _relative_residual(self, u: np.ndarray) -> np.ndarray:
        """``min_j r_j(u) / ‖u − μ_j‖²`` per input (1 with no regime)."""
        if not self.mu:
            return np.ones(len(u), np.float32)
        _, r = _project_jit(self._params, jnp.asarray(u))
        norms = np.stack([np.sum((u - m.astype(np.float32)) ** 2, axis=1) for m in self.mu], axis=1)
        return np.min(np.asarray(r) / np.maximum(norms, 1e-12), axis=1)

    def _fit(self, x: np.ndarray) -> None:
        x = x.astype(np.float32)
        mu = x.mean(axis=0)
        _, _, vt = np.linalg.svd(x - mu, full_matrices=False)
        self.mu.append(mu.astype(self.param_dtype))
        self.U.append(vt[:self.key_dim].astype(self.param_dtype))
        self._refresh()

    def route(self, u, y):
        u = np.asarray(u, np.float32)
        y = np.asarray(y)
        out = []
        if len(self.mu) < self.max_regimes:
            ratio = self._relative_residual(u)
            novel = ratio > self.rho
            if self.mu and not len(self.buf_x) and ratio.mean() <= self.rho:
                novel[:] = False                    # a few odd inputs in a known regime are not a new one
        else:
            novel = np.zeros(len(u), bool)
        if novel.any():
            self.buf_x = np.concatenate([self.buf_x, u[novel].astype(self.buffer_dtype)])
            yb = y[novel]
            self.buf_y = yb if self.buf_y is None else np.concatenate([self.buf_y, yb])
            if len(self.buf_x) >= self.n_fit:
                bx, by = self.buf_x.astype(np.float32), self.buf_y
                self.buf_x, self.buf_y = self.buf_x[:0], None
                self._fit(bx)
                out.extend(self._assign(bx, by))
            u, y = u[~novel], y[~novel]
        if len(u) and self.mu:
            out.extend(self._assign(u, y))
        return out

    def _assign(self, u, y):
        _, r = _project_jit(self._params, jnp.asarray(u))
        best = np.argmin(np.asarray(r), axis=1)
        return [(int(j), u[best == j], y[best == j]) for j in np.unique(best)]

    def nbytes(self) -> int:
        p = sum(m.nbytes + U.nbytes for m, U in zip(self.mu, self.U))
        b = self.buf_x.nbytes + (0 if self.buf_y is None else self.buf_y.nbytes)
        return int(p + b)

    def reserved_bytes(self) -> int:
        """A full buffer (inputs, and targets counted at up to 64 B each) plus the regime fitted from it."""
        return int(self.n_fit * (self.d * self.buffer_dtype.itemsize + 64)
                   + (self.key_dim + 1) * self.d * self.param_dtype.itemsize)

    def state(self):
        st = {"buf_x": self.buf_x, "n_regimes": np.asarray(len(self.mu))}
        if self.buf_y is not None:
            st["buf_y"] = self.buf_y
        for j, (m, U) in enumerate(zip(self.mu, self.U)):
            st[f"mu_{j}"], st[f"U_{j}"] = m, U
        return st

    def load_state(self, state):
        n = int(state["n_regimes"])
        self.mu = [np.asarray(state[f"mu_{j}"], self.param_dtype) for j in range(n)]
        self.U = [np.asarray(state[f"U_{j}"], self.param_dtype) for j in range(n)]
        self.buf_x = np.asarray(state["buf_x"], self.buffer_dtype).reshape(-1, self.d)
        self.buf_y = np.asarray(state["buf_y"]) if "buf_y" in state else None
        self._refresh()

    def describe(self):
        return {**super().describe(), "dim": self.key_dim, "n_fit": self.n_fit, "rho": self.rho,
                "param_dtype": self.param_dtype.name, "buffered": int(len(self.buf_x))}


_project_jit = jax.jit(Subspaces.project)


#: key spaces by name (the ``[keys] kind`` of a target preset)
class Projection(_Single):
    """Fixed random keys: ``z = normalise(x − min(x)) Rᵀ`` with ``R`` a ``dim × d`` Gaussian matrix drawn from
    ``seed`` (nothing fitted, nothing drifts). Distances between inputs are kept up to a small distortion
    (Johnson–Lindenstrauss), whatever the order of their features — so the keys suit permuted or rotated
    images, where the DCT's spatial frequencies do not. Like :class:`DCT`, the keys do not depend on an affine
    pixel normalisation ``a·x + b`` (``a > 0``)."""

    name = "projection"

    def __init__(self, d: int, dim: int = 100, seed: int = 0):
        if d < 1 or not 1 <= dim:
            raise ConfigError(f"a projection needs d >= 1 and dim >= 1, got d={d}, dim={dim}")
        self.input_dim, self.key_dim, self.seed = int(d), int(dim), int(seed)
        r = np.random.default_rng(np.random.SeedSequence([int(seed), 0x70726F6A])).standard_normal((dim, d))
        self._r = jnp.asarray(r / np.sqrt(dim), jnp.float32)

    def prepare(self, x):
        x = jnp.asarray(x, jnp.float32)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ConfigError(f"projection keys take inputs of {self.input_dim} features, got shape {tuple(x.shape)}")
        x = x - jnp.min(x, axis=1, keepdims=True)
        return _l2_normalise(_l2_normalise(x) @ self._r.T)

    def nbytes(self) -> int:
        return 0          # R is a function of the seed: regenerated, never stored

    def describe(self):
        return {**super().describe(), "dim": self.key_dim, "seed": self.seed}


KEY_SPACES = {"identity": Identity, "dct": DCT, "subspaces": Subspaces, "projection": Projection}


def make(kind: str, d: int, **kw) -> KeySpace:
    """A key space by name for inputs of ``d`` features."""
    if kind not in KEY_SPACES:
        raise ConfigError(f"unknown key space {kind!r}; choose one of {sorted(KEY_SPACES)}")
    if kind == "dct":
        side = int(round(math.sqrt(d)))
        if side * side != d:
            raise ConfigError(f"DCT keys take square images; inputs of {d} features are not side x side")
        return DCT(side=side, **kw)
    return KEY_SPACES[kind](d, **kw)
