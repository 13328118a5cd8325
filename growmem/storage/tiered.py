"""A memory larger than RAM: newest rows hot in RAM, older rows cold in TensorStore.

Each field (``w``, ``k``, ``v``, ``born``) of the cold tier is a zarr v3 array
written through TensorStore, append-only, chunked along rows by
``chunk_rows``; the location is a local directory (the ``file`` kvstore) or
any TensorStore kvstore URL (``file:///…``, ``memory://…``, ``gs://…``,
``s3://…``). A RAM budget fixes how many rows stay hot; when an append would
exceed it, the oldest hot rows spill to disk in whole chunks with
``resize`` + ``write``.

Retrieval streams the cold chunks with read-ahead — reads of the next
``read_ahead`` chunks are in flight while the current chunk computes — then the
hot rows, and merges the per-chunk partial ``(m, num, den)`` with the
log-sum-exp rule (:func:`growmem.kernels.merge_parts`), so the result equals the
all-in-RAM memory up to float rounding.

Policies across tiers: retrieval applies the layer's per-row coefficients
(:func:`growmem.layers.retrieval_coeff`: the momentum of Eq. 23/91, a policy's
retention/decay through Eq. 100, any row-local ``coeff``) chunk by chunk,
computed from ``born`` and the clock ``t`` — lazy, so no cold row is ever
rewritten to age it. A policy's eager stages (``age``, ``evict``) are not run on
cold rows: evicting or pruning cold rows (:meth:`TieredMemory.compact`) costs one
sequential read and one write of the kept cold bytes and starts a new
*generation*; appends never change the generation. Novelty search
(:meth:`min_sq_distance`, :meth:`novel`: the ``τ`` test of the hybrid rule)
streams both tiers like retrieval.

Failures: an unwritable location raises :class:`TierError` at creation; a
failed spill (e.g. disk full) raises :class:`TierWriteError` and leaves the
memory exactly as before the append (the cold arrays are resized back, the
manifest is only updated after every write succeeded, hot rows are dropped
only after they are safely on disk).
"""
from __future__ import annotations

import functools
import json
import os
import threading
from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import kernels
from .. import memory as memlib

FIELDS = ("w", "k", "v", "born")
MANIFEST = "tier.json"
TIER_FORMAT = "growmem-tier"
TIER_VERSION = 1


class TierError(RuntimeError):
    """The cold tier cannot be created, opened or read."""


class TierWriteError(TierError):
    """A spill to the cold tier failed; the memory is unchanged."""


_CONTEXT = None


def _context():
    """One TensorStore context per process, so ``memory://`` tiers are shared between handles
    (its cache pool is the default, size 0: cold rows are never cached in RAM)."""
    global _CONTEXT
    if _CONTEXT is None:
        import tensorstore as ts

        _CONTEXT = ts.Context()
    return _CONTEXT


def _url(location: str) -> str:
    location = os.fspath(location)
    if "://" in location:
        return location.rstrip("/") + "/"
    return "file://" + os.path.abspath(location).rstrip("/") + "/"


def _local_path(url: str) -> Optional[str]:
    return url[len("file://"):] if url.startswith("file://") else None


def _spec_json(spec):
    from .checkpoint import spec_to_json

    return spec_to_json(spec)


def _spec_from_dict(d):
    """Rebuild a GrowingSpec from its JSON. A policy cannot be rebuilt from its name: a layer
    with a policy must be reopened with ``spec=``."""
    if d is None or not isinstance(d, dict):
        return None
    from ..layers import GrowingSpec

    d = dict(d)
    d["hyper"] = tuple(tuple(p) for p in d.get("hyper", ()))
    if d.get("policy") is not None:
        raise TierError(f"this tier's layer has policy {d['policy']}; reopen it with spec= (the GrowingSpec "
                        f"holding that policy)")
    d.pop("policy", None)
    import dataclasses as _dc

    names = {f.name for f in _dc.fields(GrowingSpec)}
    return GrowingSpec(**{k: v for k, v in d.items() if k in names})


