"""A memory whose rows are split over the devices of a mesh — in one process or many.

Layout: ``S`` shards (the size of the mesh axis), each a block of ``Cs`` rows of the row
arrays ``w:(S·Cs,)``, ``k:(S·Cs, d_in)``, ``v:(S·Cs, d_out)``, ``born:(S·Cs,)``, sharded
``PartitionSpec(axis)`` so shard ``s`` lives on device ``s`` and holds rows
``[s·Cs, s·Cs + size[s])`` in use: ``mem.size`` is the ``(S,)`` vector of rows per shard
(replicated), ``mem.ext`` the next shard of the round-robin placement.

* **Retrieval and novelty** run under ``jax.shard_map``: every shard reduces the kernel over
  its own rows in use (:func:`growmem.kernels.reduce`; plus its own disk tier when the backend
  is tiered), the partials are all-gathered (``B·(d_out+2)`` numbers per shard; rows never
  move) and merged by the kernel's log-sum-exp rule; novelty takes the minimum (``pmin``).
* **Appends** place each admitted row ``round_robin`` (row ``i`` of the stream to shard
  ``(next + i) mod S``) or on the ``least_filled`` shard (ties to the lowest index), so the
  shards fill evenly and so does the work. Evictions compact each shard's kept rows in order.
* **Capacity** grows per shard (every block padded geometrically; rows never change device).
* **Across processes**: the same code runs under ``jax.distributed``: build the mesh over
  ``jax.devices()`` (all processes' devices), feed every process the same batches (the
  trainer makes them global arrays), and every process holds, computes on and checkpoints
  only its own shards. On CPU hosts the collectives go through gloo
  (``jax_cpu_collectives_implementation``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import kernels
from .. import memory as memlib
from ..errors import CheckpointError, ConfigError, ConfigMismatchError, WrongTypeError
from . import RAM, _temperature

PLACEMENTS = ("round_robin", "least_filled")


def row_mesh(n_devices: Optional[int] = None, axis: str = "rows", devices=None) -> Mesh:
    """A 1-D mesh over the first ``n_devices`` devices (all of them, every process's, by default)."""
    devices = list(jax.devices() if devices is None else devices)
    if n_devices is not None:
        if n_devices > len(devices):
            raise ConfigError(f"asked for {n_devices} devices but only {len(devices)} exist "
                              f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)")
        devices = devices[:n_devices]
    return Mesh(np.array(devices), (axis,))


def assign_shards(sizes: Sequence[int], n_rows: int, placement: str = "round_robin", start: int = 0) -> np.ndarray:
    """Host version of the placement rule: the shard of each of ``n_rows`` new rows.

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
    raise ConfigError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def _global(mesh, spec_p, x) -> jax.Array:
    """``x`` (the same host array in every process) as a global array with the given spec."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec_p), lambda idx: x[idx], dtype=x.dtype)


@functools.lru_cache(maxsize=None)
def _replicator(sharding):
    """The identity compiled to gather its input into ``sharding`` (replicated): one program per mesh,
    not one per call."""
    return jax.jit(lambda a: a, out_shardings=sharding)


def host_value(a) -> np.ndarray:
    """A host copy of a replicated (or fully addressable) array, in any process."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return np.asarray(a.addressable_data(0))
    return np.asarray(a)


#: what Sharded asks of its ``inner``, per shard (InRAM and Tiered answer them)
_SHARD_CALLS = ("register", "attach_shards", "spill_shards", "cold_rows_total", "shard_cold_rows", "save_shards",
                "restore_shards")


@dataclasses.dataclass(frozen=True)
class InRAM:
    """Every row of a shard in RAM: what :class:`Sharded` holds inside without a tier (``inner=None``). It
    answers the per-shard calls a :class:`growmem.backends.tiered.Tiered` answers, with no RAM budget and
    nothing to spill, count, save or restore."""

    hot_rows_per_layer = None   # no RAM budget: a shard's block grows as its rows do

    def register(self, mem, name: str):
        return None

    def attach_shards(self, sharded, mem, name: str):
        return mem

    def spill_shards(self, sharded, mem, extra: int):
        return None

    def cold_rows_total(self, mem) -> int:
        return 0

    def shard_cold_rows(self, mem, shard: int):
        return None

    def save_shards(self, sharded, mem, name: str):
        return None

    def restore_shards(self, sharded, mem, name, refs):
        if refs is not None:      # its cold rows would be lost
            raise CheckpointError(f"layer {name} was saved with its older rows on disk tiers: restore it into "
                                  f"Sharded(inner=Tiered(...)), not an all-in-RAM Sharded backend")
        return mem


@dataclasses.dataclass(frozen=True, eq=False)
class Sharded(RAM):
    """Rows split over the devices of ``mesh`` along ``axis`` (module docstring).

    ``placement``: ``round_robin`` | ``least_filled``. ``inner``: where each shard keeps its rows — all
    in RAM (:class:`InRAM`, the default), or a :class:`growmem.backends.tiered.Tiered` whose RAM budget
    applies to every shard: each shard keeps its newest rows on its device and spills the rest to its
    own disk tier (``directory/<layer>/shard-<s>``); retrieval merges hot and cold partials on each
    shard, then across shards, with the same rule.
    """

    mesh: Any = None
    axis: str = "rows"
    placement: str = "round_robin"
    inner: Any = None

    name = "sharded"

    def __post_init__(self):
        if self.inner is None:
            object.__setattr__(self, "inner", InRAM())
        missing = [c for c in _SHARD_CALLS if not callable(getattr(self.inner, c, None))]
        if missing:
            raise WrongTypeError(f"Sharded(inner=...) takes None (every row in RAM) or a growmem.backends.tiered.Tiered "
                                 f"(a disk tier per shard), not {type(self.inner).__name__}: it lacks {missing}")
        if self.mesh is None:
            object.__setattr__(self, "mesh", row_mesh(axis=self.axis))
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.axis not in self.mesh.shape:
            raise ConfigError(f"the mesh has axes {tuple(self.mesh.shape)}, not {self.axis!r}")

    def __repr__(self):
        return f"Sharded({self.n_shards} shards, {self.placement}{'' if isinstance(self.inner, InRAM) else ', tiered'})"

    def __eq__(self, other):
        return (type(other) is type(self) and other.mesh == self.mesh and other.axis == self.axis
                and other.placement == self.placement and other.inner == self.inner)

    def __hash__(self):
        return hash((type(self), self.mesh, self.axis, self.placement, self.inner))

    @property
    def n_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    def rows_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.axis))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    # ------------------------------------------------------------------ layout helpers
    def block(self, mem) -> int:
        """Rows per shard (``Cs``)."""
        return mem.capacity // self.n_shards

    def _sizes(self, mem):
        return mem.size

    def valid_mask(self, mem):
        cs = self.block(mem)
        idx = jnp.arange(mem.capacity)
        return (idx % cs) < mem.size[idx // cs]

    # ------------------------------------------------------------------ inside a jitted step
    def _shard_map(self, fn, in_specs, out_specs):
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)

    def reduce(self, kern, mem, q, coeff_fn, *, row_grads: bool):
        axis, spec = self.axis, mem.spec
        temperature = _temperature(mem)
        chunk = spec.chunk if spec is not None else kernels.DEFAULT_CHUNK
        tier = self.inner
        cold = mem.ext.get("cold") if isinstance(mem.ext, dict) else None     # a tier's rows on disk, if any

        def local(q, w, k, v, born, size, t, *cold_args):
            coeff = None if coeff_fn is None else coeff_fn(born, t)
            p = kernels.reduce(kern, q, k, v, w, temperature=temperature, coeff=coeff, size=size[0], chunk=chunk,
                               row_grads=row_grads)
            if cold is not None:
                shard = lax.axis_index(axis)
                p = kernels.merge(tier.cold_partial(kern, cold_args[0], shard, q, t, coeff_fn, temperature), p)
            return kernels.merge_across(p, axis)

        row = P(axis)
        args = [q, mem.w, mem.k, mem.v, mem.born, mem.size, mem.t]
        specs = [P(), row, row, row, row, row, P()]
        if cold is not None:
            args.append(cold)
            specs.append(row)
        return self._shard_map(local, tuple(specs), P())(*args)

    def min_sq_distance(self, mem, q, chunk: int = kernels.NOVELTY_CHUNK):
        axis, tier = self.axis, self.inner
        cold = mem.ext.get("cold") if isinstance(mem.ext, dict) else None

        def local(q, k, size, *cold_args):
            d2 = kernels.min_sq_distance(q, k, size=size[0], chunk=chunk)
            if cold is not None:
                d2 = jnp.minimum(d2, tier.cold_min_sq_distance(cold_args[0], lax.axis_index(axis), q))
            return lax.pmin(d2, axis)

        args, specs = [q, mem.k, mem.size], [P(), P(axis), P(axis)]
        if cold is not None:
            args.append(cold)
            specs.append(P(axis))
        return self._shard_map(local, tuple(specs), P())(*args)

    def _placement(self, mem, mask):
        """``(dest (B,), new sizes (S,), next)``: where each admitted candidate goes."""
        s, cs, cap = self.n_shards, self.block(mem), mem.capacity
        b = mask.shape[0]
        size = mem.size
        rank = jnp.cumsum(mask.astype(jnp.int32)) - 1
        n = mask.sum(dtype=jnp.int32)
        nxt = mem.ext["next"]
        if self.placement == "round_robin":
            shard = (nxt + rank) % s
            onehot = (shard[:, None] == jnp.arange(s)[None, :]) & mask[:, None]
            before = jnp.cumsum(onehot.astype(jnp.int32), axis=0) - onehot.astype(jnp.int32)
            offset = jnp.take_along_axis(before, shard[:, None], axis=1)[:, 0]
            nxt = (nxt + n) % s
        else:
            def body(i, carry):
                fill, shard, offset = carry
                j = jnp.argmin(fill).astype(jnp.int32)
                take = mask[i]
                shard = shard.at[i].set(j)
                offset = offset.at[i].set(fill[j] - size[j])
                fill = fill.at[j].add(take.astype(jnp.int32))
                return fill, shard, offset

            _, shard, offset = lax.fori_loop(0, b, body, (size, jnp.zeros(b, jnp.int32), jnp.zeros(b, jnp.int32)))
            onehot = (shard[:, None] == jnp.arange(s)[None, :]) & mask[:, None]
        local = size[shard] + offset
        fits = mask & (local < cs)
        dest = jnp.where(fits, shard * cs + local, cap)
        counts = jnp.sum(onehot & fits[:, None], axis=0, dtype=jnp.int32)
        return dest, size + counts, nxt

    def append(self, mem, w, k, v, born, mask=None):
        mem, _ = self._append(mem, w, k, v, born, mask, ())
        return mem

    def _append(self, mem, w, k, v, born, mask, extra):
        b = k.shape[0]
        mask = jnp.ones((b,), bool) if mask is None else jnp.asarray(mask, bool)
        born = jnp.broadcast_to(jnp.asarray(born, jnp.int32), (b,))
        dest, sizes, nxt = self._placement(mem, mask)
        out = mem.replace(
            w=mem.w.at[dest].set(jnp.asarray(w, mem.w.dtype), mode="drop"),
            k=mem.k.at[dest].set(jnp.asarray(k).astype(mem.k.dtype), mode="drop"),
            v=mem.v.at[dest].set(jnp.asarray(v).astype(mem.v.dtype), mode="drop"),
            born=mem.born.at[dest].set(born, mode="drop"), size=sizes,
            ext={**mem.ext, "next": nxt})
        extra = [a.at[dest].set(jnp.zeros((b,) + a.shape[1:], a.dtype), mode="drop") for a in extra]
        return out, extra

    def compact_blocks(self, arrays, keep, size, cs):
        """Each shard's kept rows moved to the front of its block, in order (also the tier's spill: what
        stays hot after the oldest rows went to disk)."""
        s = self.n_shards
        idx = jnp.arange(s * cs)
        valid = (idx % cs) < size[idx // cs]
        keep = (keep & valid).reshape(s, cs)
        pos = jnp.cumsum(keep.astype(jnp.int32), axis=1) - 1
        dest = jnp.where(keep, pos + (jnp.arange(s) * cs)[:, None], s * cs).reshape(-1)
        return [jnp.zeros_like(a).at[dest].set(a, mode="drop") for a in arrays], keep.sum(axis=1, dtype=jnp.int32)

    def evict_and_append(self, mem, keep, w, k, v, born, mask, extra=(), extra_new=()):
        if any(n is not None for n in extra_new):
            raise ConfigError("a policy that sets the per-row state of new rows (labels(), capacity(on_full="
                              "'evict_balanced' or 'merge')) runs on memories in RAM (backends.RAM), not on sharded ones")
        cs = self.block(mem)
        arrays, sizes = self.compact_blocks([mem.w, mem.k, mem.v, mem.born, *extra], keep, mem.size, cs)
        mem = mem.replace(w=arrays[0], k=arrays[1], v=arrays[2], born=arrays[3], size=sizes)
        return self._append(mem, w, k, v, born, mask, arrays[4:])

    # ------------------------------------------------------------------ on the host
    def place(self, x):
        """A state leaf replicated over the mesh (a global array in every process)."""
        if not isinstance(x, (jax.Array, np.ndarray)) or isinstance(x, jax.core.Tracer):
            return x
        if isinstance(x, jax.Array) and getattr(x.sharding, "mesh", None) == self.mesh:
            if x.sharding.is_fully_replicated:
                return x
            # split over the mesh (a per-shard count summed on the host side of a spill): gathered, in every
            # process at once, so that host_value reads the whole of it, not this process's piece
            return _replicator(self.replicated())(x)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = jax.random.key_data(x)
            return jax.random.wrap_key_data(self.place(data), impl=jax.random.key_impl(x))
        return _global(self.mesh, P(), host_value(x))

    def place_rows(self, a):
        if not isinstance(a, (jax.Array, np.ndarray)) or isinstance(a, jax.core.Tracer):
            return a
        sh = self.rows_sharding()
        if isinstance(a, jax.Array) and a.sharding == sh:
            return a
        return jax.make_array_from_callback(a.shape, sh, lambda idx, a=host_value(a): a[idx], dtype=a.dtype)

    def register(self, mem, name: str = "memory"):
        self.inner.register(mem, name)

    def attach(self, mem, name: str = "memory"):
        """Distribute a fresh (unsharded) memory's rows over the shards by the placement rule."""
        if memlib.ROW_QUANTUM % self.n_shards:
            raise ConfigError(f"a mesh axis of {self.n_shards} devices does not divide the row quantum "
                              f"{memlib.ROW_QUANTUM}: use a power of two")
        if isinstance(mem.size, jax.Array) and mem.size.ndim == 1:      # already sharded rows (a restore)
            return self.place_memory(mem.replace(backend=self))
        rows = mem.rows()
        cs = mem.capacity // self.n_shards
        hot = self.inner.hot_rows_per_layer
        if hot is not None:   # preallocated past a shard's RAM budget: give the room back (as Tiered.attach)
            cs = min(cs, memlib.round_capacity(hot))
        return self.from_rows(rows, spec=mem.spec, t=int(mem.t), capacity_per_shard=cs, policy=mem.policy, name=name)

    def from_rows(self, rows: Dict[str, np.ndarray], *, spec, t: int = 0, capacity_per_shard: int = 0,
                  policy=None, name: str = "memory", next_shard: Optional[int] = None):
        """A memory holding ``rows`` (every row, the same in every process), placed by the rule."""
        n = len(rows["w"])
        shard = assign_shards([0] * self.n_shards, n, self.placement)
        shard_rows = {j: {f: rows[f][shard == j] for f in memlib.FIELDS} for j in range(self.n_shards)}
        sizes = [int((shard == j).sum()) for j in range(self.n_shards)]
        d_in, d_out = rows["k"].shape[1], rows["v"].shape[1]
        return self.from_shard_rows(shard_rows, sizes, d_in=d_in, d_out=d_out, spec=spec, t=t, policy=policy,
                                    capacity_per_shard=capacity_per_shard, row_dtype=rows["k"].dtype,
                                    next_shard=n % self.n_shards if next_shard is None else next_shard, name=name)

    def from_shard_rows(self, shard_rows: Dict[int, Dict[str, np.ndarray]], sizes: Sequence[int], *, d_in: int,
                        d_out: int, spec, t: int = 0, capacity_per_shard: int = 0, policy=None, row_dtype=np.float32,
                        next_shard: int = 0, name: str = "memory"):
        """A memory from per-shard rows: ``shard_rows[s] = {"w","k","v"[,"born"]}``; a process needs
        to pass only the shards on its own devices. ``sizes``: rows in use of every shard."""
        s = self.n_shards
        sizes = [int(n) for n in sizes]
        if len(sizes) != s:
            raise ConfigError(f"sizes has {len(sizes)} entries but the mesh axis {self.axis!r} has {s} shards")
        cs = memlib.round_capacity(max(max(sizes, default=0), capacity_per_shard or 0), memlib.ROW_QUANTUM)
        shapes = {"w": (), "k": (d_in,), "v": (d_out,), "born": ()}
        dtypes = {"w": np.float32, "k": np.dtype(row_dtype), "v": np.dtype(row_dtype), "born": np.int32}

        def block(f, j):
            out = np.zeros((cs,) + shapes[f], dtypes[f])
            if sizes[j]:
                rows = shard_rows[j]
                a = rows.get(f) if f != "born" else rows.get("born", np.full(sizes[j], memlib.BORN_INITIAL))
                out[:sizes[j]] = np.asarray(a).reshape((sizes[j],) + shapes[f])
            return out

        def fetch(f):
            def get(idx):
                start = idx[0].start or 0
                stop = idx[0].stop if idx[0].stop is not None else s * cs
                return np.concatenate([block(f, j) for j in range(start // cs, stop // cs)])
            return get

        sh = self.rows_sharding()
        arrays = {f: jax.make_array_from_callback((s * cs,) + shapes[f], sh, fetch(f), dtype=dtypes[f])
                  for f in memlib.FIELDS}
        mem = memlib.Memory(**arrays, size=_global(self.mesh, P(), np.asarray(sizes, np.int32)),
                            t=_global(self.mesh, P(), np.asarray(t, np.int32)),
                            ext={"next": _global(self.mesh, P(), np.asarray(next_shard, np.int32))},
                            spec=spec, policy=policy, backend=self)
        return self.inner.attach_shards(self, mem, name)

    def place_memory(self, mem):
        """Row arrays sharded, the rest replicated (after a host-side change, here or in the tier)."""
        rows = {f: self.place_rows(getattr(mem, f)) for f in memlib.FIELDS}
        return mem.replace(**rows, size=self.place(mem.size), t=self.place(mem.t),
                           ext=jax.tree.map(self.place, mem.ext))

    def resize_rows(self, a, old: int, new: int):
        """A per-row array of ``old`` rows (S blocks) padded to ``new`` rows (S blocks), sharded."""
        s = self.n_shards
        cs, ns = old // s, new // s

        @functools.partial(jax.jit, out_shardings=self.rows_sharding())
        def pad(a):
            a = a.reshape((s, cs) + a.shape[1:])
            a = jnp.pad(a, [(0, 0), (0, ns - cs)] + [(0, 0)] * (a.ndim - 2))
            return a.reshape((s * ns,) + a.shape[2:])

        return pad(a)

    def fill(self, mem) -> int:
        """Rows in use of the fullest shard (the bound a step must stay under)."""
        return int(host_value(mem.size).max(initial=0))

    def prepare(self, mem, extra: int, bound: int, growth: float = 2.0, limit=None):
        # limit (a capacity policy's max_rows) is not used: shards fill unevenly after evictions
        cs = self.block(mem)
        hot = self.inner.hot_rows_per_layer
        exact = None
        if hot is not None and bound + extra > hot:
            # the RAM budget first (as Tiered.prepare): a shard whose rows would pass it spills, whatever room
            # its block has left
            exact = self.fill(mem)
            if exact + extra > hot:
                spilled = self.inner.spill_shards(self, mem, extra)
                if spilled is not None:
                    return spilled, self.fill(spilled)
            bound = exact
        if bound + extra <= cs:
            return mem, exact
        exact = self.fill(mem)
        if exact + extra <= cs:
            return mem, exact
        new_cs = memlib.round_capacity(max(exact + extra, int(np.ceil(cs * growth))))
        if hot is not None:         # a block never grows past the budget (exact + extra <= hot here)
            new_cs = max(memlib.round_capacity(exact + extra), min(new_cs, memlib.round_capacity(hot)))
        new_cap = new_cs * self.n_shards
        grown = mem.replace(**{f: self.resize_rows(getattr(mem, f), mem.capacity, new_cap) for f in memlib.FIELDS})
        return grown, exact

    def hot_rows(self, mem) -> int:
        return int(host_value(mem.size).sum())

    def rows_in_use(self, mem) -> int:
        hot = self.hot_rows(mem)
        return hot + self.inner.cold_rows_total(mem)

    def cold_rows(self, mem) -> int:
        return self.inner.cold_rows_total(mem)

    def host_sizes(self, mem) -> np.ndarray:
        return host_value(mem.size).astype(np.int64)

    def local_blocks(self, mem, field: str) -> Dict[int, np.ndarray]:
        """``{shard: host copy of its whole block}`` for the shards on this process's devices."""
        cs = self.block(mem)
        return {(piece.index[0].start or 0) // cs: np.asarray(piece.data)
                for piece in getattr(mem, field).addressable_shards}

    def shard_rows(self, mem, shard: int) -> Dict[str, np.ndarray]:
        """Host copy of the rows in use (hot) of one shard on this process's devices."""
        n = int(self.host_sizes(mem)[shard])
        out = {}
        for f in memlib.FIELDS:
            blocks = self.local_blocks(mem, f)
            if shard not in blocks:
                raise ConfigError(f"shard {shard} is not on the devices of process {jax.process_index()}")
            out[f] = blocks[shard][:n]
        return out

    def host_rows(self, mem) -> Dict[str, np.ndarray]:
        """Every row, shard by shard (cold rows of a shard first): gathers every shard into
        this process, so it needs a single process."""
        if jax.process_count() > 1:
            raise ConfigError("gathering the rows of a memory sharded over several processes into one needs a "
                              f"single process (this is process {jax.process_index()} of {jax.process_count()})")
        parts = []
        for j in range(self.n_shards):
            parts += [self.inner.shard_cold_rows(mem, j), self.shard_rows(mem, j)]
        return {f: np.concatenate([p[f] for p in parts if p is not None]) for f in memlib.FIELDS}

    # ------------------------------------------------------------------ checkpoints
    def save(self, name: str, mem):
        """The whole row arrays as global arrays (each process writes its own shards) and the
        per-shard sizes, placement and next shard (+ each shard's tier reference)."""
        arrays = {f: self.place_rows(getattr(mem, f)) for f in memlib.FIELDS}   # split along rows, always
        meta = {"backend": self.name, "n_shards": self.n_shards, "capacity_per_shard": self.block(mem),
                "host_sizes": self.host_sizes(mem).tolist(), "placement": self.placement,
                "next_shard": int(host_value(mem.ext["next"]))}
        tiers = self.inner.save_shards(self, mem, name)
        if tiers is not None:
            meta["tiers"] = tiers
        return arrays, meta

    def check_restore(self, meta: dict, name: str):
        """Refuse, before any I/O, what this backend cannot restore: another shard count across
        processes."""
        saved = int(meta.get("n_shards", 1)) if meta.get("backend") == self.name else None
        if saved is not None and saved != self.n_shards and jax.process_count() > 1:
            raise ConfigMismatchError(
                f"memory {name} was saved with {saved} shards but the target mesh has {self.n_shards}; "
                f"re-distributing rows onto another shard count is single-process only — restore onto a mesh with "
                f"{saved} shards")

    def restore_args(self, meta: dict, template):
        """Orbax restore arguments that put every saved row array straight onto this mesh."""
        import orbax.checkpoint as ocp

        if int(meta["n_shards"]) != self.n_shards:
            return None
        sh = self.rows_sharding()
        cap = int(meta["capacity_per_shard"]) * self.n_shards
        shapes = {"w": (cap,), "k": (cap, template.d_in), "v": (cap, template.d_out), "born": (cap,)}
        return {f: ocp.ArrayRestoreArgs(sharding=sh, global_shape=shapes[f]) for f in memlib.FIELDS}

    def restore(self, name: str, meta: dict, arrays: Dict[str, Any], template):
        sizes = [int(n) for n in meta["host_sizes"]]
        if int(meta["n_shards"]) == self.n_shards:
            mem = template.replace(**{f: arrays[f] for f in memlib.FIELDS},
                                   size=_global(self.mesh, P(), np.asarray(sizes, np.int32)),
                                   t=_global(self.mesh, P(), np.asarray(meta["t"], np.int32)),
                                   ext={"next": _global(self.mesh, P(), np.asarray(meta["next_shard"], np.int32))},
                                   backend=self)
        else:   # another shard count: gather (single process) and place again by the rule
            cs = int(meta["capacity_per_shard"])
            rows = {f: np.concatenate([np.asarray(arrays[f])[j * cs:j * cs + n] for j, n in enumerate(sizes)])
                    for f in memlib.FIELDS}
            mem = self.from_rows(rows, spec=template.spec, t=int(meta["t"]), policy=template.policy, name=name)
        mem = self.place_memory(mem)   # arrays saved whole (one shard) come back as host arrays
        return self.inner.restore_shards(self, mem, name, meta.get("tiers"))
