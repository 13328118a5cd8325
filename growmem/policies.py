"""Growth and pruning policies: which candidate rows enter a memory, what leaves or fades,
how stored rows are trained, and how they are weighted at retrieval (paper Sec. 3.3, App. A.4,
D, F.4; Alg. 4).

A :class:`Policy` is shaped like an optax transformation: a record of pure functions plus a
little static data, with its state kept by the caller (the trainer keeps each layer's in
``TrainState.policy_state["layer/path"]``). Every stage has **one signature**::

    init(mem)              -> state
    admit(g, state)        -> (g, state)     narrow g.mask: candidates that may enter
    update(g, state)       -> (g, state)     train the stored rows g.mem from g.grads (hybrid, Alg. 4)
    age(g, state)          -> (g, state)     fade the stored rows (weight decay, Eq. 21/90)
    evict(g, state)        -> (g, state)     narrow g.keep (and g.mask): stored rows that stay
    coeff(born, t, retention) -> (N,) or None   per-row retrieval coefficient c_i (row-local:
                                              the same on rows in RAM, on shards and on disk)

``g`` is a :class:`Growth`: the memory ``D_{t-1}`` the forward pass used (``g.mem``), the rule's
``B`` candidate rows (``g.rows``), the candidates still admitted (``g.mask:(B,)``), the stored
rows that stay (``g.keep:(C,)``) and, for a policy that trains rows, ``∂L/∂(w, k, ṽ)`` of the
stored rows (``g.grads``). Static data: ``retention`` (the factor by which ``age`` scales the
stored values each step; 1 = none; momentum needs it for Eq. 100), ``momentum`` (the μ of
Eq. 23/91 this policy contributes), ``trains_rows`` (the trainer must differentiate the rows),
``evicts`` (some stage may drop stored rows) and ``name``.

**Per-row state.** State wrapped in :class:`RowState` follows the rows: its leaves whose
leading axis is the memory's capacity are moved when rows are evicted or compacted, padded
when the capacity grows, and zero for new rows (e.g. the Adam moments of hybrid rows).

**One growth step** (:func:`step`, run by the trainer for every growing layer after the
backward pass):

1. ``admit`` — every policy of a chain in order, each narrowing the mask left by the one
   before; they see ``D_{t-1}`` (Alg. 4 line 9);
2. ``update`` — the optimizer step on the stored rows (Alg. 4 line 10);
3. ``age`` — e.g. weight decay scales the stored rows;
4. ``evict`` — each narrowing ``keep`` (and possibly ``mask``); a pruning policy placed before
   a capacity policy frees room that the capacity policy then counts. Put ``capacity`` last;
5. the evicted rows leave and the admitted candidates enter with ``born = t + 1`` (into the
   evicted rows' places: O(B) rows touched, the table is not copied), ``t += 1``.

``coeff`` of a chain is the product of its members' coefficients; ``retention`` the product
of their retentions. :func:`chain` composes positionally (a tuple state, length-checked),
:func:`named_chain` by name (a dict state, like ``optax.named_chain``).

Writing your own policy takes a few lines (see :func:`policy`)::

    def min_error(threshold):
        '''Admit a candidate only if its value (the scaled error) is large enough.'''
        def admit(g, state):
            big = jnp.linalg.norm(g.rows.v, axis=-1) > threshold
            return g._replace(mask=g.mask & big), state + jnp.sum(g.mask & ~big)
        return policies.policy(f"min_error({threshold})", init=lambda mem: jnp.zeros((), jnp.int32),
                               admit=admit)

    trainer = growmem.Trainer(model, policy=policies.chain(min_error(1e-3), policies.capacity(10_000)))

Policies are passed to the trainer the way an optax ``tx`` is: each trainer compiles its step
once for the policies it was given (two calls of a factory give two policies; nothing is
cached globally).

Costs per step and layer (C rows of capacity, N in use, B candidates): ``novelty`` one
``(B, d)×(d, N)`` product over chunks; ``capacity`` ``reject`` O(C) mask work,
``evict_oldest``/``evict_smallest`` a sort of the C (+B) row scores, then O(B) rows moved;
``weight_decay`` rescales all rows (O(C·d) memory traffic) and pruning reads every row's norm;
``momentum`` O(C) coefficients per retrieval and no velocity buffer; ``hybrid`` the optimizer
over the whole table.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax import lax

from .errors import ConfigError, WrongTypeError
from . import backends, kernels
from . import memory as memlib
from .rules import Rows as _Rows

ON_FULL = ("reject", "evict_oldest", "evict_smallest", "evict_balanced", "merge")
#: rows per chunk of the novelty search (:func:`growmem.kernels.min_sq_distance`)
NOVELTY_CHUNK = kernels.NOVELTY_CHUNK


class Growth(NamedTuple):
    """What flows through the stages of one growth step (module docstring)."""

    mem: memlib.Memory    # stored rows: D_{t-1}, as updated / aged by earlier stages
    rows: Any             # the rule's candidates (growmem.rules.Rows: w (B,), k (B, d_in), v (B, d_out))
    mask: jax.Array       # (B,) candidates still admitted
    keep: jax.Array       # (C,) stored rows that stay (only rows in use ever stay)
    grads: Any = None     # {"w", "k", "v"}: ∂L/∂(stored rows), for policies that train rows
    targets: Any = None   # (B, ...) the batch's targets, one per candidate (None where a layer proposes
                          # several rows per input)
    replayed: Any = None  # (B,) candidates from SelfReplay's rehearsal (copies of stored rows), or None


@struct.dataclass
class RowState:
    """Policy state that follows the rows (module docstring): leaves with a leading axis of
    the memory's capacity are moved, padded and zeroed with the rows."""

    tree: Any


