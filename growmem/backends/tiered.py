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
Combined with :class:`growmem.backends.sharded.Sharded` (``Sharded(mesh, tiered=Tiered(...))``)
every shard has its own tier (``directory/<layer>/shard-<s>``) and its own budget.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import errno
import functools
import itertools
import json
import os
import sys
import threading
import urllib.parse
import uuid
import zlib
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import kernels, locks, native
from .. import memory as memlib
from ..errors import CheckpointError, ConfigError, CorruptCheckpointError, GrowmemError
from . import RAM, _temperature

FIELDS = memlib.FIELDS
MANIFEST = "tier.json"
TIER_FORMAT = "growmem-tier"
#: 2: the manifest holds the checksums of the rows written (``checksums``)
TIER_VERSION = 2
#: target bytes of one cold chunk (key + value rows) when ``chunk_rows`` is not given
COLD_CHUNK_BYTES = 16 << 20
#: whole chunks of a tier in a local folder are read straight from their files (see :func:`read_chunk_file`)
#: instead of through TensorStore; False (or ``GROWMEM_TIER_READS=tensorstore``) reads every chunk through
#: TensorStore
LOCAL_READS = os.environ.get("GROWMEM_TIER_READS", "local").lower() != "tensorstore"
#: threads that read chunk files (a read of a 16 MiB chunk is one request to the disk: a few in flight keep
#: it busy while the reads take almost no CPU)
READ_THREADS = 4
#: alignment of ``O_DIRECT`` buffers, offsets and lengths (a multiple of every common logical block size)
DIRECT_ALIGN = 4096

_readers: Optional[concurrent.futures.ThreadPoolExecutor] = None
_readers_lock = threading.Lock()


def _reader_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="growmem-tier-read")
        return _readers


def _read_into(fd, view, offset: int, nbytes: int, flags: int = 0) -> int:
    """``preadv`` until ``nbytes`` are in ``view`` (from file ``offset``) or the file ends; the
    bytes read. With ``RWF_NOWAIT`` it stops at the first page the page cache does not hold."""
    got = 0
    while got < nbytes:
        try:
            r = os.preadv(fd, [view[got:]], offset + got, flags)
        except BlockingIOError:
            break
        if r == 0:
            break
        got += r
    return got


def raw_chunk_files(metadata: dict, chunk_rows: int) -> bool:
    """Whether a zarr v3 array's chunk files are what :func:`read_chunk_file` reads: raw
    little-endian bytes (no compression), default chunk keys (``c/<i>/<j>``), ``chunk_rows`` rows
    per chunk and whole rows. Tiers growmem writes are; any other layout is read through
    TensorStore."""
    grid = metadata.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
    keys = metadata.get("chunk_key_encoding", {})
    return (metadata.get("codecs") == [{"name": "bytes", "configuration": {"endian": "little"}}]
            and keys.get("name") == "default" and keys.get("configuration", {}).get("separator", "/") == "/"
            and grid is not None and int(grid[0]) == int(chunk_rows)
            and list(grid[1:]) == list(metadata.get("shape", [])[1:]))


def read_chunk_file(path: str, nbytes: int, direct: bool = True) -> Optional[np.ndarray]:
    """The first ``nbytes`` of a chunk file as a fresh ``uint8`` array (None if the file does not
    exist: a chunk never written, or one TensorStore deleted because it held only the fill value).

    What the page cache holds is copied from it without waiting for the disk (``RWF_NOWAIT``: a
    tier that fits in RAM, a chunk just spilled); with ``direct`` the rest is read with
    ``O_DIRECT`` — the disk writes into the (aligned) buffer and the kernel copies nothing, so a
    read in flight takes almost no CPU from the retrieval it overlaps. A file system without
    ``O_DIRECT`` (tmpfs, some network mounts) is read through the page cache. Raises ``OSError``
    on a short file."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    padded = -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN
    raw = np.empty(padded + DIRECT_ALIGN, np.uint8)
    off = (-raw.ctypes.data) % DIRECT_ALIGN
    buf = memoryview(raw[off:off + padded])
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    try:
        got = 0
        nowait = getattr(os, "RWF_NOWAIT", 0)
        if direct and hasattr(os, "O_DIRECT"):
            if nowait:
                try:
                    got = _read_into(fd, buf[:nbytes], 0, nbytes, nowait)
                except OSError as e:   # RWF_NOWAIT not supported here: everything from the disk
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    got = 0
            if got < nbytes:
                start = got // DIRECT_ALIGN * DIRECT_ALIGN   # O_DIRECT: aligned offset and length
                try:
                    dfd = os.open(path, flags | os.O_DIRECT)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    dfd = None
                if dfd is not None:
                    try:
                        got = start + _read_into(dfd, buf[start:], start, padded - start)
                    except OSError as e:
                        if e.errno != errno.EINVAL:   # EINVAL: O_DIRECT refused at the first read
                            raise
                    finally:
                        os.close(dfd)
        if got < nbytes:
            got += _read_into(fd, buf[got:nbytes], got, nbytes - got)
    finally:
        os.close(fd)
    if got < nbytes:
        raise OSError(errno.EIO, f"chunk file holds {got} bytes, {nbytes} expected (truncated?)", path)
    return raw[off:off + nbytes]


class TierError(GrowmemError, RuntimeError):
    """The cold tier cannot be created, opened or read."""


class TierWriteError(TierError):
    """A spill to the cold tier failed; the memory is unchanged."""


row_bytes = memlib.row_bytes

_CONTEXT = None


def _context():
    """One TensorStore context per process, so ``memory://`` tiers are shared between handles
    (its cache pool is the default, size 0: cold rows are never cached in RAM)."""
    global _CONTEXT
    if _CONTEXT is None:
        import tensorstore as ts

        _CONTEXT = ts.Context()
    return _CONTEXT


def url_of(location) -> str:
    """A TensorStore kvstore URL (with a trailing ``/``) for a folder or URL. A folder's path is
    percent-encoded (TensorStore decodes ``file://`` URLs: a ``%41`` in a folder name would name another
    folder, a ``#`` would start a fragment); ordinary paths are unchanged by the encoding."""
    location = os.fspath(location)
    if "://" in location:
        return location.rstrip("/") + "/"
    return "file://" + urllib.parse.quote(os.path.abspath(location).rstrip("/")) + "/"


def local_path(url: str) -> Optional[str]:
    return urllib.parse.unquote(url[len("file://"):]) if url.startswith("file://") else None


def join_url(base: str, name: str) -> str:
    return url_of(base).rstrip("/") + "/" + name + "/"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name) or "memory"