def row_bytes(d_in: int, d_out: int, dtype=np.float32) -> int:
    """Bytes of one row: ``w``, ``k``, ``v`` in ``dtype`` and an int32 ``born``."""
    return np.dtype(dtype).itemsize * (1 + d_in + d_out) + 4


@functools.lru_cache(maxsize=None)
def _parts_fn(spec):
    @jax.jit
    def parts(q, w, k, v, born, n, t):
        coeff = chunk_coeff(spec, w, k, v, born, n, t)
        if spec.kernel == "weighted_softmax":
            return kernels.weighted_softmax_parts(q, k, v, w, temperature=spec.temperature, coeff=coeff, size=n,
                                                  chunk=k.shape[0])
        return kernels.retrieve(spec.kernel, q, k, v, w, temperature=spec.temperature, coeff=coeff, size=n,
                                chunk=k.shape[0])

    return parts


def chunk_coeff(spec, w, k, v, born, n, t):
    """Per-row retrieval coefficients of a block of rows (momentum, a policy's decay), computed
    from each row's ``born`` and the clock ``t`` — lazily, never stored."""
    from .. import layers

    if hasattr(layers, "retrieval_coeff"):
        mem = memlib.Memory(w=w, k=k, v=v, born=born, size=jnp.asarray(n, jnp.int32),
                            t=jnp.asarray(t, jnp.int32), spec=spec)
        return layers.retrieval_coeff(mem)
    return layers.momentum_coeff(born, t, spec.momentum) if spec.momentum > 0 else None


@jax.jit
def _merge2(a, b):
    return kernels.merge_parts([a, b])


@jax.jit
def _finish(p):
    return kernels.finish_parts(p)


@jax.jit
def _add(a, b):
    return a + b


@jax.jit
def _min_d2(best, q, k, n):
    d2 = jnp.sum(q * q, 1)[:, None] + jnp.sum(k * k, 1)[None, :] - 2.0 * q @ k.T
    d2 = jnp.where(jnp.arange(k.shape[0])[None, :] < n, jnp.maximum(d2, 0.0), jnp.inf)
    return jnp.minimum(best, d2.min(axis=1))


