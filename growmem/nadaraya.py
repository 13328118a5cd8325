"""Target memories: the Nadaraya–Watson estimator as a growing memory.

A :class:`TargetMemory` stores one row per training sample it admits — ``w = 1``, ``k`` its
key, ``ṽ = y`` its *target* (one-hot for a class), ``born`` the step — and answers a query by
the Gaussian Nadaraya–Watson kernel (:data:`growmem.kernels.NADARAYA_WATSON`) over every row:

    ŷ(x) = Σ_i e^{−δ(x, i)/(2T√d)} ṽ_i / Σ_i e^{−δ(x, i)/(2T√d)}                    (NW-1)

with ``δ`` the squared distance of the key space (:mod:`growmem.keyspaces`, (KS-1)). Unlike the
error-driven rules (Algs. 2–5: ``ṽ = −βg`` against the current prediction), a row's value does
not depend on the rows stored before it, so a later class cannot overwrite an earlier one: the
memory of a class-incremental stream holds the same rows as that of the shuffled stream, and
answers the same — which is what a continual learner needs.

**The bandwidth T is learned** online, test-then-train: before a batch is stored, its samples are
answered by the memory without them (the leave-one-out / prequential loss of the test-time
regression view, ``../shared/reference/004``), and ``log T`` takes one clipped SGD step on the
cross-entropy ``−log ŷ_y`` (classification) or the squared error (regression). The gradient
flows through the kernel's custom VJP (``∂/∂T`` of every chunk's partial sums).

**Budgets.** With ``budget_bytes`` the memory counts its rows at their stored dtype (w float32,
k and ṽ in ``row_dtype``, born int32), its key space and its T, and keeps them within the budget
*as allocated*. A key space of one regime (DCT, identity, projection keys) allocates exactly the
``R`` rows the budget holds, once, and keeps ``R − B`` in use between batches (``B`` the largest batch
observed: the room a batch is stored into before the budget is enforced); a key space of several
regimes gives each regime the rung of a ×1.125 ladder just above its rows, so the rows in use are
held to ``(budget rows − 256 · regimes) / 1.125``. When a batch takes it past that, it evicts rows
from the largest (regime, class) group until it fits:

* ``redundant`` — among ``candidates ×`` as many random rows of the group as must go, those
  best explained by the others: the largest leave-one-out margin ``ŷ_{−i}[y_i] − max_{c≠y_i}
  ŷ_{−i}[c]`` (computed exactly from the row's regime partial minus its own term);
* ``random`` — uniformly within the group (class-balanced reservoir-like);
* ``oldest`` — the oldest rows of the group;
* ``merge`` — nothing is thrown away: rows become prototypes (one regime only). Once the budget's
  ``R`` rows are in use, rows are merged by Ward's criterion: merging rows ``a`` and ``b`` into their
  ``w``-weighted mean (``w_a + w_b`` samples) raises the memory's quantisation error
  ``Σ_rows Σ_{samples of the row} ‖q − k‖²`` by ``w_a w_b/(w_a + w_b) ‖k_a − k_b‖²``. A sample of a
  class that holds its share of rows (as many as the largest class) is absorbed by its nearest row of
  its class (``w ← w + 1``, ``k ← k + (q − k)/w``: the running mean, an exact SGD step of step size
  ``1/w`` on ``½‖q − k‖²``) when that costs less than the cheapest merge of two of the class's rows
  (searched among ``candidates`` random rows and every row of the class); else that pair merges and
  the sample takes the freed row. A sample of a smaller class takes a row of the largest class,
  freed by its cheapest merge. A prototype's ``ṽ`` is the sum of the targets it absorbed (``w``
  times its class's one-hot), so (NW-1) reads ``Σ e^{…} ṽ_i / Σ w_i e^{…}``: each prototype weighs as
  the samples it stands for. Ward's cost keeps a row near a class's centre from absorbing the whole class
  (the nearest-mean rule alone does: the mean is nearer to most samples than any sample is).

Nothing non-finite enters: a candidate row whose key or target is not finite is dropped and
counted (``dropped``).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import kernels
from . import memory as memlib
from .errors import ConfigError
from .keyspaces import KeySpace
from .units import byte_budget, check_temperature

NW = kernels.NADARAYA_WATSON
EVICTIONS = ("redundant", "random", "oldest", "merge")
#: the counters of a target memory, in the order its state saves them
COUNTS = ("seen", "stored", "evicted", "dropped", "merged")
#: a floor on ŷ_y in the cross-entropy of the bandwidth update
_P_FLOOR = 1e-12


def _regime_partial(log_t, mem, z, r, chunk):
    """The partial of one regime's rows for queries ``z`` with offsets ``r`` (KS-1): the kernel's
    ``(m, num, den)`` with ``m`` moved by ``−α r`` (``e^{−α(r + ‖z − k‖²)} = e^{−α r} e^{−α‖z − k‖²}``)."""
    t = jnp.exp(log_t)
    p = kernels.reduce(NW, z, mem.k, mem.v, mem.w, temperature=t, size=mem.size, chunk=chunk, row_grads=False)
    return kernels.Partial(p.m - NW.alpha(t, z.shape[1]) * r, p.num, p.den)


# One compiled function per regime shape (capacities come from a short ladder, shared by every
# regime), not per tuple of regimes.
_partial_jit = jax.jit(_regime_partial, static_argnames=("chunk",))


def _merge_all(parts):
    acc = parts[0]
    for p in parts[1:]:
        acc = kernels.merge(acc, p)
    return acc


@jax.jit
def _finish(parts):
    return NW.finish(_merge_all(parts))


class Moments(NamedTuple):
    """A regime's partial sums of (NW-1) and their derivatives in ``log T``: with scores
    ``s_i = −α(r + ‖z − k_i‖²)``, ``α = 1/(2T√d)``, ``∂s_i/∂log T = −s_i``, so
    ``∂num/∂log T = −Σ e^{s_i − m} s_i ṽ_i`` and ``∂den/∂log T = −Σ e^{s_i − m} s_i`` (one pass over
    the rows gives the loss and its gradient)."""

    m: jax.Array
    num: jax.Array
    den: jax.Array
    num_s: jax.Array
    den_s: jax.Array


def _regime_moments(log_t, mem, z, r, chunk):
    t = jnp.exp(log_t)
    alpha = NW.alpha(t, z.shape[1])
    b = z.shape[0]
    z2 = jnp.sum(z * z, axis=1)
    init = Moments(jnp.full((b,), -jnp.inf), jnp.zeros((b, mem.v.shape[1])), jnp.zeros((b,)),
                   jnp.zeros((b, mem.v.shape[1])), jnp.zeros((b,)))

    def body(c, rows, valid):
        k, v, w = (a.astype(jnp.float32) for a in rows)
        s = NW.scores(z, z2, k, alpha) - alpha * r[:, None]
        s = jnp.where(valid[None, :], s, -jnp.inf)
        m = jnp.maximum(c.m, jnp.max(s, axis=1))
        scale = jnp.exp(jnp.where(jnp.isfinite(m), c.m - m, 0.0))
        e = jnp.where(valid[None, :], jnp.exp(s - m[:, None]), 0.0) * w[None, :]
        es = e * jnp.where(valid[None, :], s, 0.0)
        return Moments(m, c.num * scale[:, None] + e @ v, c.den * scale + e.sum(1),
                       c.num_s * scale[:, None] + es @ v, c.den_s * scale + es.sum(1))

    ch = kernels.chunk_rows(chunk, mem.k, mem.v)
    return kernels.scan_rows(body, init, (mem.k, mem.v, mem.w), size=mem.size, chunk=ch)


_moments_jit = jax.jit(_regime_moments, static_argnames=("chunk",))


@partial(jax.jit, static_argnames=("classify",))
def _loss_and_grad_from(parts, y, classify):
    """Merge the regimes' moments and return ``(loss, ∂loss/∂log T)`` (CE on ŷ_y, or squared error)."""
    m = parts[0].m
    for p in parts[1:]:
        m = jnp.maximum(m, p.m)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    num = sum(p.num * jnp.exp(p.m - m)[:, None] for p in parts)
    den = sum(p.den * jnp.exp(p.m - m) for p in parts)
    num_s = sum(p.num_s * jnp.exp(p.m - m)[:, None] for p in parts)
    den_s = sum(p.den_s * jnp.exp(p.m - m) for p in parts)
    ok = den > 0
    den1 = jnp.where(ok, den, 1.0)
    yhat = jnp.where(ok[:, None], num / den1[:, None], 0.0)
    dyhat = jnp.where(ok[:, None], (-num_s + yhat * den_s[:, None]) / den1[:, None], 0.0)   # ∂ŷ/∂log T
    if classify:
        py = jnp.sum(yhat * y, axis=1)
        dpy = jnp.sum(dyhat * y, axis=1)
        live = py > _P_FLOOR
        loss = jnp.mean(-jnp.log(jnp.maximum(py, _P_FLOOR)))
        grad = jnp.mean(jnp.where(live, -dpy / jnp.where(live, py, 1.0), 0.0))
        return loss, grad
    err = yhat - y
    return 0.5 * jnp.mean(jnp.sum(err * err, axis=1)), jnp.mean(jnp.sum(err * dyhat, axis=1))


