"""Memories larger than RAM: the newest rows on the device, older rows in TensorStore on disk.

:class:`Tiered` is the backend (``Trainer(model, backend=Tiered("/data/run/cold",
ram_budget_bytes=8 << 30))``, or a :class:`growmem.backends.store.Store` outside a trainer).
Each growing layer gets a cold tier (:class:`ColdTier`: one zarr v3 array per field,
append-only, chunked along rows, under ``directory/<layer>`` — a local folder or any
TensorStore kvstore URL). Before a step would take the hot rows past the RAM budget, the
oldest hot rows of the layer are written to its tier in whole chunks and dropped from the
device; the hot capacity never grows past the budget.

Inside the jitted step a memory sees its cold rows through ``mem.ext["cold"]``, a
:class:`ColdView` (how many cold rows it may read, traced, plus a static handle on the tier).
Retrieval scans the cold chunks — each read on the host (TensorStore with read-ahead in the
direction of travel, numpy only: no JAX runs inside a read, which would deadlock asynchronous
CPU dispatch) through the native ``growmem_cold_read`` FFI target (:mod:`growmem.native`: JAX's
persistent compilation cache keeps its programs, so a resumed run does not compile them again),
or a ``jax.pure_callback`` where the native build is missing or off — reduces each with the same
kernel and per-row coefficients as the hot rows and merges the partials by the kernel's rule, so the
output equals an all-in-RAM memory up to float rounding. The scan body is rematerialised in the
backward pass (``jax.checkpoint``): ``∂L/∂q`` through the cold rows costs a second streaming
read, never a copy of the cold rows in memory.

Policies across the tiers: novelty streams the cold keys too; momentum (Eq. 23/91, 100) and any
row-local coefficient are computed per cold chunk from ``born`` and the clock; weight decay
(Eq. 21/90) reaches a cold row lazily as ``retention^(t − t_spill)`` (``t_spill`` kept per
spilled block, saved in checkpoints); pruning cold rows is :meth:`Tiered.compact` (the policy's
``evict`` over the aged cold rows: one read and one write of the kept bytes, a new tier
*generation*). Layers whose policy trains rows (hybrid) or caps them in RAM (``capacity``) are
refused: cold rows are never trained, and a cap keeps a memory in RAM anyway.

Failures: an unwritable location raises :class:`TierError`; a failed spill (e.g. disk full)
raises :class:`TierWriteError` before the step and leaves the memory exactly as it was.

Integrity: every write records the CRC32 of the rows it wrote, per chunk and field, in the
tier's manifest (``tier.json``, rewritten atomically with the row count). A resume
(:meth:`ColdTier.checked`) and ``growmem inspect`` read the rows a checkpoint refers to back and
check them (:meth:`ColdTier.verify`): a missing, truncated or damaged chunk file is an error
naming the file, never rows of zeros. Reads during training do not recompute checksums, except
for a chunk whose file is missing, which is an error unless its rows were all the fill value.
Combined with :class:`growmem.backends.sharded.Sharded` (``Sharded(mesh, inner=Tiered(...))``)
every shard has its own tier (``directory/<layer>/shard-<s>``) and its own budget.

One module per job: :mod:`~growmem.backends.tier_files` (chunk files, URLs, checksums, the tier errors),
:mod:`~growmem.backends.tier_format` (:class:`ColdTier`), :mod:`~growmem.backends.tier_stream` (what a
jitted step reads: :class:`ColdStore`, :class:`ColdView`, the host reads) and this one, the backend.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import kernels, locks
from .. import memory as memlib
from ..errors import CheckpointError, ConfigError
from ..runtime import allgather_json
from ..units import byte_budget
from . import RAM, _temperature
# row_bytes, TierWriteError: re-exported (the public names of the cold tiers live in growmem.backends.tiered)
from .tier_files import (COLD_CHUNK_BYTES, FIELDS, TierError, TierWriteError, _safe, join_url, local_path, row_bytes,
    url_of)
from .tier_format import ColdTier
from .tier_stream import (ColdRef, ColdStore, ColdView, _KEYS, _SHARD_COUNTS, _STORES, _chunk_bound, _store,
    cold_min_sq_distance, cold_partial)


# ---------------------------------------------------------------------------------------------
# the backend


def _spec_json(spec):
    if spec is None:
        return None
    d = dataclasses.asdict(spec)
    d["hyper"] = [list(p) for p in d.get("hyper", ())]
    return d


class TierState:
    """The host state of one :class:`Tiered` backend, apart from its settings: its layers (row bytes, and the
    key under which :mod:`growmem.backends.tier_stream` keeps their open stores, where a jitted step's cold
    read finds them by the static key in its view), and the spills since the last compaction. ``key`` is
    unique in the process and the same in every fresh process (tier-0, tier-1, ...): it is part of the
    compiled programs (the native cold read's attribute), so a resumed run finds them in the persistent
    compilation cache."""

    def __init__(self):
        self.key = f"tier-{next(_KEYS)}"
        self.layers: Dict[str, tuple] = {}     # name -> (row bytes, key of its stores or None before attach)
        self.spills = 0
        self.spills_at_compaction = 0

    def key_of(self, name: str) -> str:
        """The key layer ``name``'s stores are registered under."""
        return f"{self.key}/{name}"

    def open(self, name: str, bytes_per_row: int, stores) -> str:
        """Register layer ``name``'s open store (or ``{shard: store}``); returns the key a view reads it by."""
        key = self.key_of(name)
        _STORES[key] = stores
        self.layers[name] = (bytes_per_row, key)
        return key


@dataclasses.dataclass(frozen=True, eq=False)
class Tiered(RAM):
    """Newest rows in RAM, the rest on disk (module docstring).

    ``directory``: a folder or TensorStore kvstore URL; layer ``L``'s tier is ``directory/L``.
    ``ram_budget_bytes``: the rows kept on the device, for all the layers that use this
    backend together (split by their row sizes; per shard when combined with ``Sharded``).
    ``chunk_rows``: rows per cold chunk (default: about 16 MiB of key + value rows, at most a
    quarter of the hot rows). ``compact_every``: prune the cold rows with the layer's policy
    after every that many spills (0 = never; :meth:`compact` by hand). ``resume``: open the
    tiers of an earlier run (then restore its checkpoint, which cuts each tier back to the
    checkpoint's rows); ``overwrite``: replace existing tiers.
    """

    directory: Any = None
    ram_budget_bytes: int = 0
    chunk_rows: Optional[int] = None
    read_ahead: int = 2
    compact_every: int = 0
    overwrite: bool = False
    resume: bool = False
    #: the host state (layers, open stores, spill counts): a mutable object the frozen settings point to
    state: TierState = dataclasses.field(default_factory=TierState, init=False, repr=False, compare=False)

    name = "tiered"

    def __post_init__(self):
        if self.directory is None:
            raise ConfigError("Tiered needs a directory (a folder or a TensorStore kvstore URL)")
        object.__setattr__(self, "directory", os.fspath(self.directory))
        if self.ram_budget_bytes is None:
            raise ConfigError("Tiered needs ram_budget_bytes: the bytes of rows kept in RAM (e.g. 512MB)")
        object.__setattr__(self, "ram_budget_bytes", byte_budget(self.ram_budget_bytes, "ram_budget_bytes"))

    def __repr__(self):
        return f"Tiered({self.directory!r}, ram_budget_bytes={self.ram_budget_bytes})"

    @property
    def buffer_bytes(self) -> int:
        """RAM the cold reads use beside the budget: ``read_ahead + 2`` chunks per layer."""
        return sum((self.read_ahead + 2) * self._chunk_for(rb) * rb for rb, _ in self.state.layers.values())

    def _chunk_for(self, rb) -> int:
        return int(self.chunk_rows) if self.chunk_rows is not None else max(
            memlib.ROW_QUANTUM, min(1 << max(int(COLD_CHUNK_BYTES // rb).bit_length() - 1, 0),
                                    1 << max((self.hot_rows_per_layer // 4).bit_length() - 1, 0)))

    __hash__ = object.__hash__

    def __eq__(self, other):
        return other is self

    # ------------------------------------------------------------------ budget
    @property
    def hot_rows_per_layer(self) -> int:
        """Rows each layer keeps on the device (the budget split over the layers' row sizes)."""
        total = sum(rb for rb, _ in self.state.layers.values()) or 1
        return int(self.ram_budget_bytes // total)

    def _chunk_rows(self, mem) -> int:
        if self.chunk_rows is not None:
            return int(self.chunk_rows)
        big = max([rb for rb, _ in self.state.layers.values()] + [mem.row_bytes])
        fit = 1 << max(int(COLD_CHUNK_BYTES // big).bit_length() - 1, 0)
        quarter = 1 << max((self.hot_rows_per_layer // 4).bit_length() - 1, 0)
        return max(memlib.ROW_QUANTUM, min(fit, quarter))

    def _check_layer(self, mem, name):
        pol = mem.policy
        if pol is not None and pol.trains_rows:
            raise ConfigError(f"layer {name} is hybrid (its policy {pol.name} trains the stored rows): its rows cannot "
                              f"spill to disk, where they would not be trained; keep this layer in RAM")
        if pol is not None and pol.dynamic_age:
            raise ConfigError(f"layer {name}'s policy {pol.name} fades the rows by an amount decided at run time, "
                              f"which cold rows (faded lazily by a static retention) cannot follow; keep this layer "
                              f"in RAM")
        if pol is not None and getattr(pol, "max_rows", None):
            raise ConfigError(f"layer {name} has a capacity policy ({pol.name}), which keeps its rows in RAM; "
                              f"spilling makes no sense with it — drop one of the two")

    def _open_store(self, location, mem, name, chunk):
        spec_json = _spec_json(mem.spec)
        path = local_path(url_of(location))
        if path is not None:   # one process writes a tier
            try:
                locks.acquire(path, f"the cold tier of {name}")
            except locks.LockedError as e:
                raise TierError(str(e)) from None
            except OSError as e:
                raise TierError(f"cannot write the cold tier directory {path}: {e}") from None
        if self.resume:
            tier = ColdTier.open(location)
            if tier.d_in != mem.d_in or tier.d_out != mem.d_out:
                raise TierError(f"the tier at {tier.url} holds rows of {tier.d_in}→{tier.d_out}, but layer {name} "
                                f"is {mem.d_in}→{mem.d_out}")
        else:
            tier = ColdTier.create(location, d_in=mem.d_in, d_out=mem.d_out, chunk_rows=chunk,
                                   dtype=np.dtype(mem.k.dtype), spec_json=spec_json, overwrite=self.overwrite)
        pol = mem.policy
        return ColdStore(tier, pol.retention if pol is not None else 1.0, kernels.get(mem.spec.kernel).normalised,
                         self.read_ahead)

    def _view(self, key, store_rows, mem, chunk):
        ref = ColdRef(key, mem.d_in, mem.d_out, chunk, str(np.dtype(mem.k.dtype)))
        n = np.asarray(store_rows, np.int32)
        return ColdView(n=jnp.asarray(n), ref=ref, max_chunks=_chunk_bound(int(np.max(n, initial=0)), chunk))

    def register(self, mem, name: str = "memory"):
        self._check_layer(mem, name)
        self.state.layers.setdefault(name, (mem.row_bytes, None))

    def attach(self, mem, name: str = "memory"):
        """Open (or create) the layer's cold tier and cap its hot capacity at the budget."""
        self.register(mem, name)
        chunk = self._chunk_rows(mem)
        hot = self.hot_rows_per_layer
        if hot < 2 * chunk:
            raise ConfigError(f"RAM budget {self.ram_budget_bytes} B is too small: it holds {hot} rows per layer "
                              f"({mem.row_bytes} B per row for {name}); spilling needs at least 2 chunks of {chunk} "
                              f"rows: raise ram_budget_bytes or lower chunk_rows")
        store = self._open_store(join_url(self.directory, _safe(name)), mem, name, chunk)
        key = self.state.open(name, mem.row_bytes, store)
        limit = memlib.round_capacity(hot)
        if mem.capacity > limit:   # preallocated past the budget: give the room back
            mem = memlib.with_capacity(mem, max(limit, int(mem.size)))
        return mem.replace(backend=self, ext={"cold": self._view(key, store.rows, mem, chunk)})

    def store(self, mem, shard: int = 0) -> ColdStore:
        return _store(mem.ext["cold"].ref.key, shard)

    # ------------------------------------------------------------------ inside a jitted step
    def reduce(self, kern, mem, q, coeff_fn, *, row_grads: bool):
        hot = super().reduce(kern, mem, q, coeff_fn, row_grads=row_grads)
        view = mem.ext["cold"]
        cold = cold_partial(kern, view, view.n, jnp.zeros((), jnp.int32), q, mem.t, coeff_fn, _temperature(mem))
        return kernels.merge(cold, hot)

    def min_sq_distance(self, mem, q, chunk: int = kernels.NOVELTY_CHUNK):
        view = mem.ext["cold"]
        return jnp.minimum(super().min_sq_distance(mem, q, chunk),
                           cold_min_sq_distance(view, view.n, jnp.zeros((), jnp.int32), q))

    # ------------------------------------------------------------------ on the host
    def fill(self, mem) -> int:
        return int(mem.size)

    def prepare(self, mem, extra: int, bound: int, growth: float = 2.0, limit=None):
        # the caller's limit is not used: a tiered memory refuses capacity policies
        hot = self.hot_rows_per_layer
        if extra > hot // 2:
            raise ConfigError(f"a batch of {extra} rows is more than half the {hot} hot rows the RAM budget allows "
                              f"per layer: raise ram_budget_bytes")
        if bound + extra > hot:
            exact = int(mem.size)
            if exact + extra > hot:
                return self._spill(mem, exact), None
            bound = exact
        # the budget caps the geometric growth, so a growing table is copied once, not grown past the budget
        # and cut back (three tables alive); one that would grow past half the budget grows to all of it: while
        # it is copied the old table holds at most half the budget (not up to all of it: twice the budget alive)
        if mem.capacity * growth > hot / 2:
            growth = max(growth, hot / max(mem.capacity, 1))
        # limit=hot: the capacity never passes the budget (exact + extra <= hot here)
        return super().prepare(mem, extra, bound, growth, limit=hot)

    def _spill(self, mem, exact: int):
        """Move the oldest hot rows (whole chunks, down to about half the budget) to the tier."""
        view = mem.ext["cold"]
        store = _store(view.ref.key)
        c, hot = view.ref.chunk_rows, self.hot_rows_per_layer
        n = min(exact // c * c, -(-(exact - hot // 2) // c) * c)
        if n <= 0:
            raise ConfigError(f"cannot free room in the hot rows ({exact} rows, chunks of {c}, budget {hot} rows)")
        host = {f: np.asarray(getattr(mem, f))[:n] for f in FIELDS}
        # a failed write raises TierWriteError with this memory unchanged
        store.spill(host, int(mem.t))
        del host   # views of the tables: the shift below writes into them
        if exact - n >= c:
            moved = _shift_front(mem, jnp.asarray(n, jnp.int32), step=c)
        else:
            moved = _drop_front(mem, jnp.asarray(n, jnp.int32))
        out = moved.replace(ext={"cold": self._view(view.ref.key, store.rows, mem, c)})
        self.state.spills += 1
        return out

    def due_compaction(self) -> bool:
        """Whether ``compact_every`` spills happened since the last :meth:`compact` (the trainer
        then prunes the cold rows with the layers' policies)."""
        return bool(self.compact_every) and self.state.spills - self.state.spills_at_compaction >= self.compact_every

    def compact(self, mem, evict: Optional[Callable] = None, keep: Optional[Callable] = None):
        """Prune the cold rows: ``evict(chunk memory) -> (chunk,) bool`` over them aged to the clock
        (a policy's evict stage: :func:`growmem.policies.evictor`), or ``keep(rows, start) -> (n,)
        bool`` per chunk of the rows as stored. One read and one write of the kept bytes; a new
        tier generation (checkpoints of the old one then refuse to restore). Returns the memory
        with its view of the (smaller) tier."""
        view = mem.ext["cold"]
        store = _store(view.ref.key)
        t = int(mem.t)
        if keep is not None:
            fn = lambda rows, n, lo: keep({f: a[:n] for f, a in rows.items()}, lo)
        elif evict is None or store.rows == 0:
            return mem
        else:
            def fn(rows, n, lo):
                return evict(memlib.Memory(w=jnp.asarray(rows["w"]), k=jnp.asarray(rows["k"]), v=jnp.asarray(rows["v"]),
                                           born=jnp.asarray(rows["born"]), size=jnp.asarray(n, jnp.int32),
                                           t=jnp.asarray(t, jnp.int32), spec=mem.spec))

        jax.block_until_ready(mem.k)   # no step in flight may still read the old generation
        store.compact(t, fn, aged_rows=keep is None)
        self.state.spills_at_compaction = self.state.spills
        return mem.replace(ext={"cold": self._view(view.ref.key, store.rows, mem, view.ref.chunk_rows)})

    def rows_in_use(self, mem) -> int:
        return int(mem.size) + _store(mem.ext["cold"].ref.key).rows

    def hot_rows(self, mem) -> int:
        return int(mem.size)

    def cold_rows(self, mem) -> int:
        return _store(mem.ext["cold"].ref.key).rows

    def host_rows(self, mem) -> Dict[str, np.ndarray]:
        """Cold rows (aged to the memory's clock) then hot rows."""
        cold = _store(mem.ext["cold"].ref.key).all_rows(int(mem.t))
        hot = mem.rows()
        return {f: np.concatenate([cold[f], hot[f]]) for f in FIELDS}

    # ------------------------------------------------------------------ checkpoints
    def save(self, name: str, mem):
        """Hot rows as arrays; the cold tier by reference (URL, generation, row count, spill steps)."""
        hot = mem.rows()
        store = _store(mem.ext["cold"].ref.key)
        return hot, {"backend": self.name, "tier": store.reference(), "hot_rows": int(mem.size)}

    def restore(self, name: str, meta: dict, arrays, template):
        if "tier" not in meta:
            raise CheckpointError(f"layer {name} was saved without a disk tier: restore it into a trainer whose "
                                  f"backend for it is RAM (not Tiered)")
        mem = super().restore(name, meta, arrays, template)
        view = template.ext["cold"]
        store = _store(view.ref.key)
        _reopen(store, meta["tier"], name)
        return mem.replace(ext={"cold": self._view(view.ref.key, store.rows, mem, view.ref.chunk_rows)},
                           backend=self)

    # ------------------------------------------------------------------ per shard (for Sharded(inner=...))
    def attach_shards(self, sharded, mem, name: str):
        self.register(mem, name)
        cs = sharded.block(mem)
        chunk = self._chunk_rows(mem)
        hot = self.hot_rows_per_layer
        if hot < 2 * chunk:
            raise ConfigError(f"RAM budget {self.ram_budget_bytes} B is too small: it holds {hot} rows per shard and "
                              f"layer; spilling needs at least 2 chunks of {chunk} rows: raise ram_budget_bytes")
        stores = {}
        mine = sorted({(p.index[0].start or 0) // cs for p in mem.k.addressable_shards})
        for j in mine:
            stores[j] = self._open_store(join_url(join_url(self.directory, _safe(name)), f"shard-{j}"), mem,
                                         f"{name} shard {j}", chunk)
        key = self.state.open(name, mem.row_bytes, stores)
        rows = {j: stores[j].rows for j in mine}
        return self._install_shard_view(sharded, mem, key, rows, chunk)

    def _install_shard_view(self, sharded, mem, key, local_rows: Dict[int, int], chunk):
        s = sharded.n_shards
        counts = _allgather_counts(sharded, local_rows, mem)
        _SHARD_COUNTS[key] = counts.copy()
        ref = ColdRef(key, mem.d_in, mem.d_out, chunk, str(np.dtype(mem.k.dtype)))
        n = jax.make_array_from_callback((s,), sharded.rows_sharding(), lambda idx: counts[idx].astype(np.int32))
        view = ColdView(n=n, ref=ref, max_chunks=_chunk_bound(int(counts.max(initial=0)), chunk))
        return mem.replace(ext={**mem.ext, "cold": view})

    def cold_partial(self, kern, view, shard, q, t, coeff_fn, temperature):
        return cold_partial(kern, view, view.n[0], shard, q, t, coeff_fn, temperature)

    def cold_min_sq_distance(self, view, shard, q):
        return cold_min_sq_distance(view, view.n[0], shard, q)

    def spill_shards(self, sharded, mem, extra: int):
        """Spill every shard whose hot rows would pass the budget; None when no shard needs to."""
        hot = self.hot_rows_per_layer
        sizes = sharded.host_sizes(mem)
        if sizes.max(initial=0) + extra <= hot:
            return None
        view = mem.ext["cold"]
        c = view.ref.chunk_rows
        cs = sharded.block(mem)
        drop = np.zeros(sharded.n_shards, np.int64)
        for j in range(sharded.n_shards):
            if sizes[j] + extra > hot:
                drop[j] = min(sizes[j] // c * c, -(-(sizes[j] - hot // 2) // c) * c)
        stores = _STORES[view.ref.key]
        for j, store in stores.items():
            if drop[j]:
                host = {f: np.asarray(sharded.local_blocks(mem, f)[j])[:drop[j]] for f in FIELDS}
                store.spill(host, int(jax.device_get(mem.t.addressable_data(0))))
        keep = ~(((np.arange(mem.capacity) % cs) < drop[np.arange(mem.capacity) // cs]))
        keep = jax.device_put(jnp.asarray(keep), sharded.rows_sharding())
        arrays, new_sizes = sharded.compact_blocks([getattr(mem, f) for f in FIELDS], keep, mem.size, cs)
        moved = mem.replace(**dict(zip(FIELDS, arrays)), size=new_sizes)
        moved = sharded.place_memory(moved)
        return self._install_shard_view(sharded, moved, view.ref.key, {j: s.rows for j, s in stores.items()}, c)

    def cold_rows_total(self, mem) -> int:
        """Cold rows of every shard (in any process: the counts gathered when the view was installed)."""
        if jax.process_count() > 1:
            return int(_SHARD_COUNTS[mem.ext["cold"].ref.key].sum())
        return int(np.asarray(mem.ext["cold"].n).sum())

    def shard_cold_rows(self, mem, shard: int) -> Dict[str, np.ndarray]:
        return _store(mem.ext["cold"].ref.key, shard).all_rows(int(np.asarray(mem.t.addressable_data(0))))

    def save_shards(self, sharded, mem, name: str):
        stores = _STORES[mem.ext["cold"].ref.key]
        local = {j: s.reference() for j, s in stores.items()}
        return _allgather_json(sharded, local, mem)

    def restore_shards(self, sharded, mem, name, refs):
        if refs is None:
            raise CheckpointError(f"layer {name} was saved without disk tiers: restore it into a Sharded backend "
                                  f"without a tier (inner=None)")
        key = self.state.key_of(name)
        if key not in _STORES:
            mem = self.attach_shards(sharded, mem, name)
        stores = _STORES[key]
        for j, store in stores.items():
            _reopen(store, refs[j], f"{name} shard {j}")
        chunk = next(iter(stores.values())).tier.chunk_rows if stores else self._chunk_rows(mem)
        return self._install_shard_view(sharded, mem, key, {j: s.rows for j, s in stores.items()}, chunk)


def _reopen(store: ColdStore, ref: dict, name: str):
    """Point a store at the tier a checkpoint refers to, at the checkpoint's rows (checked, and
    verified against their checksums, before the rows written after the checkpoint are cut)."""
    fresh = ColdTier.checked(dict(ref, url=store.tier.url), name)
    fresh.truncate(int(ref["rows_cold"]))
    store.tier = fresh
    store._pending.clear()
    spill = ref.get("spill") or {}
    store.seg_start = np.asarray(spill.get("seg_start", ()), np.int64).reshape(-1)
    store.seg_t = np.asarray(spill.get("seg_t", ()), np.int64).reshape(-1)


def _allgather_counts(sharded, local: Dict[int, int], mem) -> np.ndarray:
    """``(S,)`` per-shard counts from the processes holding the shards."""
    return np.asarray(_allgather_json(sharded, {j: int(n) for j, n in local.items()}, mem), np.int64)


def _allgather_json(sharded, local: Dict[int, dict], mem) -> list:
    """Per-shard JSON-able values gathered to every process, as a list by shard."""
    s = sharded.n_shards
    if jax.process_count() == 1:
        return [local[j] for j in range(s)]
    out = {}
    for theirs in allgather_json({str(j): v for j, v in local.items()}):
        out.update(theirs)
    return [out[str(j)] for j in range(s)]


@functools.partial(jax.jit, donate_argnums=0, static_argnames=("step",))
def _shift_front(mem: memlib.Memory, n, *, step: int):
    """:func:`_drop_front` in place: the memory is donated and rows ``[n, size)`` move to the
    front ``step`` rows at a time (the last move shifted back to end at ``size``), then rows
    ``[size − n, size)`` are zeroed; no second table. Needs ``n ≥ step`` and
    ``size − n ≥ step`` (a move never reads a row an earlier move wrote)."""
    size = mem.size
    kept = size - n

    def shift(a):
        def move(i, a):
            src = jnp.minimum(n + i * step, size - step)
            return jax.lax.dynamic_update_slice_in_dim(a, jax.lax.dynamic_slice_in_dim(a, src, step, 0), src - n, 0)

        def clear(i, a):
            dst = jnp.minimum(kept + i * step, size - step)
            return jax.lax.dynamic_update_slice_in_dim(a, jnp.zeros((step,) + a.shape[1:], a.dtype), dst, 0)

        a = jax.lax.fori_loop(0, (kept + step - 1) // step, move, a)
        return jax.lax.fori_loop(0, (n + step - 1) // step, clear, a)

    return mem.replace(**{f: shift(getattr(mem, f)) for f in FIELDS}, size=kept.astype(jnp.int32))


@jax.jit
def _drop_front(mem: memlib.Memory, n):
    """The memory without its first ``n`` rows (the rows that spilled), compacted to the front."""
    return memlib.select(mem, jnp.arange(mem.capacity) >= n)
