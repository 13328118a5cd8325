"""Training past the RAM budget: a growing layer's oldest rows spill to a TensorStore tier.

:meth:`growmem.Trainer.enable_spill` (or :class:`Spill` directly) gives every growing layer
of a trainer a cold tier (:class:`growmem.storage.tiered.TieredMemory`, zarr v3 through
TensorStore) under ``directory/<layer>``. The trainer's own memories stay the hot tier.
Before a step would take the hot rows of all layers past ``ram_budget_bytes``, the oldest
hot rows of each full layer (a whole number of cold chunks, down to about half the budget)
are written to the cold tier and removed from the hot memory; the hot capacity never grows
past the budget.

Inside the jitted step a layer sees its cold rows through ``Memory.cold``, a
:class:`ColdView` (the number of cold rows it may read plus a handle on the tier). Retrieval
(:func:`growmem.layers.retrieve`) scans the cold chunks — each read on the host by a
``jax.pure_callback`` (TensorStore with read-ahead, numpy; no JAX inside the callback) —
computes their partial result with the same kernels and per-row coefficients as the hot
rows, and merges it with the hot rows' partial result by the log-sum-exp rule (the same
merge as chunks and shards), so the output equals an all-in-RAM memory up to float
rounding. The scan body is rematerialised in the backward pass (``jax.checkpoint``): a
second streaming pass gives ``∂L/∂q`` through the cold rows, so every layer below a spilled
layer still gets its exact ``g = ∂L/∂s``, and no cold row is kept in memory. Cold rows are
never trained (hybrid layers are refused) and never rewritten by a step. The cold loop has
a static number of chunk slots (a power of two), so a growing cold tier recompiles the step
O(log N) times.

Policies across the tiers:

* novelty (Alg. 4 line 9): the candidate keys' distance to the cold keys is streamed too
  (:meth:`ColdView.min_sq_distance`), so admission sees every stored row;
* momentum (Eq. 23/91, 100) and any row-local ``coeff``: computed per cold chunk from
  ``born`` and the clock ``t``, lazily;
* weight decay (Eq. 21/90): hot rows are aged every step as before; a cold row is aged
  lazily by ``retention^(t − t_spill)``, where ``t_spill`` is the step its block was
  spilled at (kept per block, saved in checkpoints). A custom policy whose ``age`` does
  more than scale by its declared ``retention`` is applied to hot rows only;
* pruning (``evict``): :meth:`Spill.compact` runs each layer's policy ``evict`` on the
  (aged) cold rows chunk by chunk and rewrites the kept rows into a new tier generation —
  one sequential read and one write of the kept cold bytes; ``compact_every=k`` does this
  after every k-th spill. Only row-local evictions make sense there; a ``capacity`` policy
  (which bounds the rows in RAM, the opposite of spilling) is refused.

Costs per step for a layer with cold rows: one streaming read of its cold rows in the
forward pass, one in the backward pass, and one more for a novelty policy. Checkpoints
(:class:`growmem.storage.checkpoint.Checkpointer`) save a spilling trainer's hot rows as
usual and each cold tier by reference (URL, generation, row count, spill steps); restoring
truncates cold rows written after the checkpoint, so a resumed run is exact.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import kernels
from .. import memory as memlib
from .tiered import FIELDS, TieredMemory, TierError, _padded_rows, chunk_coeff, row_bytes

#: target bytes of one cold chunk (key + value rows) when ``chunk_rows`` is not given
COLD_CHUNK_BYTES = 16 << 20

# open cold stores of this process, by ColdRef.key (a view in a jitted program finds its tier here)
_STORES: Dict[str, "ColdStore"] = {}


@dataclasses.dataclass(frozen=True)
class ColdRef:
    """Static (hashable) handle on an open :class:`ColdStore`: part of the jitted program."""

    key: str
    d_in: int
    d_out: int
    chunk_rows: int


def _store(ref: ColdRef) -> "ColdStore":
    try:
        return _STORES[ref.key]
    except KeyError:
        raise TierError(f"the cold tier {ref.key} is not open in this process: attach it with "
                        f"Trainer.enable_spill(...) (or restore the checkpoint into a trainer that has "
                        f"spilling enabled) before using this state") from None


def _chunk_bound(rows: int, chunk_rows: int) -> int:
    """Static number of chunk slots of a cold loop: a power of two >= the chunks in use, so a
    growing cold tier recompiles the step O(log N) times."""
    need = max(1, -(-int(rows) // chunk_rows))
    return 1 << (need - 1).bit_length()


@struct.dataclass
class ColdView:
    """What a jitted step knows of a layer's cold tier: how many cold rows it may read
    (``n``, traced) and a static bound on their chunks."""

    n: jax.Array
    ref: ColdRef = struct.field(pytree_node=False)
    max_chunks: int = struct.field(pytree_node=False, default=1)

    def _read(self, i, t, fields):
        """Cold chunk ``i`` (rows aged to step ``t``), read on the host by a callback."""
        ref, c = self.ref, self.ref.chunk_rows
        shapes = {"w": ((c,), jnp.float32), "k": ((c, ref.d_in), jnp.float32), "v": ((c, ref.d_out), jnp.float32),
                  "born": ((c,), jnp.int32)}
        out = tuple(jax.ShapeDtypeStruct(*shapes[f]) for f in fields)
        cb = lambda i, n, t: _store(ref).read_chunk(int(i), int(n), int(t), fields)
        return jax.pure_callback(cb, out, i, self.n, t, vmap_method="sequential")

    def parts(self, q, t, spec):
        """Partial retrieval result over the cold rows at clock ``t``: ``(m, num, den)`` for the
        weighted softmax (:func:`growmem.kernels.weighted_softmax_parts`), the sum otherwise.

        A scan over the cold chunks; each chunk is read by a host callback (TensorStore and
        numpy only: no JAX runs inside it) and combined with the same kernels and per-row
        coefficients as the hot rows. The loop body is rematerialised in the backward pass
        (``jax.checkpoint``), so differentiating in ``q`` reads every chunk once more instead
        of keeping the cold rows in memory.
        """
        t = jnp.asarray(t, jnp.int32)
        c = self.ref.chunk_rows
        wsm = spec.kernel == "weighted_softmax"
        b = q.shape[0]

        @jax.checkpoint
        def body(carry, i):
            def run(carry):
                w, k, v, born = self._read(i, t, FIELDS)
                n_valid = jnp.clip(self.n - i * c, 0, c)
                coeff = chunk_coeff(spec, w, k, v, born, n_valid, t)
                if wsm:
                    p = kernels.weighted_softmax_parts(q, k, v, w, temperature=spec.temperature, coeff=coeff,
                                                       size=n_valid, chunk=c)
                    return tuple(kernels.merge_parts([carry, p]))
                return carry + kernels.retrieve(spec.kernel, q, k, v, w, temperature=spec.temperature,
                                                coeff=coeff, size=n_valid, chunk=c)

            return jax.lax.cond(i * c < self.n, run, lambda carry: carry, carry), None

        if wsm:
            init = (jnp.full((b,), -jnp.inf, q.dtype), jnp.zeros((b, self.ref.d_out), q.dtype),
                    jnp.zeros((b,), q.dtype))
        else:
            init = jnp.zeros((b, self.ref.d_out), q.dtype)
        out, _ = jax.lax.scan(body, init, jnp.arange(self.max_chunks, dtype=jnp.int32))
        return out

    def min_sq_distance(self, q):
        """``(B,)``: ``min_j ‖q − k_j‖²`` over the cold keys (``inf`` without cold rows)."""
        q = jax.lax.stop_gradient(q)
        c = self.ref.chunk_rows
        t = jnp.zeros((), jnp.int32)

        from ..policies import NOVELTY_CHUNK, min_sq_distance

        def body(best, i):
            def run(best):
                (k,) = self._read(i, t, ("k",))
                n_valid = jnp.clip(self.n - i * c, 0, c)
                return jnp.minimum(best, min_sq_distance(q, k, size=n_valid, chunk=NOVELTY_CHUNK))

            return jax.lax.cond(i * c < self.n, run, lambda b: b, best), None

        best, _ = jax.lax.scan(body, jnp.full((q.shape[0],), jnp.inf, q.dtype),
                               jnp.arange(self.max_chunks, dtype=jnp.int32))
        return best


# ------------------------------------------------------------------------------ one layer's cold rows

def aged(rows: Dict[str, np.ndarray], lo: int, seg_start, seg_t, t: int, retention: float, weighted: bool):
    """Cold rows ``lo, lo+1, …`` with ``v`` (and ``w`` when ``weighted``) scaled by
    ``retention^(t − t_spill)``: the weight decay (Eq. 21/90) a row missed since its block
    spilled at step ``t_spill`` (block ``j`` starts at row ``seg_start[j]``, spilled at ``seg_t[j]``)."""
    if retention == 1.0 or "v" not in rows or len(seg_start) == 0:
        return rows
    seg_start, seg_t = np.asarray(seg_start, np.int64), np.asarray(seg_t, np.int64)
    seg = np.searchsorted(seg_start, lo + np.arange(len(rows["v"])), side="right") - 1
    age = np.maximum(t - seg_t[np.maximum(seg, 0)], 0)
    f = np.power(retention, age, dtype=np.float64).astype(rows["v"].dtype)
    rows = dict(rows)
    rows["v"] = rows["v"] * f[:, None]
    if weighted:
        rows["w"] = rows["w"] * f
    return rows


class ColdStore:
    """The cold rows of one layer: a :class:`TieredMemory` used for its cold tier only, plus
    the step each spilled block was aged to (for lazy weight decay)."""

    def __init__(self, key: str, tier: TieredMemory, spec, seg_start=(), seg_t=()):
        self.key, self.tier, self.spec = key, tier, spec
        self.retention = float(spec.policy.retention) if spec.policy is not None else 1.0
        self.seg_start = np.asarray(seg_start, np.int64).reshape(-1)
        self.seg_t = np.asarray(seg_t, np.int64).reshape(-1)
        self.ref = ColdRef(key, tier.d_in, tier.d_out, tier.chunk_rows)
        self._pending: Dict[tuple, dict] = {}
        self._last = None

    @property
    def rows(self) -> int:
        return self.tier.rows_cold

    def view(self) -> ColdView:
        return ColdView(n=jnp.asarray(self.rows, jnp.int32), ref=self.ref,
                        max_chunks=_chunk_bound(self.rows, self.tier.chunk_rows))

    # -- writes
    def spill(self, rows: Dict[str, np.ndarray], t: int):
        """Append ``rows`` (already aged to step ``t``) to the cold tier."""
        start = self.rows
        self._pending.clear()
        self.tier.write_cold(rows)          # all-or-nothing (TierWriteError)
        self.seg_start = np.append(self.seg_start, start)
        self.seg_t = np.append(self.seg_t, int(t))

    # -- reads
    def _aged(self, rows, lo: int, n: int, t: int):
        """A padded chunk with ``w``, ``v`` scaled by ``retention^(t − t_spill)`` (lazy decay)."""
        rows = _padded_rows(rows, n, self.tier.chunk_rows, self.tier._shapes())
        if n == 0:
            return rows
        return aged(rows, lo, self.seg_start, self.seg_t, t, self.retention,
                    self.spec.kernel == "weighted_softmax")

    def _issue(self, i: int, n: int, fields):
        c = self.tier.chunk_rows
        lo, hi = i * c, min(n, (i + 1) * c)
        return {f: self.tier._arrays[f][lo:hi].read() for f in fields}

    def read_chunk(self, i: int, n: int, t: int, fields=FIELDS):
        """Host side of :meth:`ColdView._read`: chunk ``i`` of the first ``n`` cold rows, padded
        and aged to ``t``. Reads of the next ``read_ahead`` chunks in the direction of travel
        (forward pass up, rematerialised backward pass down) are put in flight."""
        c = self.tier.chunk_rows
        n = min(int(n), self.rows)
        n_chunks = -(-n // c)
        fields = tuple(fields)
        futs = self._pending.pop((i, n, fields), None) or self._issue(i, n, fields)
        # direction of travel: a pass starts at an end (forward: chunk 0, rematerialised backward: the last)
        if i == 0 or i == n_chunks - 1:
            step = 1 if i == 0 else -1
        else:
            step = -1 if self._last is not None and i < self._last else 1
        self._last = i
        ahead = {(j, n, fields) for j in range(i + step, i + step * (self.tier.read_ahead + 1), step)
                 if 0 <= j < n_chunks}
        for key in list(self._pending):
            if key not in ahead:
                del self._pending[key]
        for key in ahead:
            if key not in self._pending:
                self._pending[key] = self._issue(key[0], n, fields)
        try:
            rows = {f: fu.result() for f, fu in futs.items()}
        except Exception as e:
            raise TierError(f"reading the cold tier at {self.tier.url} failed: {e}") from e
        rows = self._aged(rows, i * c, max(0, min(c, n - i * c)), t)
        return tuple(np.ascontiguousarray(rows[f], np.int32 if f == "born" else np.float32) for f in fields)

    def _stream(self, n: int, t: int, fields=FIELDS):
        lo = 0
        for rows, c in self.tier._chunks(fields=fields, cold_rows=n, hot=False):
            yield self._aged(rows, lo, c, t), c
            lo += c

    def all_rows(self, t: int) -> Dict[str, np.ndarray]:
        """Every cold row, aged to step ``t`` (only for tiers that fit in RAM: tests, export)."""
        out = {f: [] for f in FIELDS}
        for rows, c in self._stream(self.rows, t):
            for f in FIELDS:
                out[f].append(np.array(rows[f][:c]))
        shapes = self.tier._shapes()
        return {f: (np.concatenate(p) if p else np.zeros((0,) + shapes[f], self.tier._dt(f)))
                for f, p in out.items()}

    # -- evictions
    def compact(self, t: int, policy_state=None) -> int:
        """Run the layer policy's ``evict`` on the aged cold rows; returns the rows removed."""
        pol = self.spec.policy
        if pol is None or self.rows == 0:
            return 0
        from ..rules import Rows

        d_in, d_out, dt = self.tier.d_in, self.tier.d_out, self.tier.dtype
        dummy = Rows(w=jnp.zeros((1,), dt), k=jnp.zeros((1, d_in), dt), v=jnp.zeros((1, d_out), dt))
        masks = []

        def keep(rows, lo):
            c = len(rows["w"])
            aged = self._aged(rows, lo, c, t)
            mem = memlib.Memory(w=jnp.asarray(aged["w"]), k=jnp.asarray(aged["k"]), v=jnp.asarray(aged["v"]),
                                born=jnp.asarray(aged["born"]), size=jnp.asarray(c, jnp.int32),
                                t=jnp.asarray(t, jnp.int32), spec=self.spec)
            k, _, _ = pol.evict(mem, dummy, jnp.zeros((1,), bool), memlib.valid_mask(mem), policy_state)
            k = np.asarray(k)[:c]
            masks.append(k)
            return k

        before = self.rows
        self._pending.clear()               # read-ahead of the old generation
        self.tier.compact(keep)
        kept = np.concatenate(masks) if masks else np.zeros(0, bool)
        # the block boundaries move with the rows: a block now starts after the rows kept before it
        before_start = np.concatenate([[0], np.cumsum(kept)])
        self.seg_start = before_start[np.minimum(self.seg_start, len(kept))]
        return before - self.rows

    # -- checkpoints
    def checkpoint_state(self):
        hot, meta = self.tier.checkpoint_state()
        return hot, dict(meta, spill={"seg_start": self.seg_start.tolist(), "seg_t": self.seg_t.tolist()})