@partial(jax.jit, static_argnames=("project",))
def _project(kparams, u, *, project):
    return project(kparams, u)


def regime_partials(log_t, mems, kparams, u, project, chunk):
    """Every regime's partial (a list of :class:`growmem.kernels.Partial`) for prepared inputs ``u``."""
    zs, r = _project(kparams, u, project=project)
    return [_partial_jit(log_t, mem, zs[j], r[:, j], chunk=chunk) for j, mem in enumerate(mems)], zs, r


def loss_and_grad(log_t, mems, kparams, u, y, *, classify, project, chunk):
    """The prequential loss of (NW-1) on ``(u, y)`` and its derivative with respect to ``log T``
    (one pass over every regime's rows: :class:`Moments`)."""
    zs, r = _project(kparams, u, project=project)
    parts = [_moments_jit(log_t, mem, zs[j], r[:, j], chunk=chunk) for j, mem in enumerate(mems)]
    return _loss_and_grad_from(parts, y, classify=classify)


@partial(jax.jit, static_argnames=("chunk",))
def _loo_margins(log_t, mem, rows, labels, *, chunk):
    """Leave-one-out margins of rows ``rows`` of ``mem`` (their own term taken out of (NW-1))."""
    t = jnp.exp(log_t)
    q = mem.k[rows].astype(jnp.float32)
    p = kernels.reduce(NW, q, mem.k, mem.v, mem.w, temperature=t, size=mem.size, chunk=chunk, row_grads=False)
    alpha = NW.alpha(t, q.shape[1])
    k = mem.k[rows].astype(jnp.float32)
    q2 = jnp.sum(q * q, axis=1)
    self_s = -alpha * jnp.maximum(q2 + jnp.sum(k * k, axis=1) - 2.0 * jnp.sum(q * k, axis=1), 0.0)
    e = jnp.exp(self_s - p.m) * mem.w[rows]
    num = p.num - e[:, None] * mem.v[rows].astype(jnp.float32)
    den = p.den - e
    yhat = jnp.where(den[:, None] > 0, num / jnp.where(den > 0, den, 1.0)[:, None], 0.0)
    py = jnp.take_along_axis(yhat, labels[:, None], axis=1)[:, 0]
    other = jnp.max(jnp.where(jax.nn.one_hot(labels, yhat.shape[1], dtype=bool), -jnp.inf, yhat), axis=1)
    return py - other