class TieredMemory:
    """Rows of one growing layer split between RAM (newest) and a TensorStore cold tier.

    Build with :meth:`create` or :meth:`open`. ``spec`` is the layer's
    :class:`growmem.GrowingSpec` (kernel, temperature, momentum). The RAM budget covers the
    hot rows and the read-ahead buffers of retrieval.
    """

    def __init__(self, url, manifest: dict, *, ram_budget_bytes: int, read_ahead: int = 2, spec=None,
                 read_only: bool = False):
        self.url = url
        self.d_in, self.d_out = int(manifest["d_in"]), int(manifest["d_out"])
        self.dtype = np.dtype(manifest["dtype"])
        self.chunk_rows = int(manifest["chunk_rows"])
        self.generation = int(manifest["generation"])
        self.rows_cold = int(manifest["rows_cold"])
        self.spec = spec if spec is not None else _spec_from_dict(manifest.get("spec"))
        if self.spec is None:
            raise TierError(f"tier at {url} has no layer spec; pass spec=")
        self.read_only = read_only
        self.read_ahead = max(0, int(read_ahead))
        self.ram_budget_bytes = int(ram_budget_bytes)
        rb = row_bytes(self.d_in, self.d_out, self.dtype)
        buffers = (self.read_ahead + 2) * self.chunk_rows * rb
        hot_cap = (self.ram_budget_bytes - buffers) // rb
        if hot_cap < self.chunk_rows:
            raise ValueError(f"RAM budget {self.ram_budget_bytes} B is too small for chunks of {self.chunk_rows} rows "
                             f"({rb} B each) with read-ahead {self.read_ahead}: need at least "
                             f"{buffers + self.chunk_rows * rb} B")
        self.hot_capacity = int(hot_cap)
        shapes = self._shapes()
        # np.empty does not touch the pages: RSS grows with the hot rows actually written
        self._hot = {f: np.empty((self.hot_capacity,) + shapes[f], self._dt(f)) for f in FIELDS}
        self.rows_hot = 0
        self.t = int(manifest.get("t", 0))
        self._lock = threading.Lock()
        self._arrays = self._open_arrays(self.generation, create=False)

    # ------------------------------------------------------------------ construction
    def _shapes(self):
        return {"w": (), "k": (self.d_in,), "v": (self.d_out,), "born": ()}

    def _dt(self, f):
        return np.dtype(np.int32) if f == "born" else self.dtype

    @classmethod
    def create(cls, location, *, d_in: int, d_out: int, spec, ram_budget_bytes: int, chunk_rows: int = 4096,
               read_ahead: int = 2, dtype=np.float32, overwrite: bool = False) -> "TieredMemory":
        """A new, empty tier at ``location`` (a directory or a TensorStore kvstore URL)."""
        import tensorstore as ts

        url = _url(location)
        path = _local_path(url)
        if path is not None:
            try:
                os.makedirs(path, exist_ok=True)
                probe = os.path.join(path, ".write-probe")
                with open(probe, "wb") as fh:
                    fh.write(b"ok")
                os.remove(probe)
            except OSError as e:
                raise TierError(f"cannot write the cold tier directory {path}: {e}") from e
        kv = cls._kv(url)
        if kv.read(MANIFEST).result().state == "value" and not overwrite:
            raise TierError(f"a tier already exists at {url}; open it with TieredMemory.open or pass overwrite=True")
        manifest = {"format": TIER_FORMAT, "version": TIER_VERSION, "d_in": int(d_in), "d_out": int(d_out),
                    "dtype": str(np.dtype(dtype)), "chunk_rows": int(chunk_rows), "generation": 0, "rows_cold": 0,
                    "t": 0, "spec": _spec_json(spec)}
        self = cls.__new__(cls)
        self.url, self.d_in, self.d_out, self.dtype = url, int(d_in), int(d_out), np.dtype(dtype)
        self.chunk_rows = int(chunk_rows)
        try:
            self._open_arrays(0, create=True)
            cls._write_manifest(kv, manifest)
        except TierError:
            raise
        except Exception as e:
            raise TierError(f"cannot create the cold tier at {url}: {e}") from e
        return cls(url, manifest, ram_budget_bytes=ram_budget_bytes, read_ahead=read_ahead, spec=spec)

    @classmethod
    def open(cls, location, *, ram_budget_bytes: int, read_ahead: int = 2, spec=None,
             read_only: bool = False) -> "TieredMemory":
        """Open an existing tier (its cold rows; hot rows live in checkpoints)."""
        url = _url(location)
        manifest = cls._read_manifest(url)
        return cls(url, manifest, ram_budget_bytes=ram_budget_bytes, read_ahead=read_ahead, spec=spec,
                   read_only=read_only)

    @staticmethod
    def _kv(url):
        import tensorstore as ts

        return ts.KvStore.open(url, context=_context()).result()

    @classmethod
    def _read_manifest(cls, url) -> dict:
        try:
            r = cls._kv(url).read(MANIFEST).result()
        except Exception as e:
            raise TierError(f"cannot read the cold tier at {url}: {e}") from e
        if r.state != "value":
            raise TierError(f"no cold tier at {url} ({MANIFEST} is missing)")
        try:
            m = json.loads(bytes(r.value))
        except json.JSONDecodeError as e:
            raise TierError(f"{url}{MANIFEST} is truncated or corrupt: {e}") from None
        if m.get("format") != TIER_FORMAT or m.get("version") != TIER_VERSION:
            raise TierError(f"{url} holds tier format {m.get('format')!r} version {m.get('version')}; "
                            f"this growmem reads {TIER_FORMAT!r} version {TIER_VERSION}")
        return m

    @staticmethod
    def _write_manifest(kv, manifest):
        # a kvstore write of one small value is atomic (the file driver writes a temporary and renames)
        kv.write(MANIFEST, json.dumps(manifest).encode()).result()

    def _manifest(self) -> dict:
        return {"format": TIER_FORMAT, "version": TIER_VERSION, "d_in": self.d_in, "d_out": self.d_out,
                "dtype": str(self.dtype), "chunk_rows": self.chunk_rows, "generation": self.generation,
                "rows_cold": self.rows_cold, "t": self.t,
                "spec": _spec_json(self.spec)}

    def _open_arrays(self, generation: int, create: bool):
        import tensorstore as ts

        out = {}
        for f, shape in self._shapes().items():
            spec = {"driver": "zarr3", "kvstore": f"{self.url}gen-{generation}/{f}/"}
            if create:
                spec.update(create=True, delete_existing=True, metadata={
                    "shape": [0, *shape], "data_type": str(self._dt(f)),
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.chunk_rows, *shape]}},
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]})
            try:
                out[f] = ts.open(spec, context=_context()).result()
            except Exception as e:
                raise TierError(f"cannot open cold array {spec['kvstore']}: {e}") from e
        return out

    # ------------------------------------------------------------------ sizes
    @property
    def size(self) -> int:
        return self.rows_cold + self.rows_hot

    @property
    def bytes_cold(self) -> int:
        return self.rows_cold * row_bytes(self.d_in, self.d_out, self.dtype)

    @property
    def bytes_hot(self) -> int:
        return self.rows_hot * row_bytes(self.d_in, self.d_out, self.dtype)

    def advance(self, steps: int = 1):
        """Advance the clock ``t`` (momentum/decay coefficients are computed from it lazily)."""
        self.t += int(steps)

    # ------------------------------------------------------------------ appends
    def append(self, w, k, v, born=None, mask=None):
        """Append rows (``mask`` selects them); spills the oldest hot rows if the budget requires.

        All-or-nothing: on a failed spill :class:`TierWriteError` is raised and nothing changed.
        """
        if self.read_only:
            raise TierError(f"tier at {self.url} is open read-only")
        k = np.asarray(k, self.dtype)
        b = k.shape[0]
        rows = {"w": np.asarray(w, self.dtype).reshape(b), "k": k.reshape(b, self.d_in),
                "v": np.asarray(v, self.dtype).reshape(b, self.d_out),
                "born": np.broadcast_to(np.asarray(self.t + 1 if born is None else born, np.int32), (b,))}
        if mask is not None:
            sel = np.asarray(mask, bool)
            rows = {f: a[sel] for f, a in rows.items()}
            b = len(rows["w"])
        if b == 0:
            return
        with self._lock:
            total = self.rows_hot + b
            spill = 0
            if total > self.hot_capacity:
                over = total - self.hot_capacity
                spill = min(total, -(-over // self.chunk_rows) * self.chunk_rows)
            if spill:
                from_hot = min(spill, self.rows_hot)
                pieces = {f: (self._hot[f][:from_hot], rows[f][:spill - from_hot]) for f in FIELDS}
                self._write_cold(pieces, spill)           # raises TierWriteError, state unchanged
                keep = self.rows_hot - from_hot
                if keep and from_hot:
                    # move the kept rows to the front in non-overlapping blocks (no temporary copy
                    # of the hot rows: numpy would make one for an overlapping assignment)
                    blk = from_hot
                    for f in FIELDS:
                        a = self._hot[f]
                        for lo in range(0, keep, blk):
                            hi = min(keep, lo + blk)
                            a[lo:hi] = a[from_hot + lo:from_hot + hi]
                self.rows_hot = keep
                rows = {f: a[spill - from_hot:] for f, a in rows.items()}
                b = len(rows["w"])
            for f in FIELDS:
                self._hot[f][self.rows_hot:self.rows_hot + b] = rows[f]
            self.rows_hot += b

    def write_cold(self, rows: Dict[str, np.ndarray]):
        """Append rows straight to the cold tier, bypassing the hot rows (a trainer whose hot rows
        live in its own state spills this way, :mod:`growmem.storage.spill`). All-or-nothing:
        :class:`TierWriteError` leaves the tier unchanged."""
        if self.read_only:
            raise TierError(f"tier at {self.url} is open read-only")
        n = len(rows["w"])
        if n == 0:
            return
        empty = {f: np.zeros((0,) + shape, self._dt(f)) for f, shape in self._shapes().items()}
        pieces = {f: (empty[f], np.asarray(rows[f], self._dt(f)).reshape((n,) + self._shapes()[f]))
                  for f in FIELDS}
        with self._lock:
            self._write_cold(pieces, n)

    def _write_cold(self, pieces, n):
        """Write ``n`` rows (given as (hot part, new part) per field) after the cold rows."""
        old = self.rows_cold
        new_total = old + n
        resized = {}
        try:
            for f, arr in self._arrays.items():
                resized[f] = arr.resize(exclusive_max=[new_total, *arr.shape[1:]]).result()
            # write in chunk-aligned slabs of at most ~256 MiB per field to bound temporaries
            step = max(self.chunk_rows, (256 << 20) // max(1, row_bytes(self.d_in, self.d_out, self.dtype))
                       // self.chunk_rows * self.chunk_rows)
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                futs = []
                for f, (a, b2) in pieces.items():
                    slab = _concat_slice(a, b2, lo, hi)
                    futs.append(resized[f][old + lo:old + hi].write(slab))
                for fu in futs:
                    fu.result()
            self.rows_cold = new_total
            self._write_manifest(self._kv(self.url), self._manifest())
        except Exception as e:
            self.rows_cold = old
            for f, arr in resized.items():  # best-effort rollback of the array shapes
                try:
                    resized[f] = arr.resize(exclusive_max=[old, *arr.shape[1:]], shrink_only=True).result()
                except Exception:
                    pass
            try:
                self._arrays = self._open_arrays(self.generation, create=False)
            except Exception:
                pass
            raise TierWriteError(f"spilling {n} rows to the cold tier at {self.url} failed "
                                 f"({type(e).__name__}: {e}); the memory is unchanged "
                                 f"({old} cold + {self.rows_hot} hot rows)") from e
        self._arrays = resized

    # ------------------------------------------------------------------ streaming
    def _chunks(self, fields=FIELDS, cold_rows: Optional[int] = None, hot: bool = True):
        """Yield ``(rows dict, n_valid)`` chunks of ``chunk_rows`` rows: cold (read ahead), then hot.

        ``cold_rows`` streams only the first that many cold rows; ``hot=False`` skips the hot rows.
        """
        c = self.chunk_rows
        n_cold = self.rows_cold if cold_rows is None else min(int(cold_rows), self.rows_cold)
        starts = list(range(0, n_cold, c))

        def issue(lo):
            hi = min(n_cold, lo + c)
            return {f: self._arrays[f][lo:hi].read() for f in fields}, hi - lo

        pending = [issue(lo) for lo in starts[:self.read_ahead + 1]]
        nxt = self.read_ahead + 1
        while pending:
            futs, n = pending.pop(0)
            if nxt < len(starts):
                pending.append(issue(starts[nxt]))
                nxt += 1
            try:
                rows = {f: fu.result() for f, fu in futs.items()}
            except Exception as e:
                raise TierError(f"reading the cold tier at {self.url} failed: {e}") from e
            yield rows, n
        for lo in range(0, self.rows_hot if hot else 0, c):
            hi = min(self.rows_hot, lo + c)
            yield {f: self._hot[f][lo:hi] for f in fields}, hi - lo

    def _padded(self, rows, n):
        return _padded_rows(rows, n, self.chunk_rows, self._shapes())

    def retrieve(self, q, t=None) -> jax.Array:
        """``(B, d_out)``: retrieval over all rows, cold and hot (same result as all-in-RAM)."""
        q = jnp.asarray(q, self.dtype)
        t = jnp.asarray(self.t if t is None else t, jnp.int32)
        parts = _parts_fn(self.spec)
        acc, prev = None, None
        for rows, n in self._chunks():
            rows = self._padded(rows, n)
            dev = jax.device_put((rows["w"], rows["k"], rows["v"], rows["born"]))  # one host copy (not two)
            p = parts(q, *dev, jnp.asarray(n, jnp.int32), t)
            if acc is None:
                acc = p
            elif self.spec.kernel == "weighted_softmax":
                acc = _merge2(acc, p)
            else:
                acc = _add(acc, p)
            # at most one chunk computing while the next reads are in flight (bounded memory)
            if prev is not None:
                jax.block_until_ready(prev)
            prev = acc
        if acc is None:
            return jnp.zeros((q.shape[0], self.d_out), self.dtype)
        return _finish(acc) if self.spec.kernel == "weighted_softmax" else acc

    def min_sq_distance(self, q) -> jax.Array:
        """``(B,)``: ``min_j ‖q - k_j‖²`` over both tiers (novelty test of the hybrid rule)."""
        q = jnp.asarray(q, self.dtype)
        best = jnp.full((q.shape[0],), jnp.inf, self.dtype)
        for rows, n in self._chunks(fields=("k",)):
            rows = self._padded(rows, n)
            best = _min_d2(best, q, jax.device_put(rows["k"]), jnp.asarray(n, jnp.int32))
        return best

    def novel(self, k, tau: float) -> np.ndarray:
        """``(B,)`` bool: candidates whose key is farther than ``τ`` from every stored key, in
        either tier (the admission test of the hybrid rule, Alg. 4). Pass it as ``mask`` to
        :meth:`append`."""
        return np.asarray(self.min_sq_distance(k)) > float(tau) ** 2

    # ------------------------------------------------------------------ evictions
    def compact(self, keep: Callable[[Dict[str, np.ndarray], int], np.ndarray]):
        """Evict cold rows: ``keep(rows, start) -> (n,) bool`` per cold chunk.

        Cost: one read and one write of the kept cold bytes; the kept rows go to a new
        generation and the manifest switches to it atomically (checkpoints of the old
        generation then refuse to restore, since their rows moved). Hot rows are untouched.
        """
        if self.read_only:
            raise TierError(f"tier at {self.url} is open read-only")
        with self._lock:
            old_gen, old_arrays, old_rows = self.generation, self._arrays, self.rows_cold
            new_arrays = self._open_arrays(old_gen + 1, create=True)
            self._arrays = old_arrays
            kept, lo = 0, 0
            hot_rows = self.rows_hot
            self.rows_hot = 0  # stream cold chunks only
            try:
                for rows, n in self._chunks():
                    m = np.asarray(keep(rows, lo), bool)
                    lo += n
                    sel = {f: a[m] for f, a in rows.items()}
                    k = int(m.sum())
                    if k:
                        for f, arr in new_arrays.items():
                            new_arrays[f] = arr.resize(exclusive_max=[kept + k, *arr.shape[1:]]).result()
                        for f in FIELDS:
                            new_arrays[f][kept:kept + k].write(sel[f]).result()
                        kept += k
            finally:
                self.rows_hot = hot_rows
            self.generation, self.rows_cold, self._arrays = old_gen + 1, kept, new_arrays
            try:
                self._write_manifest(self._kv(self.url), self._manifest())
            except Exception as e:
                self.generation, self.rows_cold, self._arrays = old_gen, old_rows, old_arrays
                raise TierWriteError(f"compacting the cold tier at {self.url} failed: {e}") from e

    # ------------------------------------------------------------------ host copies
    def hot_rows(self) -> Dict[str, np.ndarray]:
        return {f: self._hot[f][:self.rows_hot].copy() for f in FIELDS}

    def all_rows(self) -> Dict[str, np.ndarray]:
        """Every row (cold first, then hot) as numpy arrays — only for memories that fit in RAM."""
        parts = {f: [] for f in FIELDS}
        for rows, n in self._chunks():
            for f in FIELDS:
                parts[f].append(np.array(rows[f][:n]))
        shapes = self._shapes()
        return {f: (np.concatenate(p) if p else np.zeros((0,) + shapes[f], self._dt(f))) for f, p in parts.items()}

    def to_memory(self) -> memlib.Memory:
        rows = self.all_rows()
        mem = memlib.from_rows(rows["w"], rows["k"], rows["v"], rows["born"], spec=self.spec)
        return mem.replace(t=jnp.asarray(self.t, jnp.int32))

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self):
        """``(hot arrays, description)`` for :mod:`growmem.storage.checkpoint`: the cold tier is
        referenced by URL, generation and row count, never copied."""
        spec = _spec_json(self.spec)
        meta = {"url": self.url, "generation": self.generation, "rows_cold": self.rows_cold,
                "rows_hot": self.rows_hot, "d_in": self.d_in, "d_out": self.d_out, "dtype": str(self.dtype),
                "chunk_rows": self.chunk_rows, "t": self.t, "bytes_hot": self.bytes_hot,
                "bytes_cold": self.bytes_cold, "ram_budget_bytes": self.ram_budget_bytes,
                "read_ahead": self.read_ahead, "spec": spec, "kernel": self.spec.kernel,
                "temperature": self.spec.temperature, "momentum": self.spec.momentum}
        return self.hot_rows(), meta

    @classmethod
    def from_checkpoint(cls, hot: Dict[str, np.ndarray], meta: dict, *, directory=None, spec=None,
                        read_only: bool = False) -> "TieredMemory":
        """Reopen the tier a checkpoint refers to, at the checkpoint's rows.

        Cold rows written after the checkpoint are discarded (unless ``read_only``); a tier
        that was compacted since (another generation) or lost rows raises :class:`TierError`.
        """
        url = _url(directory) if directory is not None else meta["url"]
        manifest = cls._read_manifest(url)
        if int(manifest["generation"]) != int(meta["generation"]):
            raise TierError(f"checkpoint refers to generation {meta['generation']} of the cold tier at {url}, "
                            f"which is now at generation {manifest['generation']} (rows were compacted since)")
        if int(manifest["rows_cold"]) < int(meta["rows_cold"]):
            raise TierError(f"checkpoint refers to {meta['rows_cold']} cold rows at {url} but the tier holds only "
                            f"{manifest['rows_cold']}")
        tier = cls(url, manifest, ram_budget_bytes=int(meta["ram_budget_bytes"]),
                   read_ahead=int(meta.get("read_ahead", 2)), spec=spec or _spec_from_dict(meta.get("spec")),
                   read_only=read_only)
        n_saved = int(meta["rows_cold"])
        if tier.rows_cold != n_saved:
            tier.rows_cold = n_saved
            if not read_only:
                for f, arr in tier._arrays.items():
                    tier._arrays[f] = arr.resize(exclusive_max=[n_saved, *arr.shape[1:]], shrink_only=True).result()
                tier._write_manifest(tier._kv(url), tier._manifest())
        tier.t = int(meta.get("t", 0))
        n = int(meta["rows_hot"])
        if n > tier.hot_capacity:
            raise TierError(f"checkpoint has {n} hot rows but the RAM budget holds {tier.hot_capacity}")
        for f in FIELDS:
            if n:
                tier._hot[f][:n] = hot[f]
        tier.rows_hot = n
        return tier


def _padded_rows(rows, n, chunk_rows, shapes):
    """A chunk of ``n`` rows zero-padded to ``chunk_rows`` (so every chunk compiles to one program)."""
    if n == chunk_rows:
        return rows
    out = {}
    for f, a in rows.items():
        p = np.zeros((chunk_rows,) + shapes[f], a.dtype)
        p[:n] = a[:n]
        out[f] = p
    return out


def _concat_slice(a, b, lo, hi):
    """Rows ``[lo, hi)`` of ``concat(a, b)`` without materialising the concatenation."""
    na = len(a)
    if hi <= na:
        return a[lo:hi]
    if lo >= na:
        return b[lo - na:hi - na]
    return np.concatenate([a[lo:], b[:hi - na]])