def _layer_dir(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name) or "memory"


class Spill:
    """Spill the oldest rows of a trainer's growing layers to TensorStore under a RAM budget.

    ``ram_budget_bytes`` bounds the hot rows of all spilling layers together (``w``, ``k``,
    ``v``, ``born`` of every row in use or preallocated). ``chunk_rows``: rows per cold chunk
    (default: about :data:`COLD_CHUNK_BYTES` of key + value rows, at most a quarter of the hot
    rows). ``compact_every``: run :meth:`compact` after every that many spills (0 = never).
    ``resume``: open the tiers already under ``directory`` (then restore a checkpoint of the
    run: :meth:`growmem.storage.checkpoint.Checkpointer.restore` cuts each tier back to the
    checkpoint's rows) instead of creating them; ``overwrite`` replaces existing tiers.
    """

    def __init__(self, trainer, directory, *, ram_budget_bytes: int, chunk_rows: Optional[int] = None,
                 read_ahead: int = 2, compact_every: int = 0, overwrite: bool = False, resume: bool = False):
        from ..train import layer_key

        self.trainer = trainer
        self.directory = os.fspath(directory)
        self.ram_budget_bytes = int(ram_budget_bytes)
        self.read_ahead = int(read_ahead)
        self.compact_every = int(compact_every)
        self.spills = 0
        mems = trainer.memories()
        if not mems:
            raise ValueError("this trainer has no growing layer to spill")
        for path, m in mems.items():
            name = layer_key(path) or "memory"
            if m.spec.hybrid:
                raise ValueError(f"layer {name} is hybrid (Alg. 4 trains its stored rows): its rows cannot spill "
                                 f"to disk, where they would not be trained; spill only non-hybrid layers")
            if m.spec.policy is not None and "capacity(" in m.spec.policy.name:
                raise ValueError(f"layer {name} has a capacity policy ({m.spec.policy.name}), which keeps its rows "
                                 f"in RAM; spilling makes no sense with it — drop one of the two")
            if m.cold is not None:
                raise ValueError(f"layer {name} already spills (to {m.cold.ref.key})")
            if np.dtype(m.k.dtype) != np.float32:
                raise ValueError(f"layer {name} stores {m.k.dtype} rows; the cold tier reads float32 rows only")
        total_row = sum(row_bytes(m.d_in, m.d_out, np.dtype(m.k.dtype)) for m in mems.values())
        self.hot_rows = int(self.ram_budget_bytes // total_row)
        if chunk_rows is None:  # a power of two near COLD_CHUNK_BYTES, at most a quarter of the hot rows
            big = max(row_bytes(m.d_in, m.d_out, np.dtype(m.k.dtype)) for m in mems.values())
            fit = 1 << max(int(COLD_CHUNK_BYTES // big).bit_length() - 1, 0)
            quarter = 1 << max((self.hot_rows // 4).bit_length() - 1, 0)
            chunk_rows = max(memlib.ROW_QUANTUM, min(fit, quarter))
        self.chunk_rows = int(chunk_rows)
        if self.hot_rows < 4 * self.chunk_rows:
            raise ValueError(f"RAM budget {self.ram_budget_bytes} B holds only {self.hot_rows} rows per layer "
                             f"({total_row} B per row over {len(mems)} layers); spilling needs at least "
                             f"4 chunks of {self.chunk_rows} rows: raise ram_budget_bytes or lower chunk_rows")
        self.stores: Dict[tuple, ColdStore] = {}
        for path, m in mems.items():
            name = layer_key(path) or "memory"
            loc = os.path.join(self.directory, _layer_dir(name)) if "://" not in self.directory \
                else self.directory.rstrip("/") + "/" + _layer_dir(name)
            rb = row_bytes(m.d_in, m.d_out, np.dtype(m.k.dtype))
            budget = (self.read_ahead + 3) * self.chunk_rows * rb   # the tier's own hot part stays empty
            if not resume:
                tier = TieredMemory.create(loc, d_in=m.d_in, d_out=m.d_out, spec=m.spec, ram_budget_bytes=budget,
                                           chunk_rows=self.chunk_rows, read_ahead=self.read_ahead,
                                           dtype=np.dtype(m.k.dtype), overwrite=overwrite)
            else:
                tier = TieredMemory.open(loc, ram_budget_bytes=budget, read_ahead=self.read_ahead, spec=m.spec)
            self._register(path, ColdStore(tier.url + f"#{name}", tier, m.spec))
        self._install_views()
        # hot capacity never grows past the budget (plus one quantum of rounding)
        trainer._capacity_limit = {p: memlib.round_capacity(self.hot_rows) for p in mems}
        trainer.spill = self

    def _register(self, path, store: ColdStore):
        old = self.stores.get(path)
        if old is not None:
            _STORES.pop(old.key, None)
        self.stores[path] = store
        _STORES[store.key] = store

    def _install_views(self):
        from ..train import _set_memories

        tr = self.trainer
        mems = tr.memories()
        limit = memlib.round_capacity(self.hot_rows)
        new = {}
        for p, s in self.stores.items():
            m = mems[p]
            if m.capacity > limit:  # preallocated past the budget: give the room back (rows beyond spill first)
                m = memlib.with_capacity(m, max(limit, int(m.size)))
            new[p] = m.replace(cold=s.view())
        tr.state = tr.state.replace(collections=_set_memories(tr.state.collections, new))

    # -- the trainer calls this before every step
    def before_step(self, batch: int):
        """Spill the oldest hot rows of every layer whose hot rows would pass the budget."""
        if batch > self.hot_rows // 2:
            raise ValueError(f"batch of {batch} rows is more than half the {self.hot_rows} hot rows the RAM "
                             f"budget allows per layer: raise ram_budget_bytes")
        from ..train import _set_memories

        tr = self.trainer
        spilled = False
        for path, store in self.stores.items():
            if tr._bound.get(path, 0) + batch <= self.hot_rows:
                continue
            mem = tr.memories()[path]
            exact = int(mem.size)
            tr._bound[path] = exact
            if exact + batch <= self.hot_rows:
                continue
            c = self.chunk_rows
            n = min(exact // c * c, -(-(exact - self.hot_rows // 2) // c) * c)
            if n <= 0:
                raise ValueError(f"layer {'/'.join(path)}: cannot free room for {batch} rows ({exact} hot rows, "
                                 f"chunks of {c}, budget {self.hot_rows} rows)")
            host = {f: np.asarray(getattr(mem, f))[:n] for f in FIELDS}
            # a failed write raises TierWriteError with this layer unchanged; layers spilled before
            # it in this call are complete (their rows moved, none lost or doubled)
            store.spill(host, int(mem.t))
            moved = _drop_front(mem, jnp.asarray(n, jnp.int32)).replace(cold=store.view())
            tr.state = tr.state.replace(collections=_set_memories(tr.state.collections, {path: moved}))
            tr._bound[path] = exact - n
            spilled = True
        if spilled:
            self.spills += 1
            if self.compact_every and self.spills % self.compact_every == 0:
                self.compact()

    def compact(self) -> Dict[str, int]:
        """Run each layer policy's ``evict`` over its cold rows (pruning); ``{layer: rows removed}``."""
        from ..train import layer_key

        tr = self.trainer
        jax.block_until_ready(tr.state)   # no step in flight may still read the old generation
        pstate = tr.state.policy_state or {}
        mems = tr.memories()
        out = {}
        for path, store in self.stores.items():
            out[layer_key(path)] = store.compact(int(mems[path].t), pstate.get(layer_key(path)))
        self._install_views()
        return out

    # -- views and checkpoints
    def cold_rows(self) -> Dict[str, int]:
        from ..train import layer_key

        return {layer_key(p) or "memory": s.rows for p, s in self.stores.items()}

    def all_rows(self) -> Dict[str, Dict[str, np.ndarray]]:
        """``{layer: rows}``: cold rows (aged to the layer's clock) then hot rows (tests, export)."""
        from ..train import layer_key

        mems = self.trainer.memories()
        out = {}
        for p, s in self.stores.items():
            cold, hot = s.all_rows(int(mems[p].t)), mems[p].rows()
            out[layer_key(p) or "memory"] = {f: np.concatenate([cold[f], hot[f]]) for f in FIELDS}
        return out

    def checkpoint_tiers(self) -> Dict[str, ColdStore]:
        from ..train import layer_key

        return {layer_key(p) or "memory": s for p, s in self.stores.items()}

    def tier_specs(self):
        from ..train import layer_key

        return {layer_key(p) or "memory": s.spec for p, s in self.stores.items()}

    def adopt(self, tiers: Dict[str, TieredMemory], tiers_meta):
        """After a restore: use the reopened tiers (at the checkpoint's rows) and their spill steps."""
        from ..train import layer_key

        metas = {t["name"]: t for t in tiers_meta}
        for path, old in list(self.stores.items()):
            name = layer_key(path) or "memory"
            if name not in tiers:
                raise TierError(f"the checkpoint has no cold tier for layer {name}; it was written without "
                                f"spilling — restore it into a trainer without enable_spill")
            seg = (metas.get(name) or {}).get("spill") or {}
            self._register(path, ColdStore(old.key, tiers[name], old.spec, seg.get("seg_start", ()),
                                           seg.get("seg_t", ())))
        self._install_views()


@jax.jit
def _drop_front(mem: memlib.Memory, n):
    """The memory without its first ``n`` rows (the rows that spilled), compacted to the front."""
    return memlib.select(mem, jnp.arange(mem.capacity) >= n)