def class_ids(y, n: int, n_classes: int) -> np.ndarray:
    """``y`` as ``n`` int64 class ids in ``[0, n_classes)`` (integral floats accepted), or a ValueError
    naming the bad label."""
    y = np.asarray(y).reshape(-1)
    if len(y) != n:
        raise ConfigError(f"got {len(y)} labels for {n} inputs")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ConfigError("class labels must be integers")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise ConfigError(f"label {int(y.min() if y.min() < 0 else y.max())} is outside the memory's "
                          f"{n_classes} classes")
    return y


def eviction_marks(labels: List[np.ndarray], excess: int, n_classes: int, victims) -> List[np.ndarray]:
    """Which rows to evict so that ``excess`` fewer remain: ``labels[j]`` holds the class of every row
    of regime ``j``; rows leave the largest (regime, class) group among those not yet marked, at most
    a fiftieth of it at a time (so the groups end balanced), chosen by ``victims(j, c, idx, n)`` (``n``
    of the group's row indices ``idx``). Returns one bool mask per regime (True: evict)."""
    drop = [np.zeros(len(lab), bool) for lab in labels]
    left = int(excess)
    while left > 0:
        best, best_n = None, 0
        for j, lab in enumerate(labels):
            counts = np.bincount(lab[~drop[j]], minlength=n_classes)
            c = int(np.argmax(counts))
            if counts[c] > best_n:
                best, best_n = (j, c), int(counts[c])
        if best is None:
            break
        j, c = best
        idx = np.flatnonzero((labels[j] == c) & ~drop[j])
        n = min(left, max(1, len(idx) // 50))
        drop[j][victims(j, c, idx, n)] = True
        left -= n
    return drop


#: capacities follow one ladder (×1.125, whole 256-row quanta) shared by every regime, so the
#: compiled functions see few shapes; a regime's capacity is the rung of its rows (at most
#: 12.5 % + one quantum more), which lets a budget bound the rows as allocated, not only in use
LADDER_GROWTH = 1.125


def ladder(n: int) -> int:
    """The smallest capacity of the ladder holding ``n`` rows."""
    c = memlib.ROW_QUANTUM
    while c < n:
        c = memlib.round_capacity(int(c * LADDER_GROWTH) + 1)
    return c


@jax.jit
def _append(mem, k, v, born, mask):
    return memlib.append(mem, jnp.ones(k.shape[:1], mem.w.dtype), k, v, born, mask)


@jax.jit
def _select(mem, keep):
    return memlib.select(mem, keep)


class TargetMemory:
    """A Nadaraya–Watson memory of targets over a key space (module docstring).

    ``keys``: a :class:`growmem.keyspaces.KeySpace`; ``d_out``: target width (classes);
    ``temperature``: the initial T of (NW-1); ``learn_temperature``, ``lr``, ``clip``: the
    prequential SGD step on ``log T``; ``row_dtype``: ``bfloat16`` | ``float32`` keys and
    targets; ``budget_bytes``, ``evict``, ``candidates``: see the module docstring;
    ``classify``: targets are class ids (one-hot ṽ, cross-entropy for T) — else float vectors.
    """

    def __init__(self, keys: KeySpace, d_out: int, *, temperature: float, learn_temperature: bool = True,
                 lr: float = 0.05, clip: float = 1.0, row_dtype: str = "bfloat16",
                 budget_bytes: Optional[int] = None, evict: str = "redundant", candidates: int = 8,
                 classify: bool = True, seed: int = 0, chunk: int = kernels.DEFAULT_CHUNK):
        temperature = check_temperature(temperature)
        if not (math.isfinite(lr) and lr >= 0) or not (math.isfinite(clip) and clip > 0):
            raise ConfigError(f"lr must be finite and >= 0 and clip finite and > 0, got lr={lr}, clip={clip}")
        if evict not in EVICTIONS:
            raise ConfigError(f"unknown eviction {evict!r}; choose one of {EVICTIONS}")
        if d_out < 1:
            raise ConfigError(f"d_out must be >= 1, got {d_out}")
        budget_bytes = byte_budget(budget_bytes)
        self.keys = keys
        self.d_out = int(d_out)
        self.row_dtype = memlib.row_dtype(row_dtype)
        #: a budget over one regime: one allocation of exactly the rows it holds (module docstring)
        self.fixed = budget_bytes is not None and keys.n_regimes == 1
        if evict == "merge" and keys.n_regimes != 1:
            raise ConfigError(f"evict='merge' keeps prototypes in one regime; the {keys.name} key space has "
                              f"{keys.n_regimes} (use evict='random', or DCT / identity / projection keys)")
        if budget_bytes is not None:
            least = self.d_out if self.fixed else 2 * memlib.ROW_QUANTUM
            need = keys.reserved_bytes() + 8 + least * self.row_bytes
            if budget_bytes < need:
                raise ConfigError(f"a memory budget of {int(budget_bytes)} B cannot hold the key space's state "
                                  f"({keys.reserved_bytes()} B for {keys.name}: see its n_fit / dim) plus "
                                  f"{least} rows ({self.row_bytes} B each); raise the budget to at least {need} B")
        self.log_t = float(math.log(temperature))
        self.learn_temperature = bool(learn_temperature)
        self.lr, self.clip = float(lr), float(clip)
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        self.evict, self.candidates = evict, max(1, int(candidates))
        self.classify = bool(classify)
        self.chunk = int(chunk)
        self.rng = np.random.default_rng(seed)
        self.mems: List[memlib.Memory] = []
        self.labels: List[np.ndarray] = []          # host copy of each row's class (argmax ṽ), for eviction groups
        self.step_count = 0
        self.headroom = 0                           # the largest batch observed (room kept free under a budget)
        self.counts = dict.fromkeys(COUNTS, 0)

    # ------------------------------------------------------------------ sizes
    @property
    def temperature(self) -> float:
        return float(math.exp(self.log_t))

    @property
    def row_bytes(self) -> int:
        return memlib.row_bytes(self.keys.key_dim, self.d_out, self.row_dtype)

    def rows_in_use(self) -> int:
        return int(sum(len(lab) for lab in self.labels))

    #: the learner protocol (:mod:`growmem.learner`): rows grow, so a checkpoint restores by path
    fixed_shapes = False

    def rows(self) -> Dict[str, int]:
        """Rows in use per key regime (the learner protocol's ``rows``)."""
        return {f"regime{j}": len(lab) for j, lab in enumerate(self.labels)}

    def nbytes(self) -> Dict[str, int]:
        """Bytes counted against a budget: rows in use at their stored dtypes, the key space's state,
        T and the step counter; ``allocated`` counts rows by capacity."""
        rows = self.rows_in_use() * self.row_bytes
        alloc = sum(m.capacity for m in self.mems) * self.row_bytes
        other = self.keys.nbytes() + 8
        return {"rows_in_use": self.rows_in_use(), "rows_in_use_bytes": rows, "rows_allocated_bytes": alloc,
                "key_space_bytes": self.keys.nbytes(), "other_bytes": 8, "bytes_in_use": rows + other,
                "bytes_allocated": alloc + other}

    # ------------------------------------------------------------------ inputs
    def _inputs(self, x) -> np.ndarray:
        """``x`` as float32 ``(B, features)``, its features those of the key space (else a
        ``ValueError`` naming both shapes)."""
        x = np.asarray(x, np.float32)
        d = self.keys.input_dim
        if x.ndim != 2 or (d is not None and x.shape[1] != d):
            raise ConfigError(f"inputs have shape {tuple(x.shape)}; the {self.keys.name} key space takes (B, "
                              f"{d if d is not None else 'features'}) inputs")
        return x

    def _targets(self, y, n: int) -> np.ndarray:
        y = np.asarray(y)
        if self.classify:
            return np.eye(self.d_out, dtype=np.float32)[class_ids(y, n, self.d_out)]
        y = np.asarray(y, np.float32).reshape(n, -1)
        if y.shape[1] != self.d_out:
            raise ConfigError(f"targets have {y.shape[1]} values per sample, the memory holds {self.d_out}")
        return y

    def _kparams(self):
        return self.keys.params()

    # ------------------------------------------------------------------ answer
    def predict(self, x, batch_size: int = 1024) -> np.ndarray:
        """``ŷ:(B, d_out)`` of (NW-1) (zeros while the memory is empty)."""
        x = self._inputs(x)
        out = np.zeros((len(x), self.d_out), np.float32)
        if not self.mems:
            return out
        mems = tuple(self.mems)
        kp = self._kparams()
        for a in range(0, len(x), batch_size):
            u = self.keys.prepare(x[a:a + batch_size])
            parts, _, _ = regime_partials(jnp.float32(self.log_t), mems, kp, u, self.keys.project, self.chunk)
            out[a:a + batch_size] = np.asarray(_finish(parts))
        return out

    # ------------------------------------------------------------------ learn
    def observe(self, x, y) -> dict:
        """Test-then-train on one batch: a step on ``log T`` with the batch answered by the rows stored
        so far, then the batch stored (through the key space's routing) and the budget enforced."""
        x = self._inputs(x)
        yv = self._targets(y, len(x))
        if self.fixed and self.evict != "merge" and len(x) > self.headroom:
            if len(x) > self._rows_held() - self.d_out:
                raise ConfigError(f"a batch of {len(x)} samples does not fit a target memory whose budget holds "
                                  f"{self._rows_held()} rows ({self.d_out} kept for the classes): use smaller "
                                  f"batches or raise the budget")
            self.headroom = len(x)
        u = self.keys.prepare(x)
        loss = float("nan")
        if self.mems and self.learn_temperature and self.lr > 0:
            lv, g = loss_and_grad(jnp.float32(self.log_t), self.mems, self._kparams(), u, jnp.asarray(yv),
                                  classify=self.classify, project=self.keys.project, chunk=self.chunk)
            loss, g = float(lv), float(g)
            if math.isfinite(g):
                self.log_t -= self.lr * max(-self.clip, min(self.clip, g))
        stored = 0
        for j, uj, yj in self.keys.route(np.asarray(u), yv):
            stored += self._merge_store(j, uj, yj) if (self.evict == "merge" and self.fixed) else \
                self._store(j, uj, yj)
        self.counts["seen"] += len(x)
        evicted = self._enforce_budget()
        self.step_count += 1
        return {"loss": loss, "stored": stored, "evicted": evicted, "temperature": self.temperature}

    def _regime(self, j: int) -> memlib.Memory:
        while len(self.mems) <= j:
            self.mems.append(memlib.empty(self.keys.key_dim, self.d_out, memlib.ROW_QUANTUM,
                                          row_dtype=self.row_dtype))
            self.labels.append(np.zeros(0, np.int16))
        return self.mems[j]

    def _rows_held(self) -> int:
        """``R_b``: the rows the budget holds beside the key space's state and T."""
        return int((self.budget_bytes - self.keys.nbytes() - 8) // self.row_bytes)

    def _budget_rows(self) -> Optional[int]:
        """Rows that may be in use so that the rows as allocated fit the budget: one regime allocates
        ``R_b`` rows and keeps a batch of room, ``R_b − B``; else every regime's capacity is at most
        ``g·size + quantum`` (:func:`ladder`), so ``Σ size ≤ (R_b − quantum·n)/g`` with ``n`` the
        regimes."""
        if self.budget_bytes is None:
            return None
        rows = self._rows_held()
        if self.fixed:
            return rows - self.headroom             # (merge: headroom stays 0, every row in use)
        n = max(1, len(self.mems), self.keys.n_regimes)
        return max(0, int((rows - memlib.ROW_QUANTUM * n) / LADDER_GROWTH))

    def _store(self, j: int, u, y) -> int:
        mem = self._regime(j)
        k = _project(self._kparams(), jnp.asarray(u), project=self.keys.project)[0][j]
        ok = memlib.finite_rows(np.asarray(k), np.asarray(y))
        self.counts["dropped"] += int((~ok).sum())
        n = int(ok.sum())
        if n == 0:
            return 0
        size = len(self.labels[j])
        if self.fixed and mem.capacity != self._rows_held():
            mem = memlib.with_capacity(mem, self._rows_held(), quantum=1)    # the one allocation
        elif size + len(y) > mem.capacity:
            mem = memlib.with_capacity(mem, ladder(size + len(y)))
        mem = _append(mem, k, jnp.asarray(y), jnp.int32(self.step_count), jnp.asarray(ok))
        self.mems[j] = mem
        lab = np.argmax(y[ok], axis=1).astype(np.int16) if self.classify else np.zeros(n, np.int16)
        self.labels[j] = np.concatenate([self.labels[j], lab])
        self.counts["stored"] += n
        return n

    def _merge_store(self, j: int, u, y) -> int:
        """``evict="merge"`` under a budget (module docstring): the batch's samples, in order, are stored
        while there is room, then merged by Ward's criterion. Host-side over the regime's ``R`` rows;
        returns the rows newly stored."""
        mem = self._regime(j)
        held = self._rows_held()
        if mem.capacity != held:
            mem = memlib.with_capacity(mem, held, quantum=1)
        k = np.asarray(_project(self._kparams(), jnp.asarray(u), project=self.keys.project)[0][j], np.float32)
        ok = memlib.finite_rows(k, np.asarray(y))
        self.counts["dropped"] += int((~ok).sum())
        if not ok.any():
            self.mems[j] = mem
            return 0
        K, W = np.array(mem.k, np.float32), np.array(mem.w, np.float32)
        V, born = np.array(mem.v, np.float32), np.array(mem.born, np.int32)
        lab = np.concatenate([self.labels[j], np.zeros(held - len(self.labels[j]), np.int16)])
        size, stored, merged = len(self.labels[j]), 0, 0
        counts = np.bincount(lab[:size], minlength=self.d_out)

        def cheapest_pair(group):
            """``(cost, b, a)``: the cheapest Ward merge of a candidate row ``b`` into a row ``a`` of ``group``."""
            cand = self.rng.choice(group, min(len(group), self.candidates), replace=False)
            d2 = ((K[cand][:, None, :] - K[group][None, :, :]) ** 2).sum(-1)
            cost = d2 * (W[cand][:, None] * W[group][None, :]) / (W[cand][:, None] + W[group][None, :])
            cost[cand[:, None] == group[None, :]] = np.inf
            ci, gi = np.unravel_index(int(np.argmin(cost)), cost.shape)
            return float(cost[ci, gi]), int(cand[ci]), int(group[gi])

        for q, t in zip(k[ok], y[ok]):
            c = int(np.argmax(t)) if self.classify else 0
            if size < held:
                dst = size
                size += 1
            else:
                own = counts[c] >= counts.max()
                group = np.flatnonzero(lab[:size] == (c if own else int(np.argmax(counts))))
                cost, b, a = cheapest_pair(group) if len(group) > 1 else (math.inf, -1, -1)
                if own:
                    n = group[int(np.argmin(((K[group] - q) ** 2).sum(1)))]
                    if ((K[n] - q) ** 2).sum() * W[n] / (W[n] + 1.0) <= cost:     # absorbed: the running mean
                        W[n] += 1.0
                        K[n] += (q - K[n]) / W[n]
                        V[n] += t
                        merged += 1
                        continue
                if b < 0:
                    continue                                    # a class of one row keeps it
                K[a] = (W[a] * K[a] + W[b] * K[b]) / (W[a] + W[b])
                W[a] += W[b]
                V[a] += V[b]
                merged += 1
                counts[lab[b]] -= 1
                dst = b
            K[dst], W[dst], V[dst], born[dst], lab[dst] = q, 1.0, t, self.step_count, c
            counts[c] += 1
            stored += 1
        self.mems[j] = mem.replace(k=jnp.asarray(K, mem.k.dtype), w=jnp.asarray(W, mem.w.dtype),
                                   v=jnp.asarray(V, mem.v.dtype), born=jnp.asarray(born, jnp.int32),
                                   size=jnp.asarray(size, jnp.int32))
        self.labels[j] = lab[:size].astype(np.int16)
        self.counts["stored"] += stored
        self.counts["merged"] += merged
        return stored

    def _enforce_budget(self) -> int:
        cap = self._budget_rows()
        if cap is None:
            return 0
        excess = self.rows_in_use() - cap
        if excess <= 0:
            return 0
        drop = eviction_marks(self.labels, excess, self.d_out, self._victims)
        total = 0
        for j, d in enumerate(drop):
            if d.any():
                keep = np.zeros(self.mems[j].capacity, bool)
                keep[:len(d)] = ~d
                mem = _select(self.mems[j], jnp.asarray(keep))
                self.labels[j] = self.labels[j][~d]
                self.mems[j] = mem
                total += int(d.sum())
        for j, mem in enumerate(self.mems):       # give back room past each regime's rung
            fit = ladder(len(self.labels[j]))
            if mem.capacity > fit and not self.fixed:
                self.mems[j] = memlib.with_capacity(mem, fit)
        self.counts["evicted"] += total
        return total

    def _victims(self, j: int, c: int, idx: np.ndarray, n: int) -> np.ndarray:
        if self.evict == "oldest":
            born = np.asarray(self.mems[j].born)[idx]
            return idx[np.argsort(born, kind="stable")[:n]]
        if self.evict == "random" or not self.classify:
            return self.rng.choice(idx, n, replace=False)
        cand = self.rng.choice(idx, min(len(idx), self.candidates * n), replace=False)
        # pad to a power of two (repeating the first candidate) so that few shapes are compiled
        padded = np.resize(cand, max(64, 1 << int(len(cand) - 1).bit_length()))
        padded[len(cand):] = cand[0]
        margin = np.asarray(_loo_margins(jnp.float32(self.log_t), self.mems[j], jnp.asarray(padded, jnp.int32),
                                         jnp.full((len(padded),), c, jnp.int32), chunk=self.chunk))[:len(cand)]
        return cand[np.argsort(-margin, kind="stable")[:n]]

    # ------------------------------------------------------------------ state
    def state(self) -> Dict[str, np.ndarray]:
        """Everything needed to resume exactly, as numpy arrays (rows at their stored dtypes)."""
        st = {"log_t": np.asarray(self.log_t, np.float64), "step": np.asarray(self.step_count, np.int64),
              "headroom": np.asarray(self.headroom, np.int64),
              "counts": np.asarray([self.counts[k] for k in COUNTS], np.int64),
              "n_regimes": np.asarray(len(self.mems), np.int64),
              "rng": np.frombuffer(repr(self.rng.bit_generator.state).encode(), np.uint8)}
        for j, mem in enumerate(self.mems):
            rows = mem.rows()
            for f in memlib.FIELDS:
                st[f"r{j}_{f}"] = np.asarray(rows[f])
            st[f"r{j}_labels"] = self.labels[j]
        for name, a in self.keys.state().items():
            st[f"keys_{name}"] = np.asarray(a)
        return st

    def load_state(self, st: Dict[str, np.ndarray]) -> None:
        import ast

        self.log_t = float(st["log_t"])
        self.step_count = int(st["step"])
        self.headroom = int(st["headroom"]) if "headroom" in st else 0
        self.counts = {**dict.fromkeys(COUNTS, 0), **dict(zip(COUNTS, (int(c) for c in st["counts"])))}
        self.rng.bit_generator.state = ast.literal_eval(bytes(np.asarray(st["rng"], np.uint8)).decode())
        self.keys.load_state({k[len("keys_"):]: v for k, v in st.items() if k.startswith("keys_")})
        self.mems, self.labels = [], []
        for j in range(int(st["n_regimes"])):
            rows = {f: st[f"r{j}_{f}"] for f in memlib.FIELDS}
            mem = memlib.from_rows(rows["w"], rows["k"], rows["v"], rows["born"], row_dtype=self.row_dtype)
            self.mems.append(mem)
            self.labels.append(np.asarray(st[f"r{j}_labels"], np.int16))

    def describe(self) -> dict:
        return {"kernel": NW.name, "keys": self.keys.describe(), "temperature": self.temperature,
                "learn_temperature": self.learn_temperature, "lr": self.lr, "row_dtype": self.row_dtype.name,
                "row_bytes": self.row_bytes, "budget_bytes": self.budget_bytes, "evict": self.evict,
                "rows_per_regime": list(self.rows().values()), **self.counts}