def _crc32(a: np.ndarray) -> int:
    return zlib.crc32(np.require(a, requirements="C").reshape(-1).view(np.uint8)) & 0xFFFFFFFF


def checksums_of(rows: Dict[str, np.ndarray], lo: int, chunk_rows: int) -> List[list]:
    """``[[a, b, crc_w, crc_k, crc_v, crc_born], ...]``: the CRC32 of rows ``lo, lo + 1, …`` (as
    stored: the tier's dtypes, C order), one entry per chunk they fall in."""
    n = len(rows["w"])
    out, a = [], lo
    while a < lo + n:
        b = min(lo + n, (a // chunk_rows + 1) * chunk_rows)
        out.append([a, b] + [_crc32(rows[f][a - lo:b - lo]) for f in FIELDS])
        a = b
    return out


# ---------------------------------------------------------------------------------------------
# one cold tier on disk


class ColdTier:
    """The cold rows of one memory (or one shard): zarr v3 arrays ``w, k, v, born`` through
    TensorStore, append-only in whole writes, plus a JSON manifest (format, shapes, row count,
    generation). Compaction writes a new generation and switches the manifest atomically."""

    def __init__(self, url, manifest: dict, *, read_only: bool = False):
        self.url = url
        self.d_in, self.d_out = int(manifest["d_in"]), int(manifest["d_out"])
        self.dtype = np.dtype(manifest["dtype"])
        self.chunk_rows = int(manifest["chunk_rows"])
        self.generation = int(manifest["generation"])
        self.rows = int(manifest["rows_cold"])
        self.spec = manifest.get("spec")
        self.owner = manifest.get("owner")
        self._set_checksums(manifest.get("checksums", []))
        self.read_only = read_only
        self._lock = threading.Lock()
        self._arrays = self._open_arrays(self.generation, create=False)
        self._local = local_path(url) if all(raw_chunk_files(a.spec().to_json().get("metadata", {}),
                                                             self.chunk_rows) for a in self._arrays.values()) else None

    def shapes(self):
        return {"w": (), "k": (self.d_in,), "v": (self.d_out,), "born": ()}

    def dt(self, f):
        return np.dtype(np.int32) if f == "born" else (np.dtype(np.float32) if f == "w" else self.dtype)

    @staticmethod
    def _kv(url):
        import tensorstore as ts

        return ts.KvStore.open(url, context=_context()).result()

    @classmethod
    def create(cls, location, *, d_in: int, d_out: int, chunk_rows: int, dtype=np.float32, spec_json=None,
               overwrite: bool = False, owner: Optional[str] = None) -> "ColdTier":
        """A new, empty tier at ``location``. A tier already there (another run's cold rows) is
        refused unless ``overwrite``. ``owner``: the id of the run the tier belongs to (a new
        one by default): checkpoints record it and refuse another run's tier."""
        url = url_of(location)
        path = local_path(url)
        if path is not None:
            try:
                os.makedirs(path, exist_ok=True)
                probe = os.path.join(path, f".write-probe-{uuid.uuid4().hex}")
                with open(probe, "wb") as fh:
                    fh.write(b"ok")
                os.remove(probe)
            except OSError as e:
                raise TierError(f"cannot write the cold tier directory {path}: {e}") from e
        kv = cls._kv(url)
        existing = kv.read(MANIFEST).result()
        if existing.state == "value" and not overwrite:
            try:
                other = json.loads(bytes(existing.value)).get("owner", "?")
            except json.JSONDecodeError:
                other = "?"
            raise TierError(f"a tier already exists at {url} (the cold rows of run {other}); resume that run, or "
                            f"spill to another folder (growmem train --spill-dir), or delete that folder to discard "
                            f"its rows (Tiered(..., overwrite=True) does it)")
        manifest = {"format": TIER_FORMAT, "version": TIER_VERSION, "d_in": int(d_in), "d_out": int(d_out),
                    "dtype": str(np.dtype(dtype)), "chunk_rows": int(chunk_rows), "generation": 0, "rows_cold": 0,
                    "spec": spec_json, "owner": owner or uuid.uuid4().hex, "checksums": []}
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
        return cls(url, manifest)

    @classmethod
    def open(cls, location, *, read_only: bool = False) -> "ColdTier":
        url = url_of(location)
        return cls(url, cls.read_manifest(url), read_only=read_only)

    @classmethod
    def read_manifest(cls, url) -> dict:
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
                            f"this growmem reads {TIER_FORMAT!r} version {TIER_VERSION} (version 1 had no "
                            f"checksums of its rows): use the growmem version that wrote it, or start a new run")
        return m

    @classmethod
    def checked(cls, ref: dict, name: str, *, read_only: bool = False, verify: bool = True) -> "ColdTier":
        """The tier a checkpoint refers to (``ref``: :meth:`ColdStore.reference`), checked: written
        by the same run (``owner``), at the same generation, holding at least the checkpoint's rows
        (:class:`TierError` otherwise) and, with ``verify``, those rows matching the checksums
        written with them (:class:`growmem.errors.CorruptCheckpointError` naming the file)."""
        url = ref["url"]
        manifest = cls.read_manifest(url)
        if ref.get("owner") and manifest.get("owner") != ref["owner"]:
            raise TierError(f"the cold tier at {url} holds the rows of run {manifest.get('owner')}, not of run "
                            f"{ref['owner']} that wrote this checkpoint of {name} (another run spilled into the "
                            f"same folder); resume with the spill folder this run used")
        if int(manifest["generation"]) != int(ref["generation"]):
            raise TierError(f"the checkpoint of {name} refers to generation {ref['generation']} of the cold tier at "
                            f"{url}, which is now at generation {manifest['generation']} (rows were compacted since)")
        if int(manifest["rows_cold"]) < int(ref["rows_cold"]):
            raise TierError(f"the checkpoint of {name} refers to {ref['rows_cold']} cold rows at {url} but the tier "
                            f"holds only {manifest['rows_cold']}")
        tier = cls(url, manifest, read_only=read_only)
        if verify:
            try:
                tier.verify(int(ref["rows_cold"]))
            except TierError as e:
                raise CorruptCheckpointError(f"the cold rows of {name}: {e}") from None
        return tier

    @staticmethod
    def _write_manifest(kv, manifest):
        # a kvstore write of one small value is atomic (the file driver writes a temporary and renames)
        kv.write(MANIFEST, json.dumps(manifest).encode()).result()

    def manifest(self, checksums: Optional[List[list]] = None) -> dict:
        return {"format": TIER_FORMAT, "version": TIER_VERSION, "d_in": self.d_in, "d_out": self.d_out,
                "dtype": str(self.dtype), "chunk_rows": self.chunk_rows, "generation": self.generation,
                "rows_cold": self.rows, "spec": self.spec, "owner": self.owner,
                "checksums": self.checksums if checksums is None else checksums}

    def _set_checksums(self, checksums):
        self.checksums = [list(c) for c in checksums]
        self._checksum_starts = [c[0] for c in self.checksums]

    def chunk_key(self, f: str, j: int, generation: Optional[int] = None) -> str:
        """The kvstore key of chunk ``j`` of field ``f`` (zarr v3 default keys) under the tier's URL."""
        g = self.generation if generation is None else generation
        return f"gen-{g}/{f}/c/{j}" + ("/0" if self.shapes()[f] else "")

    def _chunk_name(self, f: str, j: int, generation: Optional[int] = None) -> str:
        key = self.chunk_key(f, j, generation)
        path = local_path(self.url)
        return f"chunk file {os.path.join(path, key)}" if path is not None else f"chunk {self.url}{key}"

    def check_chunk(self, j: int, rows: Dict[str, np.ndarray], checksums=None, generation: Optional[int] = None):
        """Check the rows read of chunk ``j`` (``{field: rows from the chunk's first}``, any subset
        of the fields) against the checksums written with them; :class:`TierError` names the
        chunk file (missing, or damaged) of the first that differs."""
        sums, starts = (self.checksums, self._checksum_starts) if checksums is None else \
            (checksums, [c[0] for c in checksums])
        c = self.chunk_rows
        lo = j * c
        for p in sums[bisect.bisect_left(starts, lo):bisect.bisect_left(starts, lo + c)]:
            for i, f in enumerate(FIELDS):
                a = rows.get(f)
                if a is None or p[1] - lo > len(a):
                    continue
                if _crc32(np.asarray(a, self.dt(f))[p[0] - lo:p[1] - lo]) != p[2 + i]:
                    name = self._chunk_name(f, j, generation)
                    path = local_path(self.url)
                    missing = path is not None and not os.path.exists(os.path.join(path, self.chunk_key(f, j,
                                                                                                       generation)))
                    what = "is missing" if missing else "does not match its checksum (damaged)"
                    raise TierError(f"the cold tier at {self.url} is damaged: {name} {what}, so its rows "
                                    f"{p[0]}-{p[1] - 1} of {f} are lost; restore a checkpoint with fewer cold rows, "
                                    f"or start a new run")

    def verify(self, n: Optional[int] = None) -> int:
        """Read the first ``n`` cold rows (default: all) and check them against the checksums
        written with them (:meth:`check_chunk`); returns the rows checked. Every row must have its
        checksum: :class:`TierError` otherwise."""
        n = self.rows if n is None else min(int(n), self.rows)
        for _ in self.chunks(n=n, verify=True):
            pass
        return n

    def _open_arrays(self, generation: int, create: bool):
        import tensorstore as ts

        out = {}
        for f, shape in self.shapes().items():
            spec = {"driver": "zarr3", "kvstore": f"{self.url}gen-{generation}/{f}/"}
            if create:
                spec.update(create=True, delete_existing=True, metadata={
                    "shape": [0, *shape], "data_type": str(self.dt(f)),
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.chunk_rows, *shape]}},
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]})
            try:
                out[f] = ts.open(spec, context=_context()).result()
            except Exception as e:
                raise TierError(f"cannot open cold array {spec['kvstore']}: {e}") from e
        return out

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.d_in, self.d_out, self.dtype)

    # -- writes
    def write(self, rows: Dict[str, np.ndarray]):
        """Append rows after the cold rows. All-or-nothing: :class:`TierWriteError` leaves the
        tier unchanged."""
        if self.read_only:
            raise TierError(f"tier at {self.url} is open read-only")
        n = len(rows["w"])
        if n == 0:
            return
        rows = {f: np.asarray(rows[f], self.dt(f)).reshape((n,) + self.shapes()[f]) for f in FIELDS}
        with self._lock:
            old = self.rows
            new_total = old + n
            resized = {}
            try:
                for f, arr in self._arrays.items():
                    resized[f] = arr.resize(exclusive_max=[new_total, *arr.shape[1:]]).result()
                # chunk-aligned slabs of at most ~256 MiB per field bound the temporaries
                step = max(self.chunk_rows, (256 << 20) // max(1, self.row_bytes) // self.chunk_rows * self.chunk_rows)
                sums = list(self.checksums)
                for lo in range(0, n, step):
                    hi = min(n, lo + step)
                    futs = [resized[f][old + lo:old + hi].write(rows[f][lo:hi]) for f in FIELDS]
                    # the checksums of what is being written, while TensorStore writes it
                    sums += checksums_of({f: rows[f][lo:hi] for f in FIELDS}, old + lo, self.chunk_rows)
                    for fu in futs:
                        fu.result()
                self.rows = new_total
                self._write_manifest(self._kv(self.url), self.manifest(sums))
                self._set_checksums(sums)
            except Exception as e:
                self.rows = old
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
                                     f"({type(e).__name__}: {e}); the memory is unchanged") from e
            self._arrays = resized

    def truncate(self, n: int):
        """Keep the first ``n`` cold rows (a restore: rows written after a checkpoint go)."""
        if n == self.rows:
            return
        if n > self.rows:
            raise TierError(f"the tier at {self.url} holds {self.rows} cold rows, fewer than {n}")
        sums = [c for c in self.checksums if c[1] <= n]
        cut = [c for c in self.checksums if c[0] < n < c[1]]
        if cut:   # n inside a write (never at a checkpoint's rows): the checksum of the rows kept of it
            lo = cut[0][0]
            sums += checksums_of({f: self._arrays[f][lo:n].read().result() for f in FIELDS}, lo, self.chunk_rows)
        self.rows = n
        self._set_checksums(sums)
        if not self.read_only:
            for f, arr in self._arrays.items():
                self._arrays[f] = arr.resize(exclusive_max=[n, *arr.shape[1:]], shrink_only=True).result()
            self._write_manifest(self._kv(self.url), self.manifest())

    def compact(self, keep: Callable[[Dict[str, np.ndarray], int], np.ndarray]):
        """Evict cold rows: ``keep(rows, start) -> (n,) bool`` per chunk; the kept rows go to a
        new generation (one read and one write of the kept bytes)."""
        if self.read_only:
            raise TierError(f"tier at {self.url} is open read-only")
        with self._lock:
            old_gen, old_arrays, old_rows = self.generation, self._arrays, self.rows
            new_arrays = self._open_arrays(old_gen + 1, create=True)
            kept, lo, sums = 0, 0, []
            for rows, n in self.chunks(verify=True):   # damaged rows are never carried into the new generation
                m = np.asarray(keep(rows, lo), bool)[:n]
                lo += n
                k = int(m.sum())
                if k:
                    for f, arr in new_arrays.items():
                        new_arrays[f] = arr.resize(exclusive_max=[kept + k, *arr.shape[1:]]).result()
                    out = {f: np.asarray(rows[f][:n][m], self.dt(f)) for f in FIELDS}
                    for f in FIELDS:
                        new_arrays[f][kept:kept + k].write(out[f]).result()
                    sums += checksums_of(out, kept, self.chunk_rows)
                    kept += k
            self.generation, self.rows, self._arrays = old_gen + 1, kept, new_arrays
            try:
                self._write_manifest(self._kv(self.url), self.manifest(sums))
                self._set_checksums(sums)
            except Exception as e:
                self.generation, self.rows, self._arrays = old_gen, old_rows, old_arrays
                raise TierWriteError(f"compacting the cold tier at {self.url} failed: {e}") from e

    # -- reads
    def issue(self, lo: int, hi: int, fields=FIELDS):
        """Start reading rows ``lo:hi``: ``{field: future}`` (``.result()`` gives the array).

        Rows of one whole chunk of a tier in a local folder are read from the chunk's file
        (zarr v3, raw little-endian bytes: ``gen-<g>/<field>/c/<chunk>[/0]``) by
        :func:`read_chunk_file` on a small thread pool — no TensorStore decode and, with
        ``O_DIRECT``, no copy out of the page cache; anything else goes through TensorStore."""
        c = self.chunk_rows
        if (LOCAL_READS and self._local is not None and sys.byteorder == "little" and lo % c == 0
                and 0 < hi - lo <= c):
            pool, gen, arrays, sums = _reader_pool(), self.generation, self._arrays, self.checksums
            return {f: pool.submit(self._read_local, f, lo // c, hi - lo, gen, arrays, sums) for f in fields}
        return {f: self._arrays[f][lo:hi].read() for f in fields}

    def _read_local(self, f: str, j: int, n: int, generation: int, arrays, checksums) -> np.ndarray:
        shape, dt = self.shapes()[f], self.dt(f)
        path = os.path.join(self._local, self.chunk_key(f, j, generation))
        per_row = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = read_chunk_file(path, self.chunk_rows * per_row)
        if buf is None:   # never written, or only the fill value (then TensorStore stores no file): else lost
            rows = arrays[f][j * self.chunk_rows:j * self.chunk_rows + n].read().result()
            self.check_chunk(j, {f: rows}, checksums, generation)
            return rows
        return buf.view(dt).reshape((self.chunk_rows,) + shape)[:n]

    def chunks(self, fields=FIELDS, n: Optional[int] = None, read_ahead: int = 2, verify: bool = False):
        """Yield ``(rows, n_valid)`` chunks of the first ``n`` cold rows, reads in flight ahead;
        with ``verify`` each is checked against its checksums first (:meth:`check_chunk`)."""
        c = self.chunk_rows
        n = self.rows if n is None else min(int(n), self.rows)
        if verify:
            covered = sum(s[1] - s[0] for s in self.checksums if s[1] <= n)
            if covered != n:
                raise TierError(f"the cold tier at {self.url} has checksums for {covered} of its first {n} rows, so "
                                f"they cannot be verified (written by another program?)")
        starts = list(range(0, n, c))
        pending = [(lo, self.issue(lo, min(n, lo + c), fields)) for lo in starts[:read_ahead + 1]]
        nxt = read_ahead + 1
        while pending:
            lo, futs = pending.pop(0)
            if nxt < len(starts):
                pending.append((starts[nxt], self.issue(starts[nxt], min(n, starts[nxt] + c), fields)))
                nxt += 1
            try:
                rows = {f: fu.result() for f, fu in futs.items()}
            except TierError:
                raise
            except Exception as e:
                raise TierError(f"reading the cold tier at {self.url} failed: {e}") from e
            if verify:
                self.check_chunk(lo // c, rows)
            yield rows, min(n, lo + c) - lo


def _padded(rows, n, chunk_rows, shapes):
    """A chunk of ``n`` rows zero-padded to ``chunk_rows`` (so every chunk compiles to one program)."""
    if n == chunk_rows and all(len(a) == chunk_rows for a in rows.values()):
        return rows
    out = {}
    for f, a in rows.items():
        p = np.zeros((chunk_rows,) + shapes[f], a.dtype)
        p[:n] = a[:n]
        out[f] = p
    return out


def aged(rows: Dict[str, np.ndarray], lo: int, seg_start, seg_t, t: int, retention: float, weighted: bool):
    """Cold rows ``lo, lo+1, …`` with ``v`` (and ``w`` when ``weighted``) scaled by
    ``retention^(t − t_spill)``: the weight decay (Eq. 21/90) a row missed since its block
    spilled at step ``t_spill`` (block ``j`` starts at row ``seg_start[j]``, spilled at ``seg_t[j]``)."""
    if retention == 1.0 or "v" not in rows or len(seg_start) == 0:
        return rows
    seg_start, seg_t = np.asarray(seg_start, np.int64), np.asarray(seg_t, np.int64)
    seg = np.searchsorted(seg_start, lo + np.arange(len(rows["v"])), side="right") - 1
    age = np.maximum(t - seg_t[np.maximum(seg, 0)], 0)
    f = np.power(retention, age, dtype=np.float64)
    rows = dict(rows)
    rows["v"] = (rows["v"].astype(np.float32) * f[:, None].astype(np.float32)).astype(rows["v"].dtype)
    if weighted:
        rows["w"] = rows["w"] * f.astype(rows["w"].dtype)
    return rows


# ---------------------------------------------------------------------------------------------
# what a jitted step sees


@dataclasses.dataclass(frozen=True)
class ColdRef:
    """Static (hashable) handle on an open :class:`ColdStore` (part of the jitted program)."""

    key: str
    d_in: int
    d_out: int
    chunk_rows: int
    dtype: str = "float32"


# open cold stores of this process, by ColdRef.key (a view in a jitted program finds its tier here)
_STORES: Dict[str, Any] = {}
# the keys of this process's Tiered backends: tier-0, tier-1, ...
_KEYS = itertools.count()
# cold rows of every shard of a sharded layer, by ColdRef.key, as last gathered (every process knows all of them;
# the view's ``n`` holds only this process's shards)
_SHARD_COUNTS: Dict[str, np.ndarray] = {}


def _store(key: str, shard: int = 0) -> "ColdStore":
    try:
        s = _STORES[key]
    except KeyError:
        raise TierError(f"the cold tier {key} is not open in this process: build the trainer with its Tiered "
                        f"backend (or restore the checkpoint into one) before using this state") from None
    return s[shard] if isinstance(s, dict) else s


@struct.dataclass
class ColdView:
    """How many cold rows a step may read (``n``: a scalar, or ``(S,)`` per shard) and a static
    bound on their chunks (a power of two: a growing tier recompiles O(log N) times)."""

    n: jax.Array
    ref: ColdRef = struct.field(pytree_node=False)
    max_chunks: int = struct.field(pytree_node=False, default=1)


def _chunk_bound(rows: int, chunk_rows: int) -> int:
    need = max(1, -(-int(rows) // chunk_rows))
    return 1 << (need - 1).bit_length()


def _read(view: ColdView, i, n, t, shard, fields):
    """Cold chunk ``i`` (rows aged to step ``t``) of a shard's tier, read on the host by a callback."""
    ref, c = view.ref, view.ref.chunk_rows
    rd = jnp.dtype(ref.dtype)
    shapes = {"w": ((c,), jnp.float32), "k": ((c, ref.d_in), rd), "v": ((c, ref.d_out), rd),
              "born": ((c,), jnp.int32)}
    out = tuple(jax.ShapeDtypeStruct(*shapes[f]) for f in fields)
    if native.cold_reads(_host_read):
        if tuple(f for f in FIELDS if f in fields) != tuple(fields):
            raise ValueError(f"cold read fields {fields} must follow the order of {FIELDS}")
        scalar = lambda a: jnp.asarray(a, jnp.int32)
        call = jax.ffi.ffi_call(native.COLD_READ_TARGET, out, vmap_method="sequential")
        return call(scalar(i), scalar(n), scalar(t), scalar(shard), key=ref.key,
                    fields=np.int32(sum(1 << FIELDS.index(f) for f in fields)))
    cb = lambda i, n, t, s: _store(ref.key, int(s)).read_chunk(int(i), int(n), int(t), fields)
    return jax.pure_callback(cb, out, i, n, t, shard, vmap_method="sequential")


def _host_read(key: str, i: int, n: int, t: int, shard: int, fields: int):
    """The host side of the native cold read: chunk ``i`` of the tier ``key`` (``fields``: a bit per
    entry of FIELDS), each field as the bytes of its C-contiguous array."""
    names = tuple(f for j, f in enumerate(FIELDS) if fields >> j & 1)
    return tuple(np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                 for a in _store(key, shard).read_chunk(i, n, t, names))


def cold_partial(kern, view: ColdView, n, shard, q, t, coeff_fn, temperature):
    """The kernel's partial over a tier's first ``n`` cold rows at clock ``t`` (a rematerialised
    scan over the chunks, each read by a host callback)."""
    t = jnp.asarray(t, jnp.int32)
    c = view.ref.chunk_rows
    b = q.shape[0]

    @jax.checkpoint
    def body(carry, i):
        def run(carry):
            w, k, v, born = _read(view, i, n, t, shard, FIELDS)
            n_valid = jnp.clip(n - i * c, 0, c)
            coeff = None if coeff_fn is None else coeff_fn(born, t)
            p = kernels.reduce(kern, q, k, v, w, temperature=temperature, coeff=coeff, size=n_valid, chunk=c,
                               row_grads=False)
            return kernels.merge(carry, p)

        return jax.lax.cond(i * c < n, run, lambda carry: carry, carry), None

    out, _ = jax.lax.scan(body, kern.empty(b, view.ref.d_out, q.dtype), jnp.arange(view.max_chunks, dtype=jnp.int32))
    return out


def cold_min_sq_distance(view: ColdView, n, shard, q):
    """``(B,)``: ``min_j ‖q − k_j‖²`` over a tier's first ``n`` cold keys (``inf`` without any)."""
    q = jax.lax.stop_gradient(q)
    c = view.ref.chunk_rows
    t = jnp.zeros((), jnp.int32)

    def body(best, i):
        def run(best):
            (k,) = _read(view, i, n, t, shard, ("k",))
            n_valid = jnp.clip(n - i * c, 0, c)
            return jnp.minimum(best, kernels.min_sq_distance(q, k, size=n_valid))

        return jax.lax.cond(i * c < n, run, lambda b: b, best), None

    best, _ = jax.lax.scan(body, jnp.full((q.shape[0],), jnp.inf, q.dtype), jnp.arange(view.max_chunks, dtype=jnp.int32))
    return best


# ---------------------------------------------------------------------------------------------
# one layer's (or shard's) cold rows on the host


class ColdStore:
    """A :class:`ColdTier` plus the step each spilled block was aged to (lazy weight decay) and
    the read-ahead state of the callbacks."""

    def __init__(self, tier: ColdTier, retention: float, weighted: bool, read_ahead: int = 2, seg_start=(),
                 seg_t=()):
        self.tier, self.retention, self.weighted, self.read_ahead = tier, float(retention), weighted, int(read_ahead)
        self.seg_start = np.asarray(seg_start, np.int64).reshape(-1)
        self.seg_t = np.asarray(seg_t, np.int64).reshape(-1)
        self._pending: Dict[tuple, dict] = {}
        self._last = None

    @property
    def rows(self) -> int:
        return self.tier.rows

    def spill(self, rows: Dict[str, np.ndarray], t: int):
        """Append ``rows`` (already aged to step ``t``) to the tier (all-or-nothing)."""
        start = self.rows
        self._pending.clear()
        self.tier.write(rows)
        self.seg_start = np.append(self.seg_start, start)
        self.seg_t = np.append(self.seg_t, int(t))

    def _aged(self, rows, lo: int, n: int, t: int):
        rows = _padded(rows, n, self.tier.chunk_rows, self.tier.shapes())
        if n == 0:
            return rows
        return aged(rows, lo, self.seg_start, self.seg_t, t, self.retention, self.weighted)

    def read_chunk(self, i: int, n: int, t: int, fields=FIELDS):
        """Host side of a cold read: chunk ``i`` of the first ``n`` cold rows, padded and aged to
        ``t``; reads of the next ``read_ahead`` chunks in the direction of travel (forward pass
        up, rematerialised backward pass down) are put in flight."""
        c = self.tier.chunk_rows
        n = min(int(n), self.rows)
        n_chunks = -(-n // c)
        fields = tuple(fields)
        issue = lambda j: self.tier.issue(j * c, min(n, (j + 1) * c), fields)
        futs = self._pending.pop((i, n, fields), None) or issue(i)
        if i == 0 or i == n_chunks - 1:   # a pass starts at an end
            step = 1 if i == 0 else -1
        else:
            step = -1 if self._last is not None and i < self._last else 1
        self._last = i
        ahead = {(j, n, fields) for j in range(i + step, i + step * (self.read_ahead + 1), step) if 0 <= j < n_chunks}
        for key in list(self._pending):
            if key not in ahead:
                del self._pending[key]
        for key in ahead:
            if key not in self._pending:
                self._pending[key] = issue(key[0])
        try:
            rows = {f: fu.result() for f, fu in futs.items()}
        except TierError:
            raise
        except Exception as e:
            raise TierError(f"reading the cold tier at {self.tier.url} failed: {e}") from e
        rows = self._aged(rows, i * c, max(0, min(c, n - i * c)), t)
        return tuple(np.ascontiguousarray(rows[f], self.tier.dt(f)) for f in fields)

    def all_rows(self, t: int) -> Dict[str, np.ndarray]:
        """Every cold row, aged to step ``t`` (only for tiers that fit in RAM: tests, export)."""
        out = {f: [] for f in FIELDS}
        lo = 0
        for rows, c in self.tier.chunks():
            rows = self._aged(rows, lo, c, t)
            lo += c
            for f in FIELDS:
                out[f].append(np.array(rows[f][:c]))
        shapes = self.tier.shapes()
        return {f: (np.concatenate(p) if p else np.zeros((0,) + shapes[f], self.tier.dt(f))) for f, p in out.items()}

    def compact(self, t: int, evict: Callable, aged_rows: bool = True) -> int:
        """Drop the cold rows ``evict(rows, n, lo) -> keep`` refuses (rows aged to ``t`` when
        ``aged_rows``); returns the rows removed."""
        masks = []

        def keep(rows, lo):
            n = len(rows["w"])
            view = self._aged(rows, lo, n, t) if aged_rows else rows
            k = np.asarray(evict(view, n, lo), bool)[:n]
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

    def reference(self) -> dict:
        return {"url": self.tier.url, "generation": self.tier.generation, "rows_cold": self.rows,
                "owner": self.tier.owner, "chunk_rows": self.tier.chunk_rows, "dtype": str(self.tier.dtype),
                "spill": {"seg_start": self.seg_start.tolist(), "seg_t": self.seg_t.tolist()}}


# ---------------------------------------------------------------------------------------------
# the backend


def _spec_json(spec):
    if spec is None:
        return None
    d = dataclasses.asdict(spec)
    d["hyper"] = [list(p) for p in d.get("hyper", ())]
    return d


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

    name = "tiered"

    def __post_init__(self):
        if self.directory is None:
            raise ValueError("Tiered needs a directory (a folder or a TensorStore kvstore URL)")
        object.__setattr__(self, "directory", os.fspath(self.directory))
        if not isinstance(self.ram_budget_bytes, int) or self.ram_budget_bytes <= 0:
            raise ConfigError(f"ram_budget_bytes must be a positive integer, got {self.ram_budget_bytes!r}")
        object.__setattr__(self, "_layers", {})    # name -> (row bytes, store or {shard: store})
        # unique in the process, the same in every fresh process: the key is part of the compiled programs
        # (the native cold read's attribute), so a resumed run finds them in the persistent compilation cache
        object.__setattr__(self, "_key", f"tier-{next(_KEYS)}")
        object.__setattr__(self, "_spills", [0, 0])   # spills, spills at the last compaction

    def __repr__(self):
        return f"Tiered({self.directory!r}, ram_budget_bytes={self.ram_budget_bytes})"

    @property
    def buffer_bytes(self) -> int:
        """RAM the cold reads use beside the budget: ``read_ahead + 2`` chunks per layer."""
        return sum((self.read_ahead + 2) * self._chunk_for(rb) * rb for rb, _ in self._layers.values())

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
        total = sum(rb for rb, _ in self._layers.values()) or 1
        return int(self.ram_budget_bytes // total)

    def _chunk_rows(self, mem) -> int:
        if self.chunk_rows is not None:
            return int(self.chunk_rows)
        big = max([rb for rb, _ in self._layers.values()] + [mem.row_bytes])
        fit = 1 << max(int(COLD_CHUNK_BYTES // big).bit_length() - 1, 0)
        quarter = 1 << max((self.hot_rows_per_layer // 4).bit_length() - 1, 0)
        return max(memlib.ROW_QUANTUM, min(fit, quarter))

    def _check_layer(self, mem, name):
        pol = mem.policy
        if pol is not None and pol.trains_rows:
            raise ValueError(f"layer {name} is hybrid (its policy {pol.name} trains the stored rows): its rows cannot "
                             f"spill to disk, where they would not be trained; keep this layer in RAM")
        if pol is not None and pol.dynamic_age:
            raise ValueError(f"layer {name}'s policy {pol.name} fades the rows by an amount decided at run time, "
                             f"which cold rows (faded lazily by a static retention) cannot follow; keep this layer "
                             f"in RAM")
        if pol is not None and getattr(pol, "max_rows", None):
            raise ValueError(f"layer {name} has a capacity policy ({pol.name}), which keeps its rows in RAM; "
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
        self._layers.setdefault(name, (mem.row_bytes, None))

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
        key = f"{self._key}/{name}"
        self._layers[name] = (mem.row_bytes, key)
        _STORES[key] = store
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
            raise ValueError(f"cannot free room in the hot rows ({exact} rows, chunks of {c}, budget {hot} rows)")
        host = {f: np.asarray(getattr(mem, f))[:n] for f in FIELDS}
        # a failed write raises TierWriteError with this memory unchanged
        store.spill(host, int(mem.t))
        del host   # views of the tables: the shift below writes into them
        if exact - n >= c:
            moved = _shift_front(mem, jnp.asarray(n, jnp.int32), step=c)
        else:
            moved = _drop_front(mem, jnp.asarray(n, jnp.int32))
        out = moved.replace(ext={"cold": self._view(view.ref.key, store.rows, mem, c)})
        self._spills[0] += 1
        return out

    def due_compaction(self) -> bool:
        """Whether ``compact_every`` spills happened since the last :meth:`compact` (the trainer
        then prunes the cold rows with the layers' policies)."""
        return bool(self.compact_every) and self._spills[0] - self._spills[1] >= self.compact_every

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
        self._spills[1] = self._spills[0]
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

    # ------------------------------------------------------------------ per shard (for Sharded(tiered=...))
    def attach_shards(self, sharded, mem, name: str):
        self.register(mem, name)
        cs = sharded.block(mem)
        chunk = self._chunk_rows(mem)
        hot = self.hot_rows_per_layer
        if hot < 2 * chunk:
            raise ConfigError(f"RAM budget {self.ram_budget_bytes} B is too small: it holds {hot} rows per shard and "
                             f"layer; spilling needs at least 2 chunks of {chunk} rows: raise ram_budget_bytes")
        key = f"{self._key}/{name}"
        stores = {}
        mine = sorted({(p.index[0].start or 0) // cs for p in mem.k.addressable_shards})
        for j in mine:
            stores[j] = self._open_store(join_url(join_url(self.directory, _safe(name)), f"shard-{j}"), mem,
                                         f"{name} shard {j}", chunk)
        _STORES[key] = stores
        self._layers[name] = (mem.row_bytes, key)
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
        arrays, new_sizes = sharded._compact([getattr(mem, f) for f in FIELDS],
                                             jax.device_put(jnp.asarray(keep), sharded.rows_sharding()), mem.size, cs)
        moved = mem.replace(**dict(zip(FIELDS, arrays)), size=new_sizes)
        moved = sharded._put(moved)
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
                                  f"without tiered=")
        key = f"{self._key}/{name}"
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
    s = sharded.n_shards
    if jax.process_count() == 1:
        return np.asarray([local[j] for j in range(s)], np.int64)
    from jax.experimental import multihost_utils

    mine = np.full(s, -1, np.int64)
    for j, n in local.items():
        mine[j] = n
    allv = np.asarray(multihost_utils.process_allgather(mine))
    return allv.max(axis=0)


def _allgather_json(sharded, local: Dict[int, dict], mem) -> list:
    """Per-shard JSON-able values gathered to every process, as a list by shard."""
    s = sharded.n_shards
    if jax.process_count() == 1:
        return [local[j] for j in range(s)]
    from jax.experimental import multihost_utils

    blob = json.dumps({str(j): v for j, v in local.items()}).encode()
    size = np.asarray([len(blob)], np.int64)
    sizes = np.asarray(multihost_utils.process_allgather(size)).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:len(blob)] = np.frombuffer(blob, np.uint8)
    bufs = np.asarray(multihost_utils.process_allgather(buf))
    out = {}
    for b, n in zip(bufs, sizes):
        out.update(json.loads(bytes(b[:n]).decode()))
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