@struct.dataclass
class Labels(RowState):
    """The class label of every stored row (``(C,)`` ints; −1: unknown, e.g. the rows of D0), kept by
    :func:`labels` and ``capacity(on_full="evict_balanced")``; :func:`stored_labels` finds it."""


class Policy(NamedTuple):
    """A growth policy: pure functions plus static data (see the module docstring)."""

    init: Callable
    admit: Callable
    update: Callable
    age: Callable
    evict: Callable
    coeff: Callable
    retention: float = 1.0
    momentum: float = 0.0
    trains_rows: bool = False
    evicts: bool = False
    name: str = "policy"
    max_rows: Optional[int] = None
    #: ``enter(g, state) -> [(B, ...) or None per per-row leaf]``: the candidates' entries of the policy's
    #: per-row state (:func:`row_state_leaves` order); None: zeros
    enter: Optional[Callable] = None
    #: ``age`` decides at run time how much the stored rows fade (no static ``retention``)
    dynamic_age: bool = False

    def __repr__(self):
        return self.name


def _init_none(mem):
    return ()


def _pass(g, state):
    return g, state


def _coeff_none(born, t, retention):
    return None


def policy(name: str = "custom", *, init: Optional[Callable] = None, admit: Optional[Callable] = None,
           update: Optional[Callable] = None, age: Optional[Callable] = None, evict: Optional[Callable] = None,
           coeff: Optional[Callable] = None, retention: float = 1.0, momentum: float = 0.0,
           trains_rows: bool = False, enter: Optional[Callable] = None) -> Policy:
    """Build a :class:`Policy`; the stages you leave out do nothing (state ``()``). ``enter(g, state)``:
    the per-row state of the admitted candidates (see :class:`Policy`; default zeros)."""
    if not 0.0 < retention <= 1.0:
        raise ConfigError(f"retention must be in (0, 1], got {retention}")
    if not 0.0 <= momentum < 1.0:
        raise ConfigError(f"momentum μ must be in [0, 1), got {momentum}")
    if trains_rows and update is None:
        raise ConfigError(f"policy {name}: trains_rows=True needs an update stage")
    return Policy(init=init or _init_none, admit=admit or _pass, update=update or _pass, age=age or _pass,
                  evict=evict or _pass, coeff=coeff or _coeff_none, retention=float(retention),
                  momentum=float(momentum), trains_rows=bool(trains_rows), evicts=evict is not None, name=name,
                  enter=enter)


def identity() -> Policy:
    """The policy that admits every candidate and never evicts (plain growth)."""
    return policy("identity")


# ---------------------------------------------------------------------------------------------
# composition


def _check_policies(policies):
    for p in policies:
        if not isinstance(p, Policy):
            raise WrongTypeError(f"chain() takes Policy objects, got {type(p).__name__}: {p!r}")
    mus = [p.momentum for p in policies if p.momentum]
    if len(mus) > 1:
        raise ConfigError(f"momentum is set {len(mus)} times in one chain ({mus}): their coefficients would "
                          f"multiply; keep one momentum(μ)")
    trainers = [p.name for p in policies if p.trains_rows]
    if len(trainers) > 1:
        raise ConfigError(f"more than one policy trains the stored rows ({trainers}); keep one")
    if mus and any(p.dynamic_age for p in policies):
        raise ConfigError("momentum needs the static retention of its chain (Eq. 100), which a policy that fades "
                          "rows at run time (drift_discount) does not have; drop one of them")


def _compose(name, policies, pack, unpack, check) -> Policy:
    """A chain over ``policies`` whose state is ``pack([s1, s2, ...])``."""
    _check_policies(policies)
    retention = math.prod(p.retention for p in policies) if policies else 1.0

    def init(mem):
        return pack([p.init(mem) for p in policies])

    def stage(which):
        def run(g, state):
            states = unpack(check(state))
            out = []
            for p, s in zip(policies, states):
                g, s = getattr(p, which)(g, s)
                out.append(s)
            return g, pack(out)
        return run

    def coeff(born, t, retention):
        c = None
        for p in policies:
            ci = p.coeff(born, t, retention)
            if ci is not None:
                c = ci if c is None else c * ci
        return c

    def enter(g, state):
        return [n for p, s in zip(policies, unpack(check(state))) for n in entering(p, g, s)]

    caps = [p.max_rows for p in policies if p.max_rows is not None]
    return Policy(init, stage("admit"), stage("update"), stage("age"), stage("evict"), coeff, retention,
                  momentum=sum(p.momentum for p in policies), trains_rows=any(p.trains_rows for p in policies),
                  evicts=any(p.evicts for p in policies), name=name, max_rows=min(caps) if caps else None,
                  enter=enter if any(p.enter is not None for p in policies) else None,
                  dynamic_age=any(p.dynamic_age for p in policies))


def chain(*policies: Policy) -> Policy:
    """Compose policies: every stage runs each member in the order given (module docstring).

    The state is a tuple, one entry per member (checked at every stage: a state of another
    length raises). Coefficients multiply, retentions multiply.
    """
    n = len(policies)
    _check_policies(policies)

    def check(state):
        if not isinstance(state, tuple) or len(state) != n:
            got = f"a {type(state).__name__} of length {len(state)}" if isinstance(state, (tuple, list)) \
                else type(state).__name__
            raise ConfigError(f"chain of {n} policies got {got} as its state; pass the state its init made")
        return state

    return _compose("chain(" + ", ".join(p.name for p in policies) + ")", policies, tuple, lambda s: s, check)


