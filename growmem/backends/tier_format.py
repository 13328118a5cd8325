"""One cold tier on disk (:mod:`growmem.backends.tiered`): its zarr v3 arrays through TensorStore, its
manifest (format, shapes, row count, generation, checksums) and the integrity checks of its chunks."""
from __future__ import annotations

import bisect
import json
import os
import sys
import threading
import uuid
from typing import Callable, Dict, List, Optional

import numpy as np

from ..errors import CorruptCheckpointError
from . import tier_files as files
from .tier_files import (FIELDS, MANIFEST, TIER_FORMAT, TIER_VERSION, TierError, TierWriteError, _context, _crc32,
    checksums_of, local_path, row_bytes, url_of)

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
        self._local = local_path(url) if all(files.raw_chunk_files(a.spec().to_json().get("metadata", {}),
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
        :func:`files.read_chunk_file` on a small thread pool — no TensorStore decode and, with
        ``O_DIRECT``, no copy out of the page cache; anything else goes through TensorStore."""
        c = self.chunk_rows
        if (files.LOCAL_READS and self._local is not None and sys.byteorder == "little" and lo % c == 0
                and 0 < hi - lo <= c):
            pool, gen, arrays, sums = files._reader_pool(), self.generation, self._arrays, self.checksums
            return {f: pool.submit(self._read_local, f, lo // c, hi - lo, gen, arrays, sums) for f in fields}
        return {f: self._arrays[f][lo:hi].read() for f in fields}

    def collect(self, futs) -> Dict[str, np.ndarray]:
        """The rows of an :meth:`issue`: ``{field: array}``; a failed read is a :class:`TierError` naming
        the tier."""
        try:
            return {f: fu.result() for f, fu in futs.items()}
        except TierError:
            raise
        except Exception as e:
            raise TierError(f"reading the cold tier at {self.url} failed: {e}") from e

    def _read_local(self, f: str, j: int, n: int, generation: int, arrays, checksums) -> np.ndarray:
        shape, dt = self.shapes()[f], self.dt(f)
        path = os.path.join(self._local, self.chunk_key(f, j, generation))
        per_row = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = files.read_chunk_file(path, self.chunk_rows * per_row)
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
            rows = self.collect(futs)
            if verify:
                self.check_chunk(lo // c, rows)
            yield rows, min(n, lo + c) - lo
