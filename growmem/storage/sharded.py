"""A memory sharded along its row axis over a ``jax.sharding.Mesh``.

Layout: ``S`` shards (the size of the mesh axis ``axis``), each with capacity
``C`` rows. The global arrays are ``w:(S·C,)``, ``k:(S·C, d_in)``,
``v:(S·C, d_out)``, ``born:(S·C,)`` and ``sizes:(S,)``, all sharded
``PartitionSpec(axis)`` along the row axis, so shard ``s`` owns rows
``[s·C, (s+1)·C)`` of which its first ``sizes[s]`` are in use.

Retrieval runs under ``jax.shard_map``: each shard computes its partial result
over its own rows with the chunked kernels — for the weighted softmax the
partial ``(m, num, den)`` of :func:`growmem.kernels.weighted_softmax_parts`;
the partials are all-gathered along the mesh axis and merged with the
log-sum-exp rule (:func:`growmem.kernels.merge_parts`). Linear and RBF
partials are plain sums (``psum``). Only ``B·(d_out+2)`` numbers per shard
cross the interconnect; the rows never move.

Appends are decided on the host (which mirrors the per-shard sizes, so no
device sync is needed) and land ``round_robin`` (row ``i`` of the stream goes
to shard ``i mod S``) or on the ``least_filled`` shard (each row to the shard
with the fewest rows, ties to the lowest index). The scatter itself runs
inside ``shard_map``: every shard receives the (replicated) candidate rows and
keeps those addressed to it.

Multi-host: the same code runs under ``jax.distributed``. Call
``jax.distributed.initialize(coordinator, num_processes, process_id)`` in every
process, build the mesh over ``jax.devices()`` (all processes' devices), build
the memory with :meth:`ShardedMemory.from_shard_rows` where each process passes
only the rows of its own (addressable) shards, and call :meth:`retrieve` /
:meth:`append` with the same query / candidate batch in every process. On CPU
the cross-process collectives go through gloo
(``jax_cpu_collectives_implementation``); on GPU/TPU clusters through NCCL/ICI.

Checkpoints: ``Checkpointer.save(None, step, sharded={"mem": sm})`` writes the
row arrays as global ``jax.Array``s through Orbax (each process writes only its
own shards; nothing is gathered), and ``Checkpointer.restore(sharded_mesh=mesh)``
reads each shard straight onto its device of the target mesh — see
:mod:`growmem.storage.checkpoint`. Every process calls both.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import kernels
from .. import memory as memlib

PLACEMENTS = ("round_robin", "least_filled")
FIELDS = ("w", "k", "v", "born")


def row_mesh(n_devices: Optional[int] = None, axis: str = "rows", devices=None) -> Mesh:
    """A 1-D mesh over the first ``n_devices`` devices (all of them by default)."""
    devices = list(jax.devices() if devices is None else devices)
    if n_devices is not None:
        if n_devices > len(devices):
            raise ValueError(f"asked for {n_devices} devices but only {len(devices)} exist "
                             f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)")
        devices = devices[:n_devices]
    return Mesh(np.array(devices), (axis,))


def assign_shards(sizes: Sequence[int], n_rows: int, placement: str = "round_robin", start: int = 0) -> np.ndarray:
    """Host rule: the shard of each of ``n_rows`` new rows, ``(n_rows,)`` int.

    ``round_robin``: shards ``start, start+1, ...`` modulo S. ``least_filled``: each row to
    the currently least-filled shard (ties to the lowest index).
    """
    s = len(sizes)
    if placement == "round_robin":
        return (start + np.arange(n_rows)) % s
    if placement == "least_filled":
        fill = np.asarray(sizes, np.int64).copy()
        out = np.empty(n_rows, np.int64)
        for i in range(n_rows):
            j = int(np.argmin(fill))
            out[i] = j
            fill[j] += 1
        return out
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def _local_parts(spec, q, w, k, v, born, size, t):
    """The partial result of one shard's rows (inside shard_map)."""
    from .tiered import chunk_coeff

    coeff = chunk_coeff(spec, w, k, v, born, size, t)
    if spec.kernel == "weighted_softmax":
        return kernels.weighted_softmax_parts(q, k, v, w, temperature=spec.temperature, coeff=coeff, size=size,
                                              chunk=spec.chunk)
    return kernels.retrieve(spec.kernel, q, k, v, w, temperature=spec.temperature, coeff=coeff, size=size,
                            chunk=spec.chunk)


