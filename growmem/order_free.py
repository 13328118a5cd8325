"""Order-free baselines over the keys of a target memory: k nearest neighbours, nearest class mean and
streaming linear discriminant analysis.

Each model answers from statistics that do not depend on the order of the samples, so a
class-incremental stream and the shuffled one leave the same model; they are the simple baselines a
:class:`growmem.nadaraya.TargetMemory` is compared with in the continual benchmark, on the same keys
(a fixed key space of :mod:`growmem.keyspaces`: ``DCT`` image keys, or ``Identity(d, normalise=False)``
for the raw inputs). Every class is a learner (:mod:`growmem.learner`), a drop-in for a target memory
as a per-task model: the same ``observe`` / ``predict`` / ``nbytes`` / ``state`` / ``load_state`` /
``rows`` and ``describe`` / ``rows_in_use`` / ``counts``.

* :class:`KNN` stores every sample's key (at ``row_dtype``) and its class, and scores a query by the
  votes of its ``k`` nearest keys (``euclidean``: ``‖q‖² + ‖k‖² − 2 q·k``; ``cosine``: ``1 − cos``),
  computed a block of stored rows at a time (never a ``(B, N, d)`` tensor) with a running
  ``argpartition`` top-k. Votes are whole numbers; a class that has votes also gets
  ``1 / (2 + δ)``, ``δ`` the distance of its nearest neighbour among the ``k`` (at most one half), so
  equal votes are broken by distance (then, within float32 resolution, by the lower class id). Under
  ``budget_bytes`` it keeps at most the rows the budget holds, chosen by a class-balanced reservoir
  (:mod:`growmem.reservoir`: each class's rows a uniform sample of that class's stream).
* :class:`NCM` holds every class's mean key and count; a query scores minus its Euclidean distance to
  each class mean.
* :class:`SLDA` holds the class means, their counts and one covariance ``Σ`` shared by the classes,
  updated as samples arrive, and scores ``x ↦ x·Λμ_c − ½ μ_cᵀΛμ_c`` with the shrunk precision
  ``Λ = ((1 − ε)Σ + εI)⁻¹`` (Deep SLDA: Hayes & Kanan, CVPR-W 2020).

**The covariance update.** Deep SLDA's public code updates, one sample ``(x, y)`` at a time,
``Σ ← (nΣ + n/(n+1) · (x − μ_y)(x − μ_y)ᵀ) / (n+1)`` with ``n`` the samples seen by all classes
and ``μ_y`` the class mean before the sample (zero for a class's first sample). Here the weight
is the class's own count, ``c_y/(c_y+1)`` (Welford's update, summed over classes): then ``Σ`` is
exactly the pooled within-class population covariance ``(1/N) Σ_i (x_i − μ_{y_i})(x_i − μ_{y_i})ᵀ``
of the samples seen, whatever their order, where Deep SLDA's weighting depends on the order (and
counts a class's first sample as a deviation from the origin). A batch is merged at once by Chan
et al.'s pairwise formula, which equals the one-sample update applied to its samples in turn.
The merges are computed in float64 and the state is kept (and counted) in float32.

**Classes never observed** score below every observed class (the lowest observed score minus one)
for NCM and SLDA, whose scores of an empty class would otherwise be arbitrary (SLDA's a class at
the origin); kNN gives them no votes. Every model answers zeros while it is empty, and a query whose
key is not finite gets zeros. Nothing non-finite is stored: a sample whose key is not finite is
dropped and counted (``counts["dropped"]``).

**Bytes** (:meth:`KNN.nbytes` and the others) count what a user would store: kNN's keys at
``row_dtype`` plus the class in the smallest unsigned type that holds the classes (one byte for up to
256), rows in use and as allocated (the capacity, grown along :func:`growmem.nadaraya.ladder` and never
past the budget); NCM's means (float32) and counts (int64); SLDA's as well plus ``Σ`` (``d × d``
float32, as ``other_bytes``); and the key space's own state. NCM and SLDA are fixed-size (every class's
mean is allocated from the start; their ``rows_in_use`` are the classes observed): a budget below their
size is refused. Derived working arrays — SLDA's
``ΛM`` and ``½ μᵀΛμ`` (``d × classes + classes`` float32, recomputed on the first ``predict`` after an
update), the distance blocks of a query batch — are not counted, as a target memory's are not.

**uint8 keys of 8-bit images** (``KNN(row_dtype="uint8", normalize=(mean, std))``, only over
``Identity(d, normalise=False)``): the stream's inputs are ``x = (p/255 − mean)/std`` of pixels ``p`` in
``0…255`` (torchvision's ``ToTensor`` then ``Normalize(mean, std)``; Avalanche's MNIST streams use
``(0.1307, 0.3081)``). The keys are really quantised: ``p = round(255 (x·std + mean))`` is stored, and
each block of rows is turned back into ``x`` to compute distances, so the model answers as with
float32 keys. An input off that grid (by more than :data:`UINT8_TOLERANCE` of a level) or outside
``0…255`` raises a ValueError naming the value (pass the stream's ``normalize``, or use ``bfloat16``).
"""
from __future__ import annotations

