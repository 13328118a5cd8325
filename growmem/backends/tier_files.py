"""The cold tiers' files (:mod:`growmem.backends.tiered`): URLs of folders and kvstores, whole-chunk
reads straight from a local chunk file (``O_DIRECT`` where the file system allows), the per-chunk CRC32
of the rows written, and the tier errors."""
from __future__ import annotations

import concurrent.futures
import errno
import os
import threading
import urllib.parse
import zlib
from typing import Dict, List, Optional

import numpy as np

from .. import memory as memlib
from ..errors import GrowmemError

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
