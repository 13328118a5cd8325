"""Growth and pruning policies: which candidate rows enter a memory, what leaves or fades,
and how stored rows are weighted at retrieval (paper Sec. 3.3, App. A.4, D, F.4).

A :class:`Policy` is an optax-style record of pure functions plus a little static data::

    init(mem)                                  -> state
    admit(rows, mem, mask, state)              -> (mask, state)        candidates that may enter
    age(mem, state)                            -> (mem, state)         fade the stored rows
    evict(mem, rows, mask, keep, state)        -> (keep, mask, state)  stored rows that stay
    coeff(mem, retention)                      -> (C,) array or None   retrieval coefficient c_i
    retention: float    factor by which ``age`` scales stored values per step (1 = none)
    name: str           for messages and ``repr``

``rows`` are the rule's candidates (:class:`growmem.rules.Rows`, ``B`` of them), ``mask:(B,)``
marks the candidates still admitted, ``keep:(C,)`` the stored rows that stay (only rows in
use, ``index < size``, are ever kept). All functions are jittable; ``state`` is any pytree.
``coeff`` sees only the memory (rows, ``born``, clock ``t``), because inference sees nothing
else; ``retention`` lets a coefficient know how the chain decays stored rows (momentum needs
it for the combined closed form, Eq. 100).

**One growth step** (:func:`step`, called by the trainer for every growing layer after the
backward pass; ``D_{t-1}`` is the memory the forward pass used):

1. ``admit`` — every policy of a chain in order, each narrowing the mask left by the one
   before; they see ``D_{t-1}`` (Alg. 4 line 9);
2. (hybrid mode only) the optimizer step on the stored rows (Alg. 4 line 10);
3. ``age`` — every policy in order (weight decay scales the stored rows, Eq. 21/90);
4. ``evict`` — every policy in order, each narrowing ``keep`` and possibly ``mask``; so a
   pruning policy placed before a capacity policy frees room that the capacity policy then
   counts. Put ``capacity`` last: it is the one that guarantees the bound;
5. the kept rows are compacted, the admitted candidates appended (born ``t+1``), ``t += 1``.

``coeff`` of a chain is the product of its members' coefficients; ``retention`` the product
of their retentions.

Writing your own policy takes a few lines (see :func:`policy`)::

    import jax.numpy as jnp
    from growmem import GrowingSpec, policies

    def min_error(threshold):
        '''Admit a candidate only if its value (the scaled error) is large enough.'''
        def admit(rows, mem, mask, state):
            big = jnp.linalg.norm(rows.v, axis=-1) > threshold
            return mask & big, state + jnp.sum(mask & ~big)   # state: rows refused so far
        return policies.policy(f"min_error({threshold})", init=lambda mem: jnp.zeros((), jnp.int32),
                               admit=admit)

    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=30.0,
                            policy=policies.chain(min_error(1e-3), policies.capacity(10_000)))

(``examples/custom_policy.py`` runs this with momentum, decay and a cap.) The trainer keeps
each layer's state in ``TrainState.policy_state["layer/path"]``.

Costs per step and layer (C rows of capacity, N in use, B candidates): ``novelty`` one
``(B, d)×(d, N)`` product plus a pass for ‖k‖² per cache-sized chunk (measured at the speed of
the bare product, ``benchmarks/novelty_search.py``); ``capacity`` ``reject`` O(C) mask work,
``evict_oldest``/``evict_smallest`` a sort of the C (+B) rows; ``weight_decay`` rescales all
rows (O(C·d) memory traffic, like one retrieval pass) and pruning reads every row's norm; a
compaction (O(C·d)) runs only in steps where some row leaves; ``momentum`` O(C) coefficients
per retrieval and no velocity buffer.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from . import kernels
from . import memory as memlib

ON_FULL = ("reject", "evict_oldest", "evict_smallest")
#: rows per chunk of the novelty search; small enough that a chunk of keys stays in cache
#: while its squared norms and its product with the queries are computed
NOVELTY_CHUNK = 256
_INT_MAX = jnp.iinfo(jnp.int32).max


class Policy(NamedTuple):
    """A growth policy: pure functions plus static data (see the module docstring)."""

    init: Callable
    admit: Callable
    age: Callable
    evict: Callable
    coeff: Callable
    retention: float = 1.0
    name: str = "policy"

    def __repr__(self):
        return self.name


def _init_none(mem):
    return ()


def _admit_all(rows, mem, mask, state):
    return mask, state


def _age_none(mem, state):
    return mem, state


def _evict_none(mem, rows, mask, keep, state):
    return keep, mask, state


def _coeff_none(mem, retention):
    return None


def policy(name: str = "custom", *, init: Optional[Callable] = None, admit: Optional[Callable] = None,
           age: Optional[Callable] = None, evict: Optional[Callable] = None,
           coeff: Optional[Callable] = None, retention: float = 1.0) -> Policy:
    """Build a :class:`Policy`; the stages you leave out do nothing (state ``()``)."""
    if not 0.0 < retention <= 1.0:
        raise ValueError(f"retention must be in (0, 1], got {retention}")
    return Policy(init=init or _init_none, admit=admit or _admit_all, age=age or _age_none,
                  evict=evict or _evict_none, coeff=coeff or _coeff_none, retention=float(retention),
                  name=name)


def identity() -> Policy:
    """The policy that admits every candidate and never evicts (plain growth)."""
    return policy("identity")


def _cached(factory):
    """Cache a policy factory on its bound arguments, so equal calls return the same Policy
    however they are spelled (``capacity(10)`` is ``capacity(max_rows=10, on_full="reject")``):
    specs holding equal policies then compare equal and share compiled code."""
    sig = inspect.signature(factory)
    cache = {}

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple(bound.arguments.items())
        try:
            return cache[key]
        except KeyError:
            return cache.setdefault(key, factory(*args, **kwargs))
        except TypeError:  # unhashable argument: no caching
            return factory(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------------------------
# chain


@_cached
def chain(*policies: Policy) -> Policy:
    """Compose policies: every stage runs each member in the order given (module docstring).

    States are a tuple, one per member. Coefficients multiply, retentions multiply.
    Cached, so ``chain(a, b) == chain(a, b)`` (equal specs share compiled code).
    """
    for p in policies:
        if not isinstance(p, Policy):
            raise TypeError(f"chain() takes Policy objects, got {type(p).__name__}: {p!r}")
    retention = math.prod(p.retention for p in policies) if policies else 1.0

    def init(mem):
        return tuple(p.init(mem) for p in policies)

    def admit(rows, mem, mask, state):
        out = []
        for p, s in zip(policies, state):
            mask, s = p.admit(rows, mem, mask, s)
            out.append(s)
        return mask, tuple(out)

    def age(mem, state):
        out = []
        for p, s in zip(policies, state):
            mem, s = p.age(mem, s)
            out.append(s)
        return mem, tuple(out)

    def evict(mem, rows, mask, keep, state):
        out = []
        for p, s in zip(policies, state):
            keep, mask, s = p.evict(mem, rows, mask, keep, s)
            out.append(s)
        return keep, mask, tuple(out)

    def coeff(mem, retention):
        c = None
        for p in policies:
            ci = p.coeff(mem, retention)
            if ci is not None:
                c = ci if c is None else c * ci
        return c

    return Policy(init, admit, age, evict, coeff, retention,
                  "chain(" + ", ".join(p.name for p in policies) + ")")


# ---------------------------------------------------------------------------------------------
# one growth step


class StepResult(NamedTuple):
    mem: memlib.Memory     # the memory after the step (clock advanced)
    state: Any             # the policy state after the step
    keep: jax.Array        # (C,) stored rows (of the memory before the step) that stayed
    mask: jax.Array        # (B,) candidates that were appended
    aux: Any               # whatever ``update_rows`` returned besides the memory


def compact(mem: memlib.Memory, keep) -> memlib.Memory:
    """:func:`growmem.memory.select`, skipped at run time when no row in use leaves."""
    keep = keep & memlib.valid_mask(mem)
    changed = jnp.any(memlib.valid_mask(mem) & ~keep)
    return lax.cond(changed, lambda m: memlib.select(m, keep), lambda m: m, mem)


def step(pol: Policy, mem: memlib.Memory, rows, state, *, update_rows: Optional[Callable] = None) -> StepResult:
    """One growth step of one memory (module docstring, steps 1–5). Pure and jittable.

    ``update_rows(mem) -> (mem, aux)`` runs between admission and ageing (the hybrid
    optimizer step of Alg. 4); it must not change which rows are in use.
    """
    born = mem.t + 1
    mask = jnp.ones((rows.k.shape[0],), bool)
    mask, state = pol.admit(rows, mem, mask, state)
    aux = None
    if update_rows is not None:
        mem, aux = update_rows(mem)
    mem, state = pol.age(mem, state)
    keep, mask, state = pol.evict(mem, rows, mask, memlib.valid_mask(mem), state)
    keep = keep & memlib.valid_mask(mem)
    mem = compact(mem, keep)
    mem = memlib.append(mem, rows.w, rows.k, rows.v, born=born, mask=mask)
    return StepResult(mem.replace(t=born), state, keep, mask, aux)


# ---------------------------------------------------------------------------------------------
# helpers


def _weighted(mem) -> bool:
    """Does the kernel use ``w`` (weighted softmax)? Memories without a spec count as weighted."""
    return mem.spec is None or mem.spec.kernel == "weighted_softmax"


def significance(mem: memlib.Memory) -> jax.Array:
    """``(C,)`` size of each stored row: ``max(|w|, ‖ṽ‖)`` (weighted softmax) or ``‖v‖``.

    A row is below ε exactly when ``|w| < ε`` and ``‖ṽ‖ < ε`` (the pruning rule of App. D.1).
    """
    vn = jnp.linalg.norm(mem.v, axis=-1)
    return jnp.maximum(jnp.abs(mem.w), vn) if _weighted(mem) else vn


def candidate_significance(mem: memlib.Memory, rows) -> jax.Array:
    vn = jnp.linalg.norm(rows.v, axis=-1)
    return jnp.maximum(jnp.abs(rows.w), vn) if _weighted(mem) else vn


def min_sq_distance(q, k, *, size=None, chunk: int = NOVELTY_CHUNK) -> jax.Array:
    """``(B,)`` ``min_j ‖q_b − k_j‖²`` over rows ``j < size`` (``+inf`` when there are none).

    Chunked over rows through one matrix product per chunk
    (``‖q‖² + ‖k‖² − 2 q·k``, clamped at 0); never materialises ``(B, N, d)``.
    """
    q2 = jnp.sum(q * q, axis=1)

    def body(m, r, valid):
        (kc,) = r
        d2 = q2[:, None] + jnp.sum(kc * kc, axis=1)[None, :] - 2.0 * (q @ kc.T)
        return jnp.minimum(m, jnp.min(jnp.where(valid[None, :], d2, jnp.inf), axis=1))

    m = kernels.scan_rows(body, jnp.full(q.shape[:1], jnp.inf, q.dtype), (k,), size=size, chunk=chunk)
    return jnp.maximum(m, 0.0)


def _first(mask, n):
    """Keep the first ``n`` True entries of ``mask``."""
    return mask & (jnp.cumsum(mask.astype(jnp.int32)) <= n)


def _last(mask, n):
    """Keep the last ``n`` True entries of ``mask``."""
    after = jnp.cumsum(mask[::-1].astype(jnp.int32))[::-1]  # True entries at or after i
    return mask & (after <= n)


def _rank(score, valid):
    """Rank of each valid entry in ascending ``score`` (stable: ties by position); invalid last."""
    order = jnp.argsort(jnp.where(valid, score, jnp.inf), stable=True)
    return jnp.zeros(score.shape, jnp.int32).at[order].set(jnp.arange(score.shape[0], dtype=jnp.int32))


# ---------------------------------------------------------------------------------------------
# built-in policies


def _check_number(name, value, ok, allowed):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


@_cached
def novelty(tau: float, *, relative: bool = False, within_batch: bool = False,
            chunk: int = NOVELTY_CHUNK) -> Policy:
    """Admit a candidate only if ``min_j ‖q − k_j‖₂ > τ`` over the stored rows (Alg. 4 line 9).

    relative      τ is given in units of ``‖q‖ = √d_in`` (RMS-normalised queries, F.4):
                  the threshold is ``τ·√d_in``
    within_batch  False (the paper): candidates are compared with the rows stored before
                  the step only, so two near-identical queries of one batch both enter.
                  True: candidates are also compared, in batch order, with the candidates
                  of the same batch admitted before them (greedy), so no two admitted rows
                  are within τ of each other.
    chunk         rows per chunk of the distance search (:func:`min_sq_distance`)

    Candidates already refused by an earlier policy of a chain do not block later ones.
    Cost per step: one ``(B, d) × (d, N)`` product and the keys' squared norms, streamed
    in chunks over the rows in use.
    """
    _check_number("novelty tau", tau, lambda x: x >= 0, "a number >= 0")
    if chunk <= 0:
        raise ValueError(f"novelty chunk must be positive, got {chunk}")

    def admit(rows, mem, mask, state):
        q = rows.k
        thr = tau * math.sqrt(q.shape[1]) if relative else tau
        thr2 = jnp.asarray(thr * thr, q.dtype)
        if mem.shards is not None:  # each shard searches its own rows; the minima are merged
            d2 = mem.shards.min_sq_distance(mem, q, chunk)
        else:
            d2 = min_sq_distance(q, mem.k, size=mem.size, chunk=chunk)
        if mem.cold is not None:  # rows that spilled to the cold tier count too
            d2 = jnp.minimum(d2, mem.cold.min_sq_distance(q))
        ok = mask & (d2 > thr2)
        if within_batch:
            q2 = jnp.sum(q * q, axis=1)
            near = (q2[:, None] + q2[None, :] - 2.0 * (q @ q.T)) <= thr2   # (B, B)

            def body(n, adm):
                earlier = jnp.arange(q.shape[0]) < n
                blocked = jnp.any(adm & earlier & near[n])
                return adm.at[n].set(ok[n] & ~blocked)

            ok = lax.fori_loop(0, q.shape[0], body, jnp.zeros_like(ok))
        return ok, state

    return policy(f"novelty(tau={tau}{', relative' if relative else ''}"
                  f"{', within_batch' if within_batch else ''})", admit=admit)


@_cached
def capacity(max_rows: int, on_full: str = "reject") -> Policy:
    """Never hold more than ``max_rows`` rows.

    on_full
      ``reject``         Alg. 4: admit only the first candidates (in batch order) that fit;
                         stored rows are never evicted (if a memory starts above the cap,
                         its newest rows past the cap are dropped)
      ``evict_oldest``   admitted candidates always enter (the last ``max_rows`` if a batch
                         alone overflows); the oldest stored rows (smallest ``born``, ties by
                         position) leave to make room — a FIFO window
      ``evict_smallest`` stored rows and admitted candidates compete: the ``max_rows`` with
                         the largest :func:`significance` (``max(|w|, ‖ṽ‖)``) stay; ties go
                         against the older row

    Evicting policies sort the rows in use: ``O(C log C)`` per step.
    """
    _check_number("capacity max_rows", max_rows, lambda x: int(x) == x and x >= 1, "an integer >= 1")
    if on_full not in ON_FULL:
        raise ValueError(f"capacity on_full must be one of {ON_FULL}, got {on_full!r}")
    max_rows = int(max_rows)

    def evict(mem, rows, mask, keep, state):
        valid = keep & memlib.valid_mask(mem)
        if on_full == "reject":
            keep = _first(valid, max_rows)
            room = max_rows - keep.sum(dtype=jnp.int32)
            return keep, _first(mask, room), state
        if on_full == "evict_oldest":
            mask = _last(mask, max_rows)
            n_evict = jnp.maximum(valid.sum(dtype=jnp.int32) + mask.sum(dtype=jnp.int32) - max_rows, 0)
            rank = _rank(mem.born, valid)
            return valid & (rank >= n_evict), mask, state
        # evict_smallest: stored rows first (older), then candidates, in one ranking
        score = jnp.concatenate([significance(mem), candidate_significance(mem, rows)])
        both = jnp.concatenate([valid, mask])
        n_evict = jnp.maximum(both.sum(dtype=jnp.int32) - max_rows, 0)
        stay = both & (_rank(score, both) >= n_evict)
        c = valid.shape[0]
        return stay[:c], stay[c:], state

    return policy(f"capacity(max_rows={max_rows}, on_full={on_full})", evict=evict)


@_cached
def weight_decay(gamma: float, prune_below: Optional[float] = None) -> Policy:
    """Every step scale the stored ``w`` and ``ṽ`` (``v`` for linear/RBF, whose ``w`` is
    unused) by ``(1 − γ)`` (Eq. 21/90); rows appended this step are not scaled.

    ``prune_below=ε`` drops stored rows whose ``|w| < ε`` and ``‖ṽ‖ < ε`` after scaling
    (``‖v‖ < ε`` for linear/RBF). The output change this causes is bounded: for the weighted
    softmax ``‖Δy‖ ≤ ε (1 + ‖y‖) Σ_pruned c_i e^{a_i} / Σ_kept c_i w_i e^{a_i}``, for RBF
    ``‖Δy‖ ≤ ε Σ_pruned c_i``, for linear ``‖Δy‖ ≤ ε ‖q‖ Σ_pruned c_i ‖k_i‖``.

    ``retention = 1 − γ`` (momentum uses it for Eq. 100).
    """
    _check_number("weight_decay gamma", gamma, lambda x: 0 <= x < 1, "a number in [0, 1)")
    if prune_below is not None:
        _check_number("weight_decay prune_below", prune_below, lambda x: x >= 0, "a number >= 0")
    keep_factor = 1.0 - gamma

    def age(mem, state):
        f = jnp.asarray(keep_factor, mem.v.dtype)
        w = mem.w * f if _weighted(mem) else mem.w
        return mem.replace(w=w, v=mem.v * f), state

    def evict(mem, rows, mask, keep, state):
        if prune_below is None:
            return keep, mask, state
        return keep & (significance(mem) >= prune_below), mask, state

    name = f"weight_decay(gamma={gamma}" + (f", prune_below={prune_below})" if prune_below is not None else ")")
    return policy(name, age=age, evict=evict, retention=keep_factor if gamma > 0 else 1.0)


def momentum_coefficients(born, t, mu: float, retention: float = 1.0) -> jax.Array:
    """Timestamp momentum ``c(t, born)`` for stored values that decay by ``retention`` per step.

    ``retention = 1``: Eq. 23/91, ``(1 − μ^{n}) / (1 − μ)`` with ``n = t − born + 1``.
    Otherwise the rows already carry ``(1 − γ)^{t − born}`` and Eq. 100 leaves
    ``(1 − μ̃^{n}) / (1 − μ̃)`` with ``μ̃ = μ / (1 − γ)`` (``n`` when ``μ̃ = 1``).
    Initial rows (``born < 0``) have ``c = 1``.
    """
    from .layers import momentum_coeff  # the Eq. 23 formula lives with the layer

    if retention == 1.0:
        return momentum_coeff(born, t, mu)
    mu_t = mu / retention
    n = jnp.maximum(t - born, 0).astype(jnp.float32) + 1.0
    if mu_t == 1.0:
        c = n
    else:
        c = (1.0 - mu_t ** n) / (1.0 - mu_t)
    # μ̃ > 1: c grows like μ̃^n while the stored row shrinks like (1-γ)^n; cap c so that a
    # row decayed to 0 contributes 0, not inf·0
    c = jnp.minimum(c, 1e30)
    return jnp.where(born < 0, 1.0, c)


@_cached
def momentum(mu: float) -> Policy:
    """Timestamp momentum (Eq. 23/91): retrieval multiplies each row by
    ``c(t, born) = (1 − μ^{t−born+1}) / (1 − μ)``; no velocity buffer is stored.

    Chained with :func:`weight_decay` it gives the closed form of Eq. 100 (decay + momentum
    of Eqs. 92–93): see :func:`momentum_coefficients`. Same as ``GrowingSpec(momentum=μ)``;
    do not set both (their coefficients would multiply).
    """
    _check_number("momentum mu", mu, lambda x: 0 <= x < 1, "a number in [0, 1)")

    def coeff(mem, retention):
        if mu == 0:
            return None
        return momentum_coefficients(mem.born, mem.t, mu, retention)

    return policy(f"momentum(mu={mu})", coeff=coeff)


#: built-in policy factories by name (the TOML presets use these names)
BUILTINS = {"novelty": novelty, "capacity": capacity, "weight_decay": weight_decay, "momentum": momentum}