def named_chain(*named: tuple) -> Policy:
    """Like :func:`chain`, with ``(name, policy)`` pairs and a dict state keyed by name
    (``trainer.state.policy_state["readout"]["cap"]``)."""
    names = [n for n, _ in named]
    if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"named_chain needs distinct string names, got {names}")
    policies = tuple(p for _, p in named)
    _check_policies(policies)

    def check(state):
        if not isinstance(state, dict) or set(state) != set(names):
            raise ConfigError(f"named_chain of {names} got a state with keys "
                              f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
        return state

    return _compose("named_chain(" + ", ".join(f"{n}={p.name}" for n, p in named) + ")", policies,
                    lambda states: dict(zip(names, states)), lambda s: [s[n] for n in names], check)


# ---------------------------------------------------------------------------------------------
# per-row state


def _is_row_state(x) -> bool:
    return isinstance(x, RowState)


def map_row_state(fn, state, capacity: int):
    """Apply ``fn`` to every per-row leaf (leading axis ``capacity``) inside a :class:`RowState`."""
    def on_rows(node):
        if not isinstance(node, RowState):
            return node
        return type(node)(jax.tree.map(lambda a: fn(a) if getattr(a, "ndim", 0) >= 1 and a.shape[0] == capacity
                                       else a, node.tree))

    return jax.tree.map(on_rows, state, is_leaf=_is_row_state)


def row_state_leaves(state, capacity: int) -> list:
    """The per-row leaves of ``state`` (in a fixed order)."""
    out = []
    map_row_state(lambda a: out.append(a) or a, state, capacity)
    return out


def replace_row_state_leaves(state, capacity: int, leaves: list):
    it = iter(leaves)
    return map_row_state(lambda a: next(it), state, capacity)


def entering(pol: Policy, g: "Growth", state) -> list:
    """The candidates' entries of ``pol``'s per-row state, one per :func:`row_state_leaves` leaf (None:
    zeros)."""
    if pol.enter is None:
        return [None] * len(row_state_leaves(state, g.mem.capacity))
    return list(pol.enter(g, state))


def stored_labels(state) -> Optional[jax.Array]:
    """The ``(C,)`` row labels a layer's policy state keeps (:class:`Labels`), or None."""
    found = []
    jax.tree.map(lambda x: found.append(x.tree) if isinstance(x, Labels) else None, state,
                 is_leaf=lambda x: isinstance(x, Labels))
    return found[0] if found else None


def resize_row_state(state, old: int, new: int):
    """Pad (or cut) the per-row state from ``old`` to ``new`` rows (host: capacity growth)."""
    return map_row_state(lambda a: memlib.pad_rows_to(a, new), state, old)


# ---------------------------------------------------------------------------------------------
# one growth step


def evictor(pol: Optional[Policy], state) -> Optional[Callable]:
    """``keep(chunk) -> (C,) bool``: ``pol``'s evict stage over a chunk of stored rows (a
    :class:`growmem.memory.Memory`; no candidates) — pruning rows a backend keeps off the
    device (:meth:`growmem.backends.tiered.Tiered.compact`). None when nothing evicts."""
    if pol is None or not pol.evicts:
        return None

    def keep(chunk):
        b = 1
        dummy = _Rows(jnp.zeros((b,), jnp.float32), jnp.zeros((b, chunk.d_in), chunk.k.dtype),
                      jnp.zeros((b, chunk.d_out), chunk.v.dtype))
        g = Growth(chunk, dummy, jnp.zeros((b,), bool), memlib.valid_mask(chunk))
        g, _ = pol.evict(g, state)
        return np.asarray(g.keep)

    return keep


class StepResult(NamedTuple):
    mem: memlib.Memory     # the memory after the step (clock advanced)
    state: Any             # the policy state after the step
    keep: jax.Array        # (C,) stored rows (of the memory before the step) that stayed
    mask: jax.Array        # (B,) candidates that were appended


def step(pol: Policy, mem: memlib.Memory, rows, state, *, grads=None, mask=None, targets=None,
         replayed=None) -> StepResult:
    """One growth step of one memory (module docstring, steps 1–5). Pure and jittable.

    ``mask:(B,)`` the candidates on offer (all by default; the trainer withholds rows that are
    not finite); ``targets``: the batch's targets, one per candidate (for :func:`labels`);
    ``replayed:(B,)`` the candidates that rehearse stored rows (:class:`growmem.train.SelfReplay`'s)."""
    if pol.trains_rows and grads is None:
        raise ConfigError(f"policy {pol.name} trains the stored rows: step() needs grads (∂L/∂w, ∂L/∂k, ∂L/∂ṽ "
                          f"of the stored rows; the Trainer provides them)")
    born = mem.t + 1
    be = backends.of(mem)
    valid = be.valid_mask(mem)
    offered = jnp.ones((rows.k.shape[0],), bool) if mask is None else jnp.asarray(mask, bool)
    g = Growth(mem, rows, offered, valid, grads, targets, replayed)
    g, state = pol.admit(g, state)
    g, state = pol.update(g, state)
    g, state = pol.age(g, state)
    g, state = pol.evict(g, state)
    keep = g.keep & valid
    mem = g.mem
    news = entering(pol, g, state)
    if not pol.evicts and all(n is None for n in news):
        out = be.append(mem, rows.w, rows.k, rows.v, born, g.mask)
        return StepResult(out.replace(t=born), state, keep, g.mask)
    per_row = row_state_leaves(state, mem.capacity)
    kw = {"extra_new": news} if any(n is not None for n in news) else {}
    out, per_row = be.evict_and_append(mem, keep, rows.w, rows.k, rows.v, born, g.mask, extra=per_row, **kw)
    state = replace_row_state_leaves(state, mem.capacity, per_row)
    return StepResult(out.replace(t=born), state, keep, g.mask)


# ---------------------------------------------------------------------------------------------
# helpers


def _weighted(mem) -> bool:
    """Does the kernel use ``w`` (weighted softmax)? Memories without a spec count as weighted."""
    return mem.spec is None or kernels.get(mem.spec.kernel).normalised


def _norm(v):
    return jnp.linalg.norm(v.astype(jnp.float32), axis=-1)


def significance(mem: memlib.Memory) -> jax.Array:
    """``(C,)`` size of each stored row: ``max(|w|, ‖ṽ‖)`` (weighted softmax) or ``‖v‖``.

    A row is below ε exactly when ``|w| < ε`` and ``‖ṽ‖ < ε`` (the pruning rule of App. D.1).
    """
    vn = _norm(mem.v)
    return jnp.maximum(jnp.abs(mem.w), vn) if _weighted(mem) else vn


def candidate_significance(mem: memlib.Memory, rows) -> jax.Array:
    vn = _norm(rows.v)
    return jnp.maximum(jnp.abs(rows.w), vn) if _weighted(mem) else vn


def min_sq_distance(q, k, *, size=None, chunk: int = NOVELTY_CHUNK) -> jax.Array:
    """``(B,)`` ``min_j ‖q_b − k_j‖²`` over rows ``j < size`` (:func:`growmem.kernels.min_sq_distance`)."""
    return kernels.min_sq_distance(q, k, size=size, chunk=chunk)


def _first(mask, n):
    """Keep the first ``n`` True entries of ``mask``."""
    return mask & (jnp.cumsum(mask.astype(jnp.int32)) <= n)


def _last(mask, n):
    """Keep the last ``n`` True entries of ``mask``."""
    after = jnp.cumsum(mask[::-1].astype(jnp.int32))[::-1]  # True entries at or after i
    return mask & (after <= n)


def _rank(score, valid, order_key=None):
    """Rank of each valid entry in ascending ``score`` (ties by ``order_key``, then position);
    invalid entries last."""
    s = jnp.where(valid, score, jnp.inf)
    if order_key is None:
        order = jnp.argsort(s, stable=True)
    else:
        order = jnp.lexsort((order_key, s))
    return jnp.zeros(score.shape, jnp.int32).at[order].set(jnp.arange(score.shape[0], dtype=jnp.int32))


def _smallest(score, valid, n, k: int, order_key=None):
    """``(C,)`` bool: the ``n`` valid entries of lowest ``score`` (ties by ``order_key``, then
    position) — ``_rank(score, valid, order_key) < n`` without sorting all C entries when it
    can: ``top_k`` finds the n-th smallest score τ (``n <= k``); when exactly n entries are
    ``<= τ`` they are the answer, under any tie rule. Otherwise (ties at τ to break, or a memory
    far above its cap) all C entries are sorted. ``top_k`` runs on float32 keys (XLA's CPU
    ``top_k`` sorts integers): rounding is monotone, so the test stays exact."""
    c = score.shape[0]
    k = max(1, min(int(k), c))
    s = jnp.where(valid, jnp.asarray(score, jnp.float32), jnp.inf)
    # the n-th smallest score, the largest of the n first top_k picks: read another way (the values
    # alone, or one element) XLA turns top_k back into a sort of all C entries
    low = s[lax.top_k(-s, k)[1]]
    tau = jnp.max(jnp.where(jnp.arange(k) < n, low, -jnp.inf))
    upto = valid & (s <= tau)                                     # none when n = 0 (τ = −inf)
    easy = (n <= k) & (upto.sum(dtype=jnp.int32) == n)
    return lax.cond(easy, lambda: upto, lambda: valid & (_rank(score, valid, order_key) < n))


def _check_number(name, value, ok, allowed):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# built-in policies


def novelty(tau: float, *, relative: bool = False, within_batch: bool = False, admit_replayed: bool = False,
            chunk: int = NOVELTY_CHUNK) -> Policy:
    """Admit a candidate only if ``min_j ‖q − k_j‖₂ > τ`` over the stored rows (Alg. 4 line 9).

    relative      τ is given in units of ``‖q‖ = √d_in`` (RMS-normalised queries, F.4):
                  the threshold is ``τ·√d_in``
    within_batch  False (the paper): candidates are compared with the rows stored before
                  the step only, so two near-identical queries of one batch both enter.
                  True: candidates are also compared, in batch order, with the candidates
                  of the same batch admitted before them (greedy), so no two admitted rows
                  are within τ of each other.
    admit_replayed  False (the paper): every candidate is tested. True: a candidate that
                  rehearses a stored row (:class:`growmem.train.SelfReplay`'s samples, marked
                  ``Growth.replayed``) enters untested — it is a copy of a stored key, at
                  distance 0, so the test would refuse every rehearsal; the stream's
                  samples are still tested.
    chunk         rows per chunk of the distance search

    The search runs wherever the rows live (in RAM, on every shard, over a disk tier: the
    memory's backend). Candidates already refused by an earlier policy do not block later
    ones. Cost per step: one ``(B, d) × (d, N)`` product and the keys' squared norms.
    """
    _check_number("novelty tau", tau, lambda x: x >= 0, "a number >= 0")
    if chunk <= 0:
        raise ConfigError(f"novelty chunk must be positive, got {chunk}")

    def admit(g, state):
        q = g.rows.k
        thr = tau * math.sqrt(q.shape[1]) if relative else tau
        thr2 = jnp.asarray(thr * thr, q.dtype)
        d2 = backends.min_sq_distance(g.mem, q, chunk=chunk)
        # rehearsals that enter untested (admit_replayed), none otherwise
        free = g.replayed if (admit_replayed and g.replayed is not None) else jnp.zeros_like(g.mask)
        ok = g.mask & ((d2 > thr2) | free)
        if within_batch:
            q2 = jnp.sum(q * q, axis=1)
            near = (q2[:, None] + q2[None, :] - 2.0 * (q @ q.T)) <= thr2   # (B, B)

            def body(n, adm):
                earlier = jnp.arange(q.shape[0]) < n
                blocked = jnp.any(adm & earlier & near[n])
                return adm.at[n].set(ok[n] & (~blocked | free[n]))

            ok = lax.fori_loop(0, q.shape[0], body, jnp.zeros_like(ok))
        return g._replace(mask=ok), state

    return policy(f"novelty(tau={tau}{', relative' if relative else ''}"
                  f"{', within_batch' if within_batch else ''}{', admit_replayed' if admit_replayed else ''})",
                  admit=admit)


def _label_dtype(n_classes: int):
    return jnp.int8 if n_classes <= 127 else jnp.int16 if n_classes <= 32767 else jnp.int32


def _labels_init(n_classes: int):
    def init(mem):
        return Labels(jnp.full((mem.capacity,), -1, _label_dtype(n_classes)))
    return init


def _labels_enter(name: str, n_classes: int):
    def enter(g, state):
        if g.targets is None or jnp.ndim(g.targets) != 1 or not jnp.issubdtype(jnp.asarray(g.targets).dtype,
                                                                                  jnp.integer):
            raise ConfigError(f"{name} keeps each row's class label: it needs integer class targets, one per "
                              f"candidate row (a cross-entropy loss, a layer with one row per input)")
        return [jnp.asarray(g.targets).astype(_label_dtype(n_classes))]
    return enter


def _balanced_evictions(labels, born, valid, targets, mask, n_evict, n_classes: int):
    """``(C,)`` bool: ``n_evict`` stored rows to drop so that the classes end as even as they can — one at
    a time from the class holding the most rows (stored and admitted; unlabelled rows count as a class of
    their own), the oldest rows of each class first."""
    k = n_classes + 1                                   # class c at index c + 1; index 0: unlabelled (−1)
    lab = jnp.clip(labels.astype(jnp.int32), -1, n_classes - 1) + 1
    counts = jnp.zeros((k,), jnp.int32).at[lab].add(valid.astype(jnp.int32))
    stored = counts
    if targets is not None:
        counts = counts.at[jnp.clip(jnp.asarray(targets, jnp.int32), -1, n_classes - 1) + 1].add(
            mask.astype(jnp.int32))

    def take_one(i, carry):                             # quota: evict from the largest class with stored rows
        counts, quota = carry
        c = jnp.argmax(jnp.where(quota < stored, counts, -1))
        live = i < n_evict
        return counts.at[c].add(-live.astype(jnp.int32)), quota.at[c].add(live.astype(jnp.int32))

    _, quota = lax.fori_loop(0, mask.shape[0], take_one, (counts, jnp.zeros((k,), jnp.int32)))
    # each row's age rank within its class: sort by (class, born), invalid rows last
    key_lab = jnp.where(valid, lab, k)
    order = jnp.lexsort((born, key_lab))
    sorted_lab = key_lab[order]
    start = jnp.searchsorted(sorted_lab, jnp.arange(k + 1, dtype=sorted_lab.dtype))
    rank = jnp.zeros_like(born).at[order].set(jnp.arange(born.shape[0], dtype=born.dtype) -
                                              start[sorted_lab].astype(born.dtype))
    return valid & (rank < jnp.where(valid, quota[jnp.minimum(key_lab, k - 1)], 0))


def labels(n_classes: int = 127) -> Policy:
    """Keep the class label of every row (its sample's target) as per-row state (:class:`Labels`; 1 byte a
    row for up to 127 classes), so rows can be told apart by class: a growing network's self-replay
    (:class:`growmem.train.SelfReplay`) replays the inputs its first layer stores, with their labels.
    Rows of D0 have label −1."""
    _check_number("labels n_classes", n_classes, lambda x: int(x) == x and x >= 1, "an integer >= 1")
    name = f"labels(n_classes={int(n_classes)})"
    return policy(name, init=_labels_init(int(n_classes)), enter=_labels_enter(name, int(n_classes)))


def capacity(max_rows: int, on_full: str = "reject", n_classes: int = 127) -> Policy:
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
      ``evict_balanced`` like ``evict_oldest``, but the rows that leave are the oldest of the class
                         holding the most rows (each row's class is kept, as :func:`labels`
                         keeps it, for up to ``n_classes`` classes): a class-balanced memory
                         that forgets no class first
      ``merge``          the rows ``evict_balanced`` picks are not thrown away: each is folded into
                         the nearest staying row of its class (:func:`absorb`: weighted means of
                         key and value, weights added), so a full memory's rows become
                         prototypes of what it saw; a row whose class has no other row leaves

    Evicting modes rank the rows in use (a sort of C scores) and then move only the rows that
    change: the candidates take the evicted rows' places.
    """
    _check_number("capacity max_rows", max_rows, lambda x: int(x) == x and x >= 1, "an integer >= 1")
    if on_full not in ON_FULL:
        raise ConfigError(f"capacity on_full must be one of {ON_FULL}, got {on_full!r}")
    max_rows = int(max_rows)

    def evict(g, state):
        mem, mask = g.mem, g.mask
        valid = g.keep & backends.valid_mask(mem)
        if on_full == "reject":
            keep = _first(valid, max_rows)
            room = max_rows - keep.sum(dtype=jnp.int32)
            return g._replace(keep=keep, mask=_first(mask, room)), state
        if on_full in ("evict_oldest", "evict_balanced", "merge"):
            mask = _last(mask, max_rows)
            n_evict = jnp.maximum(valid.sum(dtype=jnp.int32) + mask.sum(dtype=jnp.int32) - max_rows, 0)
            if on_full == "evict_oldest":
                out = _smallest(mem.born, valid, n_evict, mask.shape[0])
            else:
                out = _balanced_evictions(state.tree, mem.born, valid, g.targets, mask, n_evict, int(n_classes))
            if on_full == "merge":
                mem = absorb(mem, out, valid & ~out, state.tree, mask.shape[0])
            return g._replace(mem=mem, keep=valid & ~out, mask=mask), state
        # evict_smallest: stored rows (older, by born) and then candidates, in one ranking
        c = valid.shape[0]
        score = jnp.concatenate([significance(mem), candidate_significance(mem, g.rows)])
        both = jnp.concatenate([valid, mask])
        age_key = jnp.concatenate([mem.born, jnp.full(mask.shape, jnp.iinfo(jnp.int32).max, jnp.int32)])
        n_evict = jnp.maximum(both.sum(dtype=jnp.int32) - max_rows, 0)
        stay = both & ~_smallest(score, both, n_evict, mask.shape[0], age_key)
        return g._replace(keep=stay[:c], mask=stay[c:]), state

    name = f"capacity(max_rows={max_rows}, on_full={on_full})"
    if on_full in ("evict_balanced", "merge"):
        _check_number("capacity n_classes", n_classes, lambda x: int(x) == x and x >= 1, "an integer >= 1")
        return policy(name, init=_labels_init(int(n_classes)), evict=evict,
                      enter=_labels_enter(name, int(n_classes)))._replace(max_rows=max_rows)
    return policy(name, evict=evict)._replace(max_rows=max_rows)


def absorb(mem: memlib.Memory, gone, stay, labels, most: int) -> memlib.Memory:
    """``mem`` with each row of ``gone`` (at most ``most`` of them; ``(C,)`` bool) folded into the nearest
    row of ``stay`` with the same label (squared key distance; ``labels`` ``(C,)``, −1 never matches).

    Weighted softmax (the kernel normalises by ``Σ w e^a``): the row ``j`` that absorbs rows ``e`` becomes
    ``w_j + Σ w_e``, with ``k`` and ``ṽ`` the ``w``-weighted means, so the numerator ``Σ w e^a ṽ`` and the
    denominator ``Σ w e^a`` keep their value to first order in the key distance (and exactly where the keys
    are equal). Unnormalised kernels (RBF, linear: ``w`` unused): the values add, the key is the mean weighted
    by ``‖v‖``. A row with no staying row of its class is not folded (it leaves). Only the absorbing rows
    change; pure and jittable."""
    c = gone.shape[0]
    idx = jnp.nonzero(gone, size=int(most), fill_value=c)[0]
    live = idx < c
    e = jnp.minimum(idx, c - 1)
    k32 = mem.k.astype(jnp.float32)
    ke = k32[e]
    d2 = (jnp.sum(ke * ke, -1)[:, None] - 2.0 * ke @ k32.T + jnp.sum(k32 * k32, -1)[None, :])
    lab = jnp.asarray(labels, jnp.int32)
    ok = stay[None, :] & (lab[None, :] == lab[e][:, None]) & (lab[e][:, None] >= 0)
    d2 = jnp.where(ok, d2, jnp.inf)
    j = jnp.argmin(d2, axis=1)
    has = live & jnp.any(ok, axis=1)
    weighted = _weighted(mem)
    a = jnp.where(has, jnp.maximum(mem.w[e], 0.0) if weighted else _norm(mem.v[e]), 0.0)      # (n,) weights
    base = jnp.maximum(mem.w, 0.0) if weighted else _norm(mem.v)
    total = base.at[j].add(a)
    touched = jnp.zeros((c,), bool).at[j].max(has) & (total > 0)

    def mean(x):                                           # w-weighted mean of the absorbing rows and theirs
        x32 = x.astype(jnp.float32)
        s = (base[:, None] * x32).at[j].add(a[:, None] * x32[e])
        return jnp.where(touched[:, None], s / jnp.where(total > 0, total, 1.0)[:, None], x32).astype(x.dtype)

    k = mean(mem.k)
    if weighted:
        return mem.replace(w=jnp.where(touched, total, mem.w).astype(mem.w.dtype), k=k, v=mean(mem.v))
    v = mem.v.astype(jnp.float32).at[j].add(jnp.where(has[:, None], mem.v[e].astype(jnp.float32), 0.0))
    return mem.replace(k=k, v=jnp.where(touched[:, None], v, mem.v.astype(jnp.float32)).astype(mem.v.dtype))


def weight_decay(gamma: float, prune_below: Optional[float] = None) -> Policy:
    """Every step scale the stored ``w`` and ``ṽ`` (``v`` for linear/RBF, whose ``w`` is
    unused) by ``(1 − γ)`` (Eq. 21/90); rows appended this step are not scaled.

    ``prune_below=ε`` drops stored rows whose ``|w| < ε`` and ``‖ṽ‖ < ε`` after scaling
    (``‖v‖ < ε`` for linear/RBF). The output change this causes is bounded: for the weighted
    softmax ``‖Δy‖ ≤ ε (1 + ‖y‖) Σ_pruned c_i e^{a_i} / Σ_kept c_i w_i e^{a_i}``, for RBF
    ``‖Δy‖ ≤ ε Σ_pruned c_i``, for linear ``‖Δy‖ ≤ ε ‖q‖ Σ_pruned c_i ‖k_i‖``.

    ``retention = 1 − γ`` (momentum uses it for Eq. 100). Rows stored in bfloat16 are refused:
    rounding each step's ``(1 − γ)`` scaling to bfloat16 would not decay them at rate γ.
    """
    _check_number("weight_decay gamma", gamma, lambda x: 0 <= x < 1, "a number in [0, 1)")
    if prune_below is not None:
        _check_number("weight_decay prune_below", prune_below, lambda x: x >= 0, "a number >= 0")
    keep_factor = 1.0 - gamma

    def age(g, state):
        mem = g.mem
        if gamma > 0 and mem.v.dtype != jnp.float32:
            raise ConfigError(f"weight_decay({gamma}) scales the stored values every step, which rows stored in "
                              f"{mem.v.dtype} cannot represent; use row_dtype='float32' for this layer")
        f = jnp.asarray(keep_factor, mem.v.dtype)
        w = mem.w * jnp.asarray(keep_factor, mem.w.dtype) if _weighted(mem) else mem.w
        return g._replace(mem=mem.replace(w=w, v=mem.v * f)), state

    def evict(g, state):
        return g._replace(keep=g.keep & (significance(g.mem) >= prune_below)), state

    name = f"weight_decay(gamma={gamma}" + (f", prune_below={prune_below})" if prune_below is not None else ")")
    return policy(name, age=age, evict=evict if prune_below is not None else None,
                  retention=keep_factor if gamma > 0 else 1.0)


class DriftState(NamedTuple):
    """:func:`drift_discount`'s detector: running means of the candidates' error (fast, slow), steps seen,
    the step of the last onset, whether the detector is raised, and how many onsets it saw."""

    fast: jax.Array
    slow: jax.Array
    steps: jax.Array
    last: jax.Array
    raised: jax.Array
    fired: jax.Array


def drift_discount(factor: float = 1.0, threshold: float = 0.5, *, gamma: float = 0.0, fast: float = 0.1,
                   slow: float = 0.01, warmup: int = 50, cooldown: int = 100) -> Policy:
    """Forget when the world changes, not otherwise: a drift detector on the prequential error gates how
    much the stored rows fade.

    The candidates' values carry the error the model made on the batch before learning from it
    (``ṽ = −βg``, ``v = −ηg``): their mean norm ``e_t`` is a prequential error signal. Two running means
    follow it (rates ``fast`` and ``slow``); the detector is *raised* while the fast one exceeds the slow one
    by more than ``threshold`` (relative), from ``warmup`` steps on. While raised, every stored row's ``w``
    and ``ṽ`` are scaled by ``1 − gamma`` each step (weight decay, Eq. 21/90, at a rate the measured change
    decides); at an onset (raised now, not before, ``cooldown`` steps after the last) they are also scaled
    once by ``factor`` and — when ``factor < 1`` — the slow mean restarts from the fast one. The rows learnt
    since dominate where they exist; older rows still answer where nothing newer is. With a falling error
    (no drift) nothing happens and the policy changes nothing.

    The fading is decided at run time, so it has no static ``retention``: it is refused with momentum and on
    a cold tier (``dynamic_age``)."""
    _check_number("drift_discount factor", factor, lambda x: 0 < x <= 1, "a number in (0, 1]")
    _check_number("drift_discount gamma", gamma, lambda x: 0 <= x < 1, "a number in [0, 1)")
    if factor == 1 and gamma == 0:
        raise ConfigError("drift_discount does nothing with factor = 1 and gamma = 0: set a discount factor < 1, a "
                          "decay rate gamma > 0, or both")
    _check_number("drift_discount threshold", threshold, lambda x: x > 0, "a number > 0")
    for n, v in (("fast", fast), ("slow", slow)):
        _check_number(f"drift_discount {n}", v, lambda x: 0 < x <= 1, "a number in (0, 1]")
    if not slow < fast:
        raise ConfigError(f"drift_discount needs slow < fast (the slow mean is the baseline), got fast={fast}, "
                          f"slow={slow}")
    for n, v in (("warmup", warmup), ("cooldown", cooldown)):
        _check_number(f"drift_discount {n}", v, lambda x: int(x) == x and x >= 0, "an integer >= 0")

    def init(mem):   # distinct buffers: the trainer donates the state
        return DriftState(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                          jnp.full((), -10 ** 6, jnp.int32), jnp.zeros((), bool), jnp.zeros((), jnp.int32))

    def age(g, state):
        mem = g.mem
        if mem.v.dtype != jnp.float32:
            raise ConfigError("drift_discount scales the stored values, which rows stored in "
                              f"{mem.v.dtype} cannot represent exactly; use row_dtype='float32' for this layer")
        n = jnp.maximum(g.mask.sum(dtype=jnp.int32), 1)
        e = jnp.sum(jnp.where(g.mask, _norm(g.rows.v), 0.0)) / n
        first = state.steps == 0
        f = jnp.where(first, e, (1 - fast) * state.fast + fast * e)
        sl = jnp.where(first, e, (1 - slow) * state.slow + slow * e)
        raised = (state.steps >= warmup) & (f > sl * (1 + threshold))
        onset = raised & ~state.raised & (state.steps - state.last >= cooldown)
        scale = jnp.where(raised, jnp.float32(1 - gamma), jnp.float32(1.0)) * \
            jnp.where(onset, jnp.float32(factor), jnp.float32(1.0))
        w = mem.w * scale if _weighted(mem) else mem.w
        mem = mem.replace(w=w, v=mem.v * scale.astype(mem.v.dtype))
        restart = onset & (factor < 1)
        state = DriftState(f, jnp.where(restart, f, sl), state.steps + 1, jnp.where(onset, state.steps, state.last),
                           raised & ~restart, state.fired + onset.astype(jnp.int32))
        return g._replace(mem=mem), state

    name = f"drift_discount(factor={factor}, threshold={threshold}, gamma={gamma})"
    return policy(name, init=init, age=age)._replace(dynamic_age=True)


def momentum_coefficients(born, t, mu: float, retention: float = 1.0) -> jax.Array:
    """Timestamp momentum ``c(t, born)`` for stored values that decay by ``retention`` per step.

    ``retention = 1``: Eq. 23/91, ``(1 − μ^{n}) / (1 − μ)`` with ``n = t − born + 1``.
    Otherwise the rows already carry ``(1 − γ)^{t − born}`` and Eq. 100 leaves
    ``(1 − μ̃^{n}) / (1 − μ̃)`` with ``μ̃ = μ / (1 − γ)`` (``n`` when ``μ̃ = 1``).
    Initial rows (``born < 0``) have ``c = 1``.
    """
    n = jnp.maximum(t - born, 0).astype(jnp.float32) + 1.0
    mu_t = mu / retention
    if mu_t == 1.0:
        c = n
    else:
        c = (1.0 - mu_t ** n) / (1.0 - mu_t)
    if retention != 1.0:
        # μ̃ > 1: c grows like μ̃^n while the stored row shrinks like (1-γ)^n; cap c so that a
        # row decayed to 0 contributes 0, not inf·0
        c = jnp.minimum(c, 1e30)
    return jnp.where(born < 0, 1.0, c)


def momentum(mu: float) -> Policy:
    """Timestamp momentum (Eq. 23/91): retrieval multiplies each row by
    ``c(t, born) = (1 − μ^{t−born+1}) / (1 − μ)``; no velocity buffer is stored.

    Chained with :func:`weight_decay` it gives the closed form of Eq. 100 (decay + momentum
    of Eqs. 92–93): see :func:`momentum_coefficients`. Same as ``GrowingSpec(momentum=μ)``;
    setting both is an error (their coefficients would multiply).
    """
    _check_number("momentum mu", mu, lambda x: 0 <= x < 1, "a number in [0, 1)")
    return policy(f"momentum(mu={mu})", momentum=float(mu))


def coefficient_fn(spec, pol: Optional[Policy]) -> Optional[Callable]:
    """``fn(born, t) -> c_i`` of a layer: its momentum (the spec's or the policy's, Eq. 23/91,
    with the policy's decay: Eq. 100) times the policy's own ``coeff``; None when every
    ``c_i = 1``."""
    mu_spec = float(getattr(spec, "momentum", 0.0) or 0.0)
    mu_pol = pol.momentum if pol is not None else 0.0
    if mu_spec and mu_pol:
        raise ConfigError(f"momentum is set twice: GrowingSpec(momentum={mu_spec}) and policy {pol.name} "
                          f"(μ = {mu_pol}); their coefficients would multiply — set it in one place")
    mu = mu_spec or mu_pol
    retention = pol.retention if pol is not None else 1.0
    custom = pol is not None and pol.coeff is not _coeff_none
    if not mu and not custom:
        return None

    def fn(born, t):
        c = momentum_coefficients(born, t, mu, retention) if mu else None
        if custom:
            ci = pol.coeff(born, t, retention)
            if ci is not None:
                c = ci if c is None else c * ci
        return c

    return fn


def hybrid(tx: Optional[optax.GradientTransformation] = None) -> Policy:
    """Alg. 4 line 10: the stored rows ``(w, k, ṽ)`` are trained by ``tx`` (Adam 1e-3 by default)
    from the same backward pass that gives ``g``; ``w`` is projected back to ``w ≥ 0`` after
    every step (weighted softmax). Its state is the optimizer state of the rows (a
    :class:`RowState`: moments follow their rows, new rows start at zero)."""
    tx = optax.adam(1e-3) if tx is None else tx

    def params(mem):
        return {"w": mem.w, "k": mem.k, "v": mem.v}

    def init(mem):
        if mem.k.dtype != jnp.float32:
            raise ConfigError(f"hybrid rows are trained by an optimizer and must be float32, not {mem.k.dtype}")
        return RowState(tx.init(params(mem)))

    def update(g, state):
        mem = g.mem
        p = params(mem)

        def train():
            updates, opt = tx.update(g.grads, state.tree, p)
            new = optax.apply_updates(p, updates)
            new["w"] = jnp.maximum(new["w"], 0.0) if _weighted(mem) else new["w"]   # projected step: den > 0
            return new, opt

        # a step whose gradients are not finite (a NaN input) trains nothing: rows and moments stay.
        # A cond, not a select of old and new: the select keeps the old moments alive past the
        # update and XLA copies every (C, d) moment on every step to do so
        ok = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(g.grads)]))
        new, opt = lax.cond(ok, train, lambda: (p, state.tree))
        return g._replace(mem=mem.replace(w=new["w"], k=new["k"], v=new["v"])), RowState(opt)

    return policy("hybrid", init=init, update=update, trains_rows=True)


#: built-in policy factories by name (the TOML presets use these names)
BUILTINS = {"novelty": novelty, "capacity": capacity, "weight_decay": weight_decay, "momentum": momentum,
            "labels": labels, "drift_discount": drift_discount}
