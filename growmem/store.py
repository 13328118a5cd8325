"""A memory outside any trainer, on any backend (:mod:`growmem.backends`).

The same backend objects serve :class:`growmem.Trainer` and a :class:`Store`::

    from growmem.backends import RAM
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.backends.tiered import Tiered

    store = Store.create(spec, d_in=1024, d_out=16, backend=Tiered("/data/mem", ram_budget_bytes=1 << 30))
    store.append(w, k, v)            # host: make room (grow / spill), then a jitted append; rows that
                                     # are not finite are dropped and counted (store.dropped_nonfinite)
    y = store.retrieve(q)            # every row, wherever it lives
    mask = store.novel(k_new, tau)   # the novelty test of the hybrid rule (Alg. 4), over every row
    store.advance()                  # the clock (momentum and decay coefficients use it)

``Store.from_shard_rows(Sharded(mesh), ...)`` builds a memory sharded over several processes
(``jax.distributed``), each passing only its own shards' rows; :class:`growmem.checkpoint.Checkpointer`
saves and restores stores by name (``save(..., stores={"mem": store})``).
"""
from __future__ import annotations

import functools
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ConfigError
from . import backends, kernels
from . import memory as memlib
from . import policies
from .backends.sharded import Sharded, assign_shards, host_value


@jax.jit
def _retrieve(mem, q, t):
    kern = kernels.get(mem.spec.kernel)
    mem = mem.replace(t=t)
    return kern.finish(backends.of(mem).reduce(kern, mem, q, policies.coefficient_fn(mem.spec, mem.policy),
                                               row_grads=False))


@functools.partial(jax.jit, donate_argnums=0)
def _append(mem, w, k, v, born, mask):
    # the memory is donated: the rows are written into its tables in place, not into a copy of them
    return backends.of(mem).append(mem, w, k, v, born, mask)


@jax.jit
def _min_d2(mem, q):
    return backends.min_sq_distance(mem, q)