@functools.lru_cache(maxsize=None)
def _retrieve_fn(mesh: Mesh, axis: str, spec):
    row = P(axis)

    def local(q, w, k, v, born, sizes, t):
        part = _local_parts(spec, q, w, k, v, born, sizes[0], t)
        if spec.kernel == "weighted_softmax":
            m, num, den = part
            ms, nums, dens = (jax.lax.all_gather(a, axis) for a in (m, num, den))
            merged = kernels.merge_parts([(ms[i], nums[i], dens[i]) for i in range(ms.shape[0])])
            return kernels.finish_parts(merged)
        return jax.lax.psum(part, axis)

    f = jax.shard_map(local, mesh=mesh, in_specs=(P(), row, row, row, row, row, P()), out_specs=P(),
                      check_vma=False)
    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _append_fn(mesh: Mesh, axis: str):
    row = P(axis)

    def local(w, k, v, born, sizes, cw, ck, cv, cborn, shard, pos):
        me = jax.lax.axis_index(axis)
        cap = k.shape[0]
        idx = jnp.where(shard == me, pos, cap)  # rows for other shards are dropped
        mine = (shard == me).sum(dtype=sizes.dtype)
        return (w.at[idx].set(cw.astype(w.dtype), mode="drop"), k.at[idx].set(ck.astype(k.dtype), mode="drop"),
                v.at[idx].set(cv.astype(v.dtype), mode="drop"), born.at[idx].set(cborn, mode="drop"),
                sizes + mine)

    f = jax.shard_map(local, mesh=mesh, in_specs=(row,) * 5 + (P(),) * 6, out_specs=(row,) * 5, check_vma=False)
    return jax.jit(f, donate_argnums=(0, 1, 2, 3, 4))


@functools.lru_cache(maxsize=None)
def _allgather_fn(mesh: Mesh, axis: str):
    f = jax.shard_map(lambda x: jax.lax.all_gather(x, axis, tiled=True), mesh=mesh, in_specs=P(axis), out_specs=P(),
                      check_vma=False)
    return jax.jit(f)


@dataclasses.dataclass(frozen=True)
class RowShards:
    """A trainer memory's rows sharded along their axis over ``mesh`` (``Trainer.enable_sharding``).

    The memory keeps its usual layout — rows ``[0, size)`` in use, in order — with the row
    axis split into ``S`` contiguous blocks, so every memory and policy operation keeps its
    meaning (XLA partitions them); shard ``s`` holds rows ``[s·C/S, (s+1)·C/S)`` and at most
    ``C/S`` of the capacity. Retrieval and novelty search run under ``shard_map``: each shard
    works on its own rows in use only, and the partial results are merged (log-sum-exp rule,
    sum, or minimum). Shards fill in order, so while the memory is less than full the last
    shards idle: the memory is spread, not the work of a half-full memory.
    """

    mesh: Mesh
    axis: str = "rows"

    @property
    def n_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    def rows(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.axis))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def _local_size(self, size, capacity):
        per = capacity // self.n_shards
        return jnp.clip(size - jax.lax.axis_index(self.axis) * per, 0, per).astype(jnp.int32)

    def retrieve(self, mem, q, coeff):
        """The layer output over all shards' rows (replicated); differentiable like the unsharded kernels."""
        spec, axis, cap = mem.spec, self.axis, mem.capacity
        wsm = spec.kernel == "weighted_softmax"

        def local(q, w, k, v, c, size):
            n = self._local_size(size, cap)
            if wsm:
                m, num, den = kernels.weighted_softmax_parts(q, k, v, w, temperature=spec.temperature, coeff=c,
                                                             size=n, chunk=spec.chunk)
                ms, nums, dens = (jax.lax.all_gather(a, axis) for a in (m, num, den))
                merged = kernels.merge_parts([(ms[i], nums[i], dens[i]) for i in range(ms.shape[0])])
                return kernels.finish_parts(merged)
            return jax.lax.psum(kernels.retrieve(spec.kernel, q, k, v, w, temperature=spec.temperature, coeff=c,
                                                 size=n, chunk=spec.chunk), axis)

        if coeff is None:
            f = lambda q, w, k, v, size: local(q, w, k, v, None, size)
            args, specs = (q, mem.w, mem.k, mem.v, mem.size), (P(), P(axis), P(axis), P(axis), P())
        else:
            f = local
            args, specs = (q, mem.w, mem.k, mem.v, coeff, mem.size), (P(), P(axis), P(axis), P(axis), P(axis), P())
        return jax.shard_map(f, mesh=self.mesh, in_specs=specs, out_specs=P(), check_vma=False)(*args)

    def min_sq_distance(self, mem, q, chunk: int):
        """``(B,)``: ``min_j ‖q − k_j‖²`` over every shard's rows in use."""
        from ..policies import min_sq_distance

        axis, cap = self.axis, mem.capacity

        def local(q, k, size):
            return jax.lax.pmin(min_sq_distance(q, k, size=self._local_size(size, cap), chunk=chunk), axis)

        return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P(axis), P()), out_specs=P(),
                             check_vma=False)(q, mem.k, mem.size)

    def place(self, mem):
        """``mem`` with its row arrays sharded over the mesh and the rest replicated."""
        if mem.capacity % self.n_shards:
            raise ValueError(f"capacity {mem.capacity} does not split over {self.n_shards} shards")
        rows, rep = self.rows(), self.replicated()
        return mem.replace(w=jax.device_put(mem.w, rows), k=jax.device_put(mem.k, rows),
                           v=jax.device_put(mem.v, rows), born=jax.device_put(mem.born, rows),
                           size=jax.device_put(mem.size, rep), t=jax.device_put(mem.t, rep), shards=self)