import ast
import math
from typing import Dict, Optional, Tuple

import numpy as np

from . import memory as memlib
from . import nadaraya
from .errors import ConfigError
from .keyspaces import Identity, KeySpace
from .reservoir import Slots, rng_state, set_rng_state
from .units import byte_budget

#: how kNN may store its keys
ROW_DTYPES = ("bfloat16", "float32", "uint8")
METRICS = ("euclidean", "cosine")
#: stored rows per distance block (a block of distances is ``B × chunk`` float32)
DEFAULT_CHUNK = 8192
#: how far (in pixel levels) an input may lie from the 8-bit grid and still be stored as uint8
UINT8_TOLERANCE = 0.05
_COUNTS = ("seen", "stored", "evicted", "dropped")


def _storage_dtype(name: str) -> np.dtype:
    if name not in ROW_DTYPES:
        raise ConfigError(f"row_dtype must be one of {ROW_DTYPES}, got {name!r}")
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def label_dtype(n_classes: int) -> np.dtype:
    """The smallest unsigned integer type that holds the class ids ``0 … n_classes − 1``."""
    return np.dtype(np.min_scalar_type(max(int(n_classes) - 1, 0)))


def _mask_unseen(scores: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Scores of classes not ``seen`` set just below the lowest seen score of each query."""
    if not seen.all() and seen.any():
        scores[:, ~seen] = (scores[:, seen].min(axis=1) - 1.0)[:, None]
    return scores


class _OrderFree:
    """What the three models share: key preparation, input checks, counts, the common state."""

    name = "order_free"

    def __init__(self, keys: KeySpace, d_out: int, *, budget_bytes: Optional[int] = None, seed: int = 0):
        if not isinstance(keys, KeySpace):
            raise ConfigError(f"keys must be a growmem.keyspaces.KeySpace (keyspaces.make(kind, d, ...)), got "
                              f"{type(keys).__name__}")
        if keys.n_regimes != 1 or type(keys).route is not KeySpace.route:
            raise ConfigError(f"{type(self).__name__} needs a fixed key space with one regime (identity, dct); "
                              f"{keys.name} opens regimes as it goes")
        if int(d_out) < 1:
            raise ConfigError(f"d_out must be >= 1, got {d_out}")
        budget_bytes = byte_budget(budget_bytes)
        self.keys = keys
        self.d_out = int(d_out)
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        self.rng = np.random.default_rng(seed)
        self.counts = dict.fromkeys(_COUNTS, 0)

    # ------------------------------------------------------------------ inputs
    @staticmethod
    def _inputs(x) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if x.ndim != 2:
            raise ConfigError(f"inputs must be (B, features), got shape {x.shape}")
        return x

    def _keys(self, x) -> Tuple[np.ndarray, np.ndarray]:
        """``(z:(B, key_dim) float32, finite:(B,) bool)`` for inputs ``x:(B, features)``."""
        zs, _ = self.keys.project(self.keys.params(), self.keys.prepare(x))
        z = np.asarray(zs[0], np.float32)
        return z, memlib.finite_rows(z)

    # ------------------------------------------------------------------ learn / answer
    def observe(self, x, y) -> dict:
        """Store one batch (a sample whose key is not finite is dropped and counted)."""
        x = self._inputs(x)
        y = nadaraya.class_ids(y, len(x), self.d_out)
        z, ok = self._keys(x)
        n = int(ok.sum())
        evicted = self._learn(z[ok], y[ok]) if n else 0
        self.counts["seen"] += len(x)
        self.counts["stored"] += n
        self.counts["dropped"] += len(x) - n
        self.counts["evicted"] += evicted
        return {"stored": n, "evicted": evicted, "dropped": len(x) - n}

    def predict(self, x, batch_size: int = 1024) -> np.ndarray:
        """Scores ``(B, d_out)`` float32 (argmax = class; zeros while empty and for a query whose key
        is not finite)."""
        x = self._inputs(x)
        out = np.zeros((len(x), self.d_out), np.float32)
        if self._empty():
            return out
        for a in range(0, len(x), max(1, int(batch_size))):
            z, ok = self._keys(x[a:a + batch_size])
            if ok.any():
                out[a:a + len(z)][ok] = self._scores(z[ok])
        return out

    def _empty(self) -> bool:
        raise NotImplementedError

    def _learn(self, z: np.ndarray, y: np.ndarray) -> int:
        raise NotImplementedError

    def _scores(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------ sizes
    def _sizes(self) -> Tuple[int, int, int, int]:
        """``(rows in use, their bytes, bytes of the rows as allocated, other bytes)``."""
        raise NotImplementedError

    def rows_in_use(self) -> int:
        return self._sizes()[0]

    #: the learner protocol (:mod:`growmem.learner`): rows grow, so a checkpoint restores by path
    fixed_shapes = False

    def rows(self) -> Dict[str, int]:
        """Rows in use (one regime once a row is stored; the learner protocol's ``rows``)."""
        n = self.rows_in_use()
        return {"regime0": n} if n else {}

    def nbytes(self) -> Dict[str, int]:
        """Bytes as a user would store them (module docstring), in the fields of a target memory's."""
        n, used, alloc, other = self._sizes()
        ks = int(self.keys.nbytes())
        return {"rows_in_use": n, "rows_in_use_bytes": used, "rows_allocated_bytes": alloc, "key_space_bytes": ks,
                "other_bytes": other, "bytes_in_use": used + ks + other, "bytes_allocated": alloc + ks + other}

    # ------------------------------------------------------------------ state
    def _arrays(self) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def _load_arrays(self, st: Dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def state(self) -> Dict[str, np.ndarray]:
        """Everything needed to resume exactly, as numpy arrays (at their stored dtypes)."""
        st = {"counts": np.asarray([self.counts[k] for k in _COUNTS], np.int64),
              "rng": rng_state(self.rng), **self._arrays()}
        for name, a in self.keys.state().items():
            st[f"keys_{name}"] = np.asarray(a)
        return st

    def load_state(self, st: Dict[str, np.ndarray]) -> None:
        self.counts = dict(zip(_COUNTS, (int(c) for c in st["counts"])))
        rng = np.asarray(st["rng"])
        if rng.dtype == np.uint8:        # a checkpoint of an earlier growmem: the generator's state as text
            self.rng.bit_generator.state = ast.literal_eval(bytes(rng).decode())
        else:
            set_rng_state(self.rng, rng)
        self.keys.load_state({k[len("keys_"):]: v for k, v in st.items() if k.startswith("keys_")})
        self._load_arrays(st)

    def describe(self) -> dict:
        return {"model": self.name, "keys": self.keys.describe(), "budget_bytes": self.budget_bytes,
                "rows_per_regime": list(self.rows().values()), **self.counts}


def _as(a, dtype) -> np.ndarray:
    """``a`` as ``dtype``; a checkpoint gives bfloat16 arrays back as raw 2-byte voids, viewed here."""
    a = np.asarray(a)
    if a.dtype.kind == "V" and a.dtype.itemsize == np.dtype(dtype).itemsize:
        return a.view(dtype)
    return a.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- kNN

class KNN(_OrderFree):
    """k nearest neighbours over stored keys (module docstring).

    ``k``: neighbours that vote; ``metric``: ``euclidean`` | ``cosine``; ``row_dtype``: ``bfloat16`` |
    ``float32`` | ``uint8`` (8-bit pixels over ``Identity(d, normalise=False)``, with ``normalize=(mean,
    std)`` the stream's pixel normalisation); ``budget_bytes``: keep at most the rows it holds, a
    class-balanced reservoir of the stream (``seed`` draws it); ``chunk``: stored rows per distance block.
    """

    name = "knn"

    def __init__(self, keys: KeySpace, d_out: int, *, k: int = 3, metric: str = "euclidean",
                 row_dtype: str = "bfloat16", normalize: Optional[Tuple[float, float]] = None,
                 budget_bytes: Optional[int] = None, seed: int = 0, chunk: int = DEFAULT_CHUNK):
        super().__init__(keys, d_out, budget_bytes=budget_bytes, seed=seed)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"k (neighbours that vote) must be an integer >= 1, got {k!r}")
        if metric not in METRICS:
            raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")
        if int(chunk) < 1:
            raise ConfigError(f"chunk (stored rows per distance block) must be >= 1, got {chunk}")
        self.k, self.metric, self.chunk = int(k), metric, int(chunk)
        self.row_dtype = str(row_dtype)
        self.key_dtype = _storage_dtype(self.row_dtype)
        self.label_dtype = label_dtype(self.d_out)
        self.normalize = None
        if self.row_dtype == "uint8":
            if not (isinstance(keys, Identity) and not keys.normalise):
                raise ConfigError(f"row_dtype='uint8' stores 8-bit pixels: it needs the raw inputs as keys "
                                  f"(keyspaces.Identity(d, normalise=False)), got {keys.name} keys "
                                  f"{keys.describe()}; use row_dtype='bfloat16' or 'float32' for them")
            if normalize is None or len(normalize) != 2 or not all(math.isfinite(float(v)) for v in normalize) \
                    or float(normalize[1]) <= 0:
                raise ConfigError(f"row_dtype='uint8' needs normalize=(mean, std), the stream's pixel "
                                  f"normalisation x = (p/255 - mean)/std with std > 0 (Avalanche's MNIST: "
                                  f"(0.1307, 0.3081); unnormalised ToTensor inputs: (0.0, 1.0)), got {normalize!r}")
            self.normalize = (float(normalize[0]), float(normalize[1]))
        elif normalize is not None:
            raise ConfigError(f"normalize is the pixel normalisation of row_dtype='uint8' keys; drop it for "
                              f"row_dtype={self.row_dtype!r}")
        self._k = np.zeros((0, keys.key_dim), self.key_dtype)
        self._y = np.zeros(0, self.label_dtype)
        self.size = 0
        self.max_rows = None
        self.slots = None
        if self.budget_bytes is not None:
            room = self.budget_bytes - keys.nbytes() - self._other_bytes()
            self.max_rows = max(0, room // self.row_bytes)
            if self.max_rows < self.d_out:
                need = keys.nbytes() + self._other_bytes() + self.d_out * self.row_bytes
                raise ConfigError(f"a memory budget of {self.budget_bytes} B holds {self.max_rows} samples of "
                                  f"{self.row_bytes} B (beside {keys.nbytes()} B of {keys.name} key space state); "
                                  f"kNN needs at least one per class ({self.d_out}): raise the budget to at least "
                                  f"{need} B")
            self.slots = Slots(self.max_rows, self.d_out, "balanced", self.rng)

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored sample: its key at ``row_dtype`` and its class."""
        return self.keys.key_dim * self.key_dtype.itemsize + self.label_dtype.itemsize

    def _other_bytes(self) -> int:
        return 8 if self.normalize is not None else 0      # the two float32 numbers of the pixel grid

    def _empty(self) -> bool:
        return self.size == 0

    def _sizes(self):
        return self.size, self.size * self.row_bytes, len(self._k) * self.row_bytes, self._other_bytes()

    # ------------------------------------------------------------------ storage
    def _encode(self, z: np.ndarray) -> np.ndarray:
        if self.normalize is None:
            return z.astype(self.key_dtype)
        mean, std = self.normalize
        p = 255.0 * (z.astype(np.float64) * std + mean)
        q = np.rint(p)
        off = np.abs(p - q)
        bad = (off > UINT8_TOLERANCE) | (q < 0) | (q > 255)
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            raise ConfigError(f"input value {float(z[i]):.6g} is pixel level {float(p[i]):.4f} under normalize="
                              f"{self.normalize}, not an 8-bit level 0..255 (within {UINT8_TOLERANCE}): pass the "
                              f"stream's normalize=(mean, std), or use row_dtype='bfloat16' for inputs that are "
                              f"not 8-bit images")
        return q.astype(np.uint8)

    def _decode(self, rows: np.ndarray) -> np.ndarray:
        if self.normalize is None:
            return rows.astype(np.float32)
        mean, std = self.normalize
        scale, offset = np.float32(1.0 / (255.0 * std)), np.float32(-mean / std)
        return rows.astype(np.float32) * scale + offset

    def _reserve(self, n: int) -> None:
        """Room for ``n`` rows: the capacity is the :func:`growmem.nadaraya.ladder` rung of ``n``, at most
        the rows the budget holds."""
        if n <= len(self._k):
            return
        cap = nadaraya.ladder(n)
        if self.max_rows is not None:
            cap = min(cap, self.max_rows)
        k = np.zeros((cap, self._k.shape[1]), self.key_dtype)
        y = np.zeros(cap, self.label_dtype)
        k[:self.size], y[:self.size] = self._k[:self.size], self._y[:self.size]
        self._k, self._y = k, y

    def _learn(self, z, y) -> int:
        rows = self._encode(z)                 # raises before anything changes
        labels = y.astype(self.label_dtype)
        n = self.size
        if self.max_rows is None:
            self._reserve(n + len(rows))
            self._k[n:n + len(rows)], self._y[n:n + len(rows)] = rows, labels
            self.size = n + len(rows)
            return 0
        # under the budget: a class-balanced reservoir (growmem.reservoir) says which row each sample takes
        self._reserve(min(self.max_rows, n + len(rows)))
        left = 0                             # samples that leave: a replaced row, or a newcomer not admitted
        for r, c in zip(rows, labels):
            j = self.slots.offer(int(c), self._y)
            if j is None or j < self.size:
                left += 1
            if j is not None:
                self._k[j], self._y[j] = r, c
                self.size = max(self.size, j + 1)
        return left

    # ------------------------------------------------------------------ answer
    def neighbours(self, z: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(distances, indices)`` of the ``min(k, rows)`` nearest stored rows of keys ``z:(B, key_dim)``,
        nearest first (float32 distances; squared Euclidean, or ``1 − cos``)."""
        z = np.asarray(z, np.float32)
        k = min(self.k, self.size)
        if self.metric == "cosine":
            z = z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-12)
        best_d = np.zeros((len(z), 0), np.float32)
        best_i = np.zeros((len(z), 0), np.int64)
        for a in range(0, self.size, self.chunk):
            kc = self._decode(self._k[a:min(a + self.chunk, self.size)])
            # ranked by ‖k‖² − 2 q·k (euclidean) or −cos; the per-query term is added to the k kept
            if self.metric == "cosine":
                kc /= np.linalg.norm(kc, axis=1, keepdims=True) + 1e-12
                d = z @ kc.T
                np.negative(d, out=d)
            else:
                d = z @ kc.T
                d *= -2.0
                d += np.einsum("ij,ij->i", kc, kc)[None, :]
            kk = min(k, d.shape[1])
            p = np.argpartition(d, kk - 1, axis=1)[:, :kk] if kk < d.shape[1] else np.broadcast_to(
                np.arange(d.shape[1]), d.shape)
            best_d = np.concatenate([best_d, np.take_along_axis(d, p, axis=1)], axis=1)
            best_i = np.concatenate([best_i, p + a], axis=1)
            if best_d.shape[1] > k:
                p = np.argpartition(best_d, k - 1, axis=1)[:, :k]
                best_d, best_i = np.take_along_axis(best_d, p, axis=1), np.take_along_axis(best_i, p, axis=1)
        best_d += 1.0 if self.metric == "cosine" else np.einsum("ij,ij->i", z, z)[:, None]
        np.maximum(best_d, 0.0, out=best_d)
        order = np.lexsort((best_i, best_d), axis=1)     # nearest first; equal distances by row
        return np.take_along_axis(best_d, order, axis=1), np.take_along_axis(best_i, order, axis=1)

    def _scores(self, z):
        d, i = self.neighbours(z)
        lab = self._y[i].astype(np.int64)
        rows = np.repeat(np.arange(len(z)), d.shape[1])
        votes = np.zeros((len(z), self.d_out), np.float64)
        np.add.at(votes, (rows, lab.ravel()), 1.0)
        near = np.full((len(z), self.d_out), np.inf)
        np.minimum.at(near, (rows, lab.ravel()), d.ravel().astype(np.float64))
        return (votes + np.where(np.isfinite(near), 1.0 / (2.0 + near), 0.0)).astype(np.float32)

    # ------------------------------------------------------------------ state
    def _arrays(self):
        st = {"rows_k": self._k[:self.size].copy(), "rows_y": self._y[:self.size].copy()}
        return st if self.slots is None else {**st, **self.slots.state()}

    def _load_arrays(self, st):
        k = _as(st["rows_k"], self.key_dtype).reshape(-1, self.keys.key_dim)
        y = _as(st["rows_y"], self.label_dtype).reshape(-1)
        if len(k) != len(y) or (self.max_rows is not None and len(k) > self.max_rows):
            raise ConfigError(f"a kNN state of {len(k)} keys and {len(y)} labels does not fit this model "
                              f"(at most {self.max_rows} rows under its budget)")
        self._k, self._y, self.size = np.zeros((0, k.shape[1]), self.key_dtype), np.zeros(0, self.label_dtype), 0
        self._reserve(len(k))
        self._k[:len(k)], self._y[:len(k)] = k, y
        self.size = len(k)
        if self.slots is not None:
            if "slots_counts" not in st:
                raise ConfigError("this kNN state was saved before kNN kept a class-balanced reservoir (it has no "
                                  "reservoir counts): start the run afresh")
            self.slots.load_state(st, y)

    def describe(self):
        return {**super().describe(), "k": self.k, "metric": self.metric, "row_dtype": self.row_dtype,
                "normalize": self.normalize, "row_bytes": self.row_bytes, "max_rows": self.max_rows}


# ----------------------------------------------------------------------------- class means

class _ClassMeans(_OrderFree):
    """Running class means (float32) and counts (int64), merged a batch at a time in float64; a fixed
    size, checked against the budget."""

    def __init__(self, keys: KeySpace, d_out: int, *, budget_bytes: Optional[int] = None, seed: int = 0):
        super().__init__(keys, d_out, budget_bytes=budget_bytes, seed=seed)
        self._allocate()
        if self.budget_bytes is not None:
            size = self.nbytes()["bytes_allocated"]
            if self.budget_bytes < size:
                raise ConfigError(f"{type(self).__name__} has a fixed size of {size} B ({self.d_out} classes, "
                                  f"keys of {keys.key_dim} values, {keys.nbytes()} B of {keys.name} key space "
                                  f"state); the memory budget of {self.budget_bytes} B is below it: raise the "
                                  f"budget to at least {size} B")

    def _allocate(self) -> None:
        self.means = np.zeros((self.d_out, self.keys.key_dim), np.float32)
        self.class_counts = np.zeros(self.d_out, np.int64)

    def _empty(self):
        return not self.class_counts.any()

    def _fixed_bytes(self) -> int:
        return self.means.nbytes + self.class_counts.nbytes

    def _sizes(self):
        b = self._fixed_bytes()
        return int(np.count_nonzero(self.class_counts)), b, b, 0

    def _merge_means(self, z, y):
        """Fold a batch into the means and counts; returns ``(classes present, their batch counts, their
        batch means, their means before the batch, their counts before)`` (float64)."""
        cls, inv, m = np.unique(y, return_inverse=True, return_counts=True)
        sums = np.zeros((len(cls), z.shape[1]))
        np.add.at(sums, inv, z.astype(np.float64))
        b = sums / m[:, None]
        old_mu, old_n = self.means[cls].astype(np.float64), self.class_counts[cls].copy()
        self.means[cls] = (old_mu + (m / (old_n + m))[:, None] * (b - old_mu)).astype(np.float32)
        self.class_counts[cls] += m
        return cls, inv, m, b, old_mu, old_n

    def _learn(self, z, y):
        self._merge_means(z, y)
        return 0

    def _arrays(self):
        return {"means": self.means.copy(), "class_counts": self.class_counts.copy()}

    def _load_arrays(self, st):
        means = np.asarray(st["means"], np.float32)
        counts = np.asarray(st["class_counts"], np.int64)
        if means.shape != self.means.shape or counts.shape != self.class_counts.shape:
            raise ConfigError(f"a state of means {means.shape} and counts {counts.shape} does not fit this "
                              f"{type(self).__name__} of {self.means.shape}")
        self.means, self.class_counts = means.copy(), counts.copy()


class NCM(_ClassMeans):
    """Nearest class mean (module docstring): scores are minus the Euclidean distances to the class
    means of the keys."""

    name = "ncm"

    def _scores(self, z):
        z = z.astype(np.float64)
        mu = self.means.astype(np.float64)
        d2 = np.einsum("ij,ij->i", z, z)[:, None] + np.einsum("ij,ij->i", mu, mu)[None, :] - 2.0 * z @ mu.T
        s = -np.sqrt(np.maximum(d2, 0.0))
        return _mask_unseen(s, self.class_counts > 0).astype(np.float32)


class SLDA(_ClassMeans):
    """Streaming linear discriminant analysis (module docstring): class means and one shared covariance
    ``Σ`` updated as samples arrive; scores ``x·Λμ_c − ½ μ_cᵀΛμ_c`` with ``Λ = ((1 − ε)Σ + εI)⁻¹``,
    ``ε = shrinkage`` in ``(0, 1]`` (Deep SLDA's default ``1e-4``)."""

    name = "slda"

    def __init__(self, keys: KeySpace, d_out: int, *, shrinkage: float = 1e-4, budget_bytes: Optional[int] = None,
                 seed: int = 0):
        if isinstance(shrinkage, bool) or not isinstance(shrinkage, (int, float, np.floating)) \
                or not (math.isfinite(shrinkage) and 0.0 < shrinkage <= 1.0):
            raise ConfigError(f"shrinkage (ε of Λ = ((1-ε)Σ + εI)^-1) must be a number in (0, 1], got {shrinkage!r}")
        self.shrinkage = float(shrinkage)
        super().__init__(keys, d_out, budget_bytes=budget_bytes, seed=seed)

    def _allocate(self):
        super()._allocate()
        self.cov = np.zeros((self.keys.key_dim, self.keys.key_dim), np.float32)
        self._cache = None

    def _sizes(self):
        n, b, _, _ = super()._sizes()
        return n, b, b, self.cov.nbytes                # the class rows; Σ beside them

    def _learn(self, z, y):
        n_old = int(self.class_counts.sum())
        cls, inv, m, b, old_mu, old_n = self._merge_means(z, y)
        x = z.astype(np.float64) - b[inv]                  # the batch about its own class means
        w = np.sqrt(old_n * m / (old_n + m))[:, None] * (b - old_mu)   # Chan et al.: n m / (n + m) ΔΔᵀ
        scatter = n_old * self.cov.astype(np.float64) + x.T @ x + w.T @ w
        self.cov = (scatter / (n_old + len(z))).astype(np.float32)
        self._cache = None
        return 0

    def discriminants(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(W = ΛM:(key_dim, d_out), c = ½ diag(MᵀΛM):(d_out,))`` for the current model (cached until the
        next update), ``M`` the class means as columns."""
        if self._cache is None:
            d = self.cov.shape[0]
            a = (1.0 - self.shrinkage) * self.cov.astype(np.float64) + self.shrinkage * np.eye(d)
            mt = self.means.T.astype(np.float64)
            w = np.linalg.solve(a, mt)
            self._cache = (w, 0.5 * np.sum(mt * w, axis=0))
        return self._cache

    def _scores(self, z):
        w, c = self.discriminants()
        return _mask_unseen(z.astype(np.float64) @ w - c, self.class_counts > 0).astype(np.float32)

    def _arrays(self):
        return {**super()._arrays(), "cov": self.cov.copy()}

    def _load_arrays(self, st):
        cov = np.asarray(st["cov"], np.float32)
        if cov.shape != self.cov.shape:
            raise ConfigError(f"a covariance of shape {cov.shape} does not fit this SLDA of {self.cov.shape}")
        super()._load_arrays(st)
        self.cov, self._cache = cov.copy(), None

    def describe(self):
        return {**super().describe(), "shrinkage": self.shrinkage}