class Store:
    """One memory and its backend, driven from the host (module docstring)."""

    def __init__(self, mem: memlib.Memory, name: str = "memory"):
        self.mem = mem
        self.name = name
        self._bound = self.backend.fill(mem)
        #: candidate rows :meth:`append` refused because a value of theirs was NaN or infinite
        self.dropped_nonfinite = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, spec, d_in: int, d_out: int, *, backend=None, capacity: int = memlib.ROW_QUANTUM,
               name: str = "memory", policy=None) -> "Store":
        mem = memlib.empty(d_in, d_out, capacity, row_dtype=memlib.row_dtype(spec.row_dtype), spec=spec)
        return cls.from_memory(mem.replace(policy=policy), backend, name=name)

    @classmethod
    def from_memory(cls, mem: memlib.Memory, backend=None, *, name: str = "memory") -> "Store":
        """A store holding ``mem``'s rows (distributed over the shards / tiers of ``backend``)."""
        be = backend or backends.DEFAULT
        return cls(be.attach(mem, name), name)

    @classmethod
    def from_rows(cls, w, k, v, born=None, *, spec, backend=None, t: int = 0, name: str = "memory") -> "Store":
        """A store holding exactly these rows; a row that is not finite is refused (``ValueError``)."""
        rd = memlib.row_dtype(getattr(spec, "row_dtype", "float32"))
        w, k, v = memlib.stored_rows(w, k, v, rd)
        bad = np.flatnonzero(~memlib.finite_rows(w, k, v))
        if len(bad):
            raise ConfigError(f"{len(bad)} of the {len(k)} rows are not finite (a NaN or inf in w, k or v; rows "
                              f"{bad[:5].tolist()}{' ...' if len(bad) > 5 else ''}); drop them before building the "
                              f"store, or append the rows (append drops and counts them)")
        mem = memlib.from_rows(w, k, v, born, spec=spec, row_dtype=rd).replace(t=jnp.asarray(t, jnp.int32))
        return cls.from_memory(mem, backend, name=name)

    @classmethod
    def from_shard_rows(cls, backend: Sharded, shard_rows: Dict[int, Dict[str, np.ndarray]], sizes, *, d_in: int,
                        d_out: int, spec, t: int = 0, name: str = "memory", row_dtype=np.float32) -> "Store":
        """A sharded store from per-shard rows; each process passes only its own shards'."""
        mem = backend.from_shard_rows(shard_rows, sizes, d_in=d_in, d_out=d_out, spec=spec, t=t, name=name,
                                      row_dtype=row_dtype)
        return cls(mem, name)

    # ------------------------------------------------------------------ properties
    @property
    def backend(self):
        return backends.of(self.mem)

    @property
    def spec(self):
        return self.mem.spec

    @property
    def t(self) -> int:
        return int(host_value(self.mem.t))

    @property
    def size(self) -> int:
        """Rows in use, wherever they are (device, shards, disk)."""
        return self.backend.rows_in_use(self.mem)

    @property
    def rows_hot(self) -> int:
        return self.backend.hot_rows(self.mem)

    @property
    def rows_cold(self) -> int:
        return self.backend.cold_rows(self.mem)

    @property
    def d_in(self) -> int:
        return self.mem.d_in

    @property
    def d_out(self) -> int:
        return self.mem.d_out

    def rows(self) -> Dict[str, np.ndarray]:
        """Every row as numpy (cold before hot; shard by shard) — for memories that fit in RAM."""
        return self.backend.host_rows(self.mem)

    def to_memory(self) -> memlib.Memory:
        """Every row in one plain in-RAM memory (single process)."""
        r = self.rows()
        return memlib.from_rows(r["w"], r["k"], r["v"], r["born"], spec=self.spec).replace(
            t=jnp.asarray(self.t, jnp.int32))

    # ------------------------------------------------------------------ operations
    def _input(self, x):
        x = np.asarray(x)
        return self.backend.place(x) if isinstance(self.backend, Sharded) else jnp.asarray(x)

    def append(self, w, k, v, born=None, mask=None):
        """Append candidate rows (``mask`` selects them; ``born`` defaults to ``t + 1``); makes room
        first (grows the capacity, spills to disk). A candidate whose ``w``, ``k`` or ``v`` holds a
        NaN or an infinity is dropped, as the trainer drops them, and counted in
        :attr:`dropped_nonfinite`. Every process of a sharded store calls it with the same
        candidates; it returns the shard of each appended row (None unsharded).
        The rows are written into the tables in place: a ``jax.Array`` taken from ``store.mem``
        before the call is donated to it and no longer readable (arrays from :meth:`rows`
        stay valid: while they live, the append copies instead)."""
        # at the stored dtypes before the finite check: a value past their range is stored as inf otherwise
        w, k, v = memlib.stored_rows(w, k, v, self.mem.k.dtype)
        b = k.shape[0] if k.ndim else 0
        want = {"w": (b,), "k": (b, self.d_in), "v": (b, self.d_out)}
        for f, a in (("w", w), ("k", k), ("v", v)):
            if a.shape != want[f]:
                raise ConfigError(f"store {self.name}: {f} has shape {a.shape}, expected {want[f]} (B = {b} candidate "
                                  f"rows of a {self.d_in} -> {self.d_out} memory)")
        born = np.broadcast_to(np.asarray(self.t + 1 if born is None else born, np.int32), (b,))
        mask = np.ones(b, bool) if mask is None else np.asarray(mask, bool)
        finite = memlib.finite_rows(w, k, v)
        self.dropped_nonfinite += int((mask & ~finite).sum())
        mask = mask & finite
        shards = None
        if isinstance(self.backend, Sharded):   # the placement rule, on the host: what the jitted append does
            shards = assign_shards(self.host_sizes, int(mask.sum()), self.backend.placement, self.next_shard)
        mem, self._bound = backends.make_room(self.mem, int(mask.sum()), self._bound)
        self.mem = _append(mem, *(self._input(a) for a in (w, k, v, born, mask)))
        self._bound += int(mask.sum())
        return shards

    def advance(self, steps: int = 1):
        """Advance the clock ``t`` (momentum and decay coefficients are computed from it)."""
        self.mem = self.mem.replace(t=self.backend.place(jnp.asarray(self.t + int(steps), jnp.int32)))

    def retrieve(self, q, t=None) -> jax.Array:
        """``(B, d_out)``: retrieval over every row (replicated over a mesh)."""
        t = self.t if t is None else int(t)
        return _retrieve(self.mem, self._input(np.asarray(q, np.float32)),
                         self.backend.place(jnp.asarray(t, jnp.int32)))

    def min_sq_distance(self, q) -> jax.Array:
        """``(B,)``: ``min_j ‖q − k_j‖²`` over every row."""
        return _min_d2(self.mem, self._input(np.asarray(q, np.float32)))

    def novel(self, k, tau: float) -> np.ndarray:
        """``(B,)`` bool: candidates farther than ``τ`` from every stored key (Alg. 4's test);
        pass it as ``mask`` to :meth:`append`."""
        return host_value(self.min_sq_distance(k)) > float(tau) ** 2

    def compact(self, keep=None, policy_state=None):
        """Prune the rows the backend keeps off the device (a disk tier's cold rows): by the
        policy's ``evict``, or by ``keep(rows, start) -> (n,) bool`` per chunk."""
        if keep is None:
            self.mem = self.backend.compact(self.mem, policies.evictor(self.mem.policy, policy_state))
        else:
            self.mem = self.backend.compact(self.mem, keep=keep)

    @property
    def hot_capacity(self) -> int:
        """Rows the backend keeps on the device at most (a disk tier's budget; else the capacity)."""
        return getattr(self.backend, "hot_rows_per_layer", self.mem.capacity)

    # ------------------------------------------------------------------ sharded stores
    def _sharded(self) -> Sharded:
        if not isinstance(self.backend, Sharded):
            raise ConfigError(f"store {self.name} is not sharded (backend {self.backend!r})")
        return self.backend

    @property
    def n_shards(self) -> int:
        return self.backend.n_shards

    @property
    def capacity_per_shard(self) -> int:
        return self._sharded().block(self.mem)

    @property
    def host_sizes(self) -> np.ndarray:
        return self._sharded().host_sizes(self.mem)

    @property
    def next_shard(self) -> int:
        return int(host_value(self.mem.ext["next"]))

    def shard_rows(self, shard: int) -> Dict[str, np.ndarray]:
        return self._sharded().shard_rows(self.mem, shard)

    def local_blocks(self, field: str) -> Dict[int, np.ndarray]:
        return self._sharded().local_blocks(self.mem, field)

    def addressable_shard_ids(self) -> list:
        return sorted(self.local_blocks("w"))