def _global(mesh, spec_p, shape, dtype, fetch):
    """A global array from ``fetch(index) -> local block`` (works single- and multi-process)."""
    sharding = NamedSharding(mesh, spec_p)
    return jax.make_array_from_callback(tuple(shape), sharding, lambda idx: np.asarray(fetch(idx), dtype))


class ShardedMemory:
    """Rows of one growing layer sharded along the row axis (see the module docstring).

    Host object around global ``jax.Array``s; :meth:`retrieve` and :meth:`append` are
    jitted ``shard_map`` programs. ``spec`` is the layer's :class:`GrowingSpec` (kernel,
    temperature, momentum, chunk).
    """

    def __init__(self, mesh: Mesh, arrays: Dict[str, jax.Array], sizes: jax.Array, host_sizes, t, *, spec,
                 axis: str = "rows", placement: str = "round_robin", next_shard: int = 0):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.mesh, self.axis, self.spec, self.placement = mesh, axis, spec, placement
        self.w, self.k, self.v, self.born = (arrays[f] for f in FIELDS)
        self.sizes = sizes
        self.host_sizes = np.asarray(host_sizes, np.int64)
        self.t = jnp.asarray(t, jnp.int32)
        self.next_shard = int(next_shard)

    # -- construction
    @property
    def n_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    @property
    def capacity_per_shard(self) -> int:
        return int(self.k.shape[0]) // self.n_shards

    @property
    def d_in(self) -> int:
        return int(self.k.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.v.shape[1])

    @property
    def size(self) -> int:
        return int(self.host_sizes.sum())

    @classmethod
    def empty(cls, mesh: Mesh, d_in: int, d_out: int, capacity_per_shard: int = memlib.ROW_QUANTUM, *, spec,
              axis: str = "rows", placement: str = "round_robin", dtype=np.float32):
        return cls.from_shard_rows(mesh, {}, [0] * int(mesh.shape[axis]), d_in=d_in, d_out=d_out,
                                   capacity_per_shard=capacity_per_shard, spec=spec, axis=axis,
                                   placement=placement, dtype=dtype)

    @classmethod
    def from_shard_rows(cls, mesh: Mesh, shard_rows: Dict[int, Dict[str, np.ndarray]], sizes: Sequence[int], *,
                        d_in: int, d_out: int, spec, capacity_per_shard: Optional[int] = None, t: int = 0,
                        axis: str = "rows", placement: str = "round_robin", dtype=np.float32):
        """Build from per-shard rows. ``shard_rows[s]`` = ``{"w","k","v"[,"born"]}`` for shard ``s``;
        a process needs to pass only the shards on its own devices. ``sizes``: rows of every shard."""
        s = int(mesh.shape[axis])
        sizes = [int(n) for n in sizes]
        if len(sizes) != s:
            raise ValueError(f"sizes has {len(sizes)} entries but the mesh axis {axis!r} has {s} shards")
        cap = memlib.round_capacity(max(max(sizes), capacity_per_shard or 0))
        shapes = {"w": (), "k": (d_in,), "v": (d_out,), "born": ()}
        dtypes = {"w": dtype, "k": dtype, "v": dtype, "born": np.int32}

        def block(f, shard):
            out = np.zeros((cap,) + shapes[f], dtypes[f])
            if sizes[shard]:
                rows = shard_rows[shard]
                a = rows.get(f) if f != "born" else rows.get("born", np.full(sizes[shard], memlib.BORN_INITIAL))
                out[:sizes[shard]] = np.asarray(a).reshape((sizes[shard],) + shapes[f])
            return out

        def fetch(f):
            def get(idx):
                start = idx[0].start or 0
                stop = idx[0].stop if idx[0].stop is not None else s * cap
                return np.concatenate([block(f, j) for j in range(start // cap, stop // cap)])
            return get

        arrays = {f: _global(mesh, P(axis), (s * cap,) + shapes[f], dtypes[f], fetch(f)) for f in FIELDS}
        sz = np.asarray(sizes, np.int32)
        sizes_arr = _global(mesh, P(axis), (s,), np.int32, lambda idx: sz[idx])
        return cls(mesh, arrays, sizes_arr, sizes, t, spec=spec, axis=axis, placement=placement)

    @classmethod
    def from_global_arrays(cls, mesh: Mesh, arrays: Dict[str, jax.Array], host_sizes: Sequence[int], t, *, spec,
                           axis: str = "rows", placement: str = "round_robin", next_shard: int = 0):
        """Wrap global row arrays (``w, k, v, born``, each ``(S·C, ...)`` sharded ``P(axis)`` over
        ``mesh``, e.g. restored by Orbax); ``host_sizes``: rows in use of every shard."""
        s = int(mesh.shape[axis])
        host_sizes = [int(n) for n in host_sizes]
        if len(host_sizes) != s:
            raise ValueError(f"host_sizes has {len(host_sizes)} entries but the mesh axis {axis!r} has {s} shards")
        rows = {int(arrays[f].shape[0]) for f in FIELDS}
        if len(rows) != 1 or next(iter(rows)) % s:
            raise ValueError(f"row arrays of {sorted(rows)} rows cannot be split into {s} equal shards")
        cap = next(iter(rows)) // s
        if max(host_sizes, default=0) > cap:
            raise ValueError(f"host_sizes {host_sizes} exceed the capacity per shard {cap}")
        sz = np.asarray(host_sizes, np.int32)
        sizes_arr = _global(mesh, P(axis), (s,), np.int32, lambda idx: sz[idx])
        return cls(mesh, dict(arrays), sizes_arr, host_sizes, t, spec=spec, axis=axis, placement=placement,
                   next_shard=next_shard)

    @classmethod
    def from_memory(cls, mem: memlib.Memory, mesh: Mesh, *, axis: str = "rows", placement: str = "round_robin",
                    capacity_per_shard: Optional[int] = None):
        """Distribute the rows of an unsharded memory over the mesh (single process)."""
        rows = mem.rows()
        n = len(rows["w"])
        s = int(mesh.shape[axis])
        shard = assign_shards([0] * s, n, placement)
        shard_rows = {j: {f: rows[f][shard == j] for f in FIELDS} for j in range(s)}
        sizes = [int((shard == j).sum()) for j in range(s)]
        out = cls.from_shard_rows(mesh, shard_rows, sizes, d_in=mem.d_in, d_out=mem.d_out, spec=mem.spec,
                                  capacity_per_shard=capacity_per_shard, t=int(mem.t), axis=axis,
                                  placement=placement, dtype=np.dtype(mem.k.dtype))
        out.next_shard = n % s
        return out

    # -- operations
    def replicated(self, x) -> jax.Array:
        """``x`` as a global array replicated over the mesh (every process passes the same ``x``)."""
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, NamedSharding(self.mesh, P()), lambda idx: x[idx])

    def retrieve(self, q, t=None) -> jax.Array:
        """``(B, d_out)``: retrieval over all shards' rows, replicated over the mesh."""
        q = q if isinstance(q, jax.Array) and jax.process_count() > 1 else self.replicated(q)
        t = self.t if t is None else jnp.asarray(t, jnp.int32)
        f = _retrieve_fn(self.mesh, self.axis, self.spec)
        return f(q, self.w, self.k, self.v, self.born, self.sizes, self.replicated(np.asarray(t)))

    def _grow(self, need_per_shard: int):
        """Host op: grow every shard's capacity geometrically to hold ``need_per_shard`` rows."""
        s, cap = self.n_shards, self.capacity_per_shard
        new = memlib.round_capacity(max(need_per_shard, 2 * cap))
        sh = NamedSharding(self.mesh, P(self.axis))

        @functools.partial(jax.jit, out_shardings=sh)
        def pad(a):
            a = a.reshape((s, cap) + a.shape[1:])
            a = jnp.pad(a, [(0, 0), (0, new - cap)] + [(0, 0)] * (a.ndim - 2))
            return a.reshape((s * new,) + a.shape[2:])

        self.w, self.k, self.v, self.born = (pad(a) for a in (self.w, self.k, self.v, self.born))

    def append(self, w, k, v, born=None, mask=None):
        """Append candidate rows (``mask`` selects them) to the shards chosen by the placement rule.

        Every process must call this with the same candidates. Returns the shard of each
        appended row (host ``numpy``).
        """
        w, k, v = np.asarray(w), np.asarray(k), np.asarray(v)
        b = k.shape[0]
        born = np.broadcast_to(np.asarray(int(self.t) + 1 if born is None else born, np.int32), (b,))
        mask = np.ones(b, bool) if mask is None else np.asarray(mask, bool)
        sel = np.flatnonzero(mask)
        shard = assign_shards(self.host_sizes, len(sel), self.placement, self.next_shard)
        pos = np.empty(len(sel), np.int64)
        fill = self.host_sizes.copy()
        for i, j in enumerate(shard):
            pos[i] = fill[j]
            fill[j] += 1
        if fill.max(initial=0) > self.capacity_per_shard:
            self._grow(int(fill.max()))
        full_shard = np.full(b, -1, np.int32)
        full_pos = np.zeros(b, np.int32)
        full_shard[sel], full_pos[sel] = shard, pos
        rep = self.replicated
        f = _append_fn(self.mesh, self.axis)
        self.w, self.k, self.v, self.born, self.sizes = f(
            self.w, self.k, self.v, self.born, self.sizes, rep(w.astype(np.dtype(self.k.dtype))),
            rep(k.astype(np.dtype(self.k.dtype))), rep(v.astype(np.dtype(self.k.dtype))), rep(born),
            rep(full_shard), rep(full_pos))
        self.host_sizes = fill
        if self.placement == "round_robin":
            self.next_shard = (self.next_shard + len(sel)) % self.n_shards
        return shard

    def advance(self, steps: int = 1):
        """Advance the memory's clock (momentum coefficients use it)."""
        self.t = self.t + steps

    def shard_rows(self, shard: int) -> Dict[str, np.ndarray]:
        """Host copy of the rows in use of one addressable shard."""
        cap, n = self.capacity_per_shard, int(self.host_sizes[shard])
        out = {}
        for f in FIELDS:
            a = getattr(self, f)
            for piece in a.addressable_shards:
                if (piece.index[0].start or 0) == shard * cap:
                    out[f] = np.asarray(piece.data)[:n]
                    break
            else:
                raise ValueError(f"shard {shard} is not addressable from process {jax.process_index()}")
        return out

    def addressable_shard_ids(self) -> list:
        """Indices of the shards held by this process's devices (sorted)."""
        cap = self.capacity_per_shard
        return sorted({(piece.index[0].start or 0) // cap for piece in self.k.addressable_shards})

    def local_blocks(self, field: str) -> Dict[int, np.ndarray]:
        """``{shard: host copy of its whole block (capacity rows, padding included)}`` for the
        addressable shards of one field."""
        cap = self.capacity_per_shard
        return {(piece.index[0].start or 0) // cap: np.asarray(piece.data)
                for piece in getattr(self, field).addressable_shards}

    def allgather_per_shard(self, local: Dict[int, np.ndarray]) -> np.ndarray:
        """Small per-shard values to every process: ``local[s]`` (same shape and dtype for
        every shard) given by the process holding shard ``s``; returns ``(S, ...)`` with all
        shards' values. A collective: every process must call it."""
        s = self.n_shards
        mine = self.addressable_shard_ids()
        if sorted(local) != mine:
            raise ValueError(f"process {jax.process_index()} holds shards {mine} but passed values for {sorted(local)}")
        first = np.asarray(local[mine[0]])
        if jax.process_count() == 1:
            return np.stack([np.asarray(local[j], first.dtype) for j in range(s)])
        x = _global(self.mesh, P(self.axis), (s,) + first.shape, first.dtype,
                    lambda idx: np.stack([np.asarray(local[j], first.dtype)
                                          for j in range(idx[0].start or 0, idx[0].stop or s)]))
        return np.asarray(_allgather_fn(self.mesh, self.axis)(x).addressable_data(0))

    def to_memory(self) -> memlib.Memory:
        """Gather every shard's rows into one unsharded memory (shard order; single process)."""
        rows = [self.shard_rows(j) for j in range(self.n_shards)]
        cat = {f: np.concatenate([r[f] for r in rows]) for f in FIELDS}
        mem = memlib.from_rows(cat["w"], cat["k"], cat["v"], cat["born"], spec=self.spec)
        return mem.replace(t=jnp.asarray(self.t, jnp.int32))
