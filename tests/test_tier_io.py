"""The tier's I/O paths. Cold chunks of a local tier are read from their files (O_DIRECT where
the file system has it), not through TensorStore: the bytes must be exactly what TensorStore
reads, in every case. A spill shifts the hot rows in place, appends write in place, and a hot
table grows once to the budget: checked against numpy and by what stays alive."""
import errno
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import growmem as gm
from growmem import memory as memlib
from growmem.backends import tier_files, tiered
from growmem.backends.tiered import ColdStore, ColdTier, Tiered, TierError, row_bytes
from growmem.store import Store

D, E, C = 24, 3, 64   # a v chunk is C * E * 4 = 768 bytes: not a multiple of the O_DIRECT block


def _rows(n, seed, dtype=np.float32):
    rs = np.random.RandomState(seed)
    return {"w": rs.rand(n).astype(np.float32), "k": rs.randn(n, D).astype(dtype),
            "v": rs.randn(n, E).astype(dtype), "born": rs.randint(1, 1000, n).astype(np.int32)}


def _through_tensorstore(tier, lo, hi):
    # the independent path: TensorStore decoding the zarr arrays
    return {f: tier._arrays[f][lo:hi].read().result() for f in tier.shapes()}


def _spy(monkeypatch):
    calls = []
    real = tier_files.read_chunk_file

    def spy(path, nbytes, direct=True):
        calls.append(path)
        return real(path, nbytes, direct)

    monkeypatch.setattr(tier_files, "read_chunk_file", spy)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_local_chunk_reads_equal_tensorstore_reads(tmp_path, monkeypatch, dtype):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C, dtype=dtype)
    tier.write(_rows(150, 0, dtype))   # 2 whole chunks and a partial one
    tier.write(_rows(40, 1, dtype))    # completes the partial chunk in a second write
    calls = _spy(monkeypatch)
    for lo, hi in [(0, C), (C, 2 * C), (2 * C, 190)]:
        futs = tier.issue(lo, hi)
        got = {f: fu.result() for f, fu in futs.items()}
        ref = _through_tensorstore(tier, lo, hi)
        for f in ref:
            assert got[f].dtype == ref[f].dtype and got[f].shape == ref[f].shape, f
            assert np.array_equal(got[f].view(np.uint8), ref[f].view(np.uint8)), (lo, f)
    assert len(calls) == 3 * 4   # every chunk and field came from its file
    # a range that is not one whole chunk goes through TensorStore, with the same rows
    got = {f: fu.result() for f, fu in tier.issue(10, 100).items()}
    assert len(calls) == 12
    for f, ref in _through_tensorstore(tier, 10, 100).items():
        assert np.array_equal(np.asarray(got[f]).view(np.uint8), ref.view(np.uint8))


def test_a_chunk_without_a_file_reads_as_tensorstore_fills_it(tmp_path):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C)
    rows = _rows(2 * C, 2)
    rows["born"][C:] = 0      # only the fill value: TensorStore stores no file for this chunk
    tier.write(rows)
    assert not (tmp_path / "t" / "gen-0" / "born" / "c" / "1").exists()
    got = tier.issue(C, 2 * C)["born"].result()
    assert got.shape == (C,) and not got.any()
    assert np.array_equal(tier.issue(0, C)["born"].result(), rows["born"][:C])


def test_a_file_system_without_o_direct_is_read_through_the_page_cache(tmp_path, monkeypatch):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C)
    rows = _rows(C, 3)
    tier.write(rows)
    real_open, refused = os.open, []

    def no_direct(path, flags, *a):
        if flags & getattr(os, "O_DIRECT", 0):
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    monkeypatch.delattr(os, "RWF_NOWAIT", raising=False)   # nothing from the page cache first
    got = {f: fu.result() for f, fu in tier.issue(0, C).items()}
    if hasattr(os, "O_DIRECT"):
        assert len(refused) == 4
    for f in rows:
        assert np.array_equal(got[f], rows[f])


def _opens(monkeypatch):
    real_open, direct = os.open, []

    def spy(path, flags, *a):
        direct.append(bool(flags & getattr(os, "O_DIRECT", 0)))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", spy)
    return direct


@pytest.mark.skipif(not (hasattr(os, "O_DIRECT") and hasattr(os, "RWF_NOWAIT")), reason="Linux only")
def test_pages_in_the_page_cache_are_copied_from_it_and_the_rest_read_with_o_direct(tmp_path, monkeypatch):
    n = 3 * C   # k: 3 chunks of C * D * 4 = 6144 bytes: not a multiple of the 4096-byte block
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=n)
    rows = _rows(n, 9)
    tier.write(rows)
    path = str(tmp_path / "t" / "gen-0" / "k" / "c" / "0" / "0")
    nbytes = rows["k"].nbytes
    # a chunk just written is in the page cache: copied from it, the disk never asked
    direct = _opens(monkeypatch)
    assert np.array_equal(tier_files.read_chunk_file(path, nbytes).view(np.float32).reshape(n, D), rows["k"])
    assert direct == [False]
    # the page cache holds only the first `cached` bytes: the rest comes with O_DIRECT from an aligned offset
    real_preadv = os.preadv
    for cached in (0, 5000, 8192, nbytes):
        def preadv(fd, bufs, offset, flags=0, cached=cached):
            if flags & os.RWF_NOWAIT:
                if offset >= cached:
                    raise BlockingIOError(errno.EAGAIN, "not cached")
                view = memoryview(bufs[0])[:cached - offset]
                return real_preadv(fd, [view], offset)
            return real_preadv(fd, bufs, offset) if not flags else real_preadv(fd, bufs, offset, flags)

        monkeypatch.setattr(os, "preadv", preadv)
        direct.clear()
        got = tier_files.read_chunk_file(path, nbytes)
        assert np.array_equal(got.view(np.float32).reshape(n, D), rows["k"]), cached
        assert direct == ([False] if cached >= nbytes else [False, True]), (cached, direct)


def test_a_truncated_chunk_file_is_an_error_not_zeros(tmp_path):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C)
    tier.write(_rows(2 * C, 4))
    path = tmp_path / "t" / "gen-0" / "k" / "c" / "1" / "0"
    with open(path, "r+b") as fh:
        fh.truncate(100)
    store = ColdStore(tier, retention=1.0, weighted=True)
    store.read_chunk(0, 2 * C, 0)   # the whole chunk before it is fine
    with pytest.raises(TierError, match="truncated"):
        store.read_chunk(1, 2 * C, 0)


def test_local_reads_can_be_switched_off(tmp_path, monkeypatch):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C)
    rows = _rows(C, 5)
    tier.write(rows)
    calls = _spy(monkeypatch)
    monkeypatch.setattr(tier_files, "LOCAL_READS", False)
    got = {f: fu.result() for f, fu in tier.issue(0, C).items()}
    assert calls == []
    for f in rows:
        assert np.array_equal(got[f], rows[f])


def _memory(size, cap, seed=6):
    rs = np.random.RandomState(seed)
    mem = memlib.with_capacity(memlib.empty(D, E), cap)
    return memlib.append(mem, rs.rand(size).astype(np.float32), rs.randn(size, D).astype(np.float32),
                         rs.randn(size, E).astype(np.float32), np.arange(1, size + 1, dtype=np.int32))


@pytest.mark.parametrize("size,n,step", [(1024, 256, 256), (1000, 256, 128), (700, 512, 128), (512, 256, 256),
                                         (1000, 384, 384)])   # 384 does not divide the capacity 1024
def test_shift_front_drops_the_spilled_rows_in_place(size, n, step):
    mem = _memory(size, 1024)
    before = {f: np.array(getattr(mem, f)) for f in memlib.FIELDS}
    old_k = mem.k
    out = tiered._shift_front(mem, jnp.asarray(n, jnp.int32), step=step)
    assert old_k.is_deleted()   # donated: the shift wrote into the table, no second one
    assert int(out.size) == size - n and out.capacity == 1024
    for f, a in before.items():   # numpy: rows n..size to the front, zeros after
        want = np.zeros_like(a)
        want[:size - n] = a[n:size]
        assert np.array_equal(np.asarray(getattr(out, f)), want), f


def test_store_appends_write_into_the_table():
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0)
    store = Store.create(spec, D, E)
    rs = np.random.RandomState(7)
    rows = [(rs.rand(8).astype(np.float32), rs.randn(8, D).astype(np.float32), rs.randn(8, E).astype(np.float32))
            for _ in range(3)]
    store.append(*rows[0])
    held = store.mem.k
    store.append(*rows[1])
    if store.mem.capacity == held.shape[0]:   # same table: the append was in place
        assert held.is_deleted()
    before = store.rows()            # numpy arrays of the tables: the next append must not write under them
    snapshot = {f: a.copy() for f, a in before.items()}
    store.append(*rows[2])
    for f, a in before.items():
        assert np.array_equal(a, snapshot[f]), f
    got = store.rows()
    assert np.array_equal(got["k"], np.concatenate([r[1] for r in rows]))
    assert np.array_equal(got["w"], np.concatenate([r[0] for r in rows]))


def test_a_tiered_table_grows_to_its_budget_in_one_copy(tmp_path, monkeypatch):
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0, chunk=C)
    hot = 4000
    store = Store.create(spec, D, E, backend=Tiered(tmp_path / "t", ram_budget_bytes=row_bytes(D, E) * hot,
                                                    chunk_rows=C))
    grown = []
    real = memlib.with_capacity
    monkeypatch.setattr(memlib, "with_capacity", lambda mem, c: grown.append(c) or real(mem, c))
    rs = np.random.RandomState(8)
    for _ in range(60):
        b = 100
        store.append(rs.rand(b).astype(np.float32), rs.randn(b, D).astype(np.float32),
                     rs.randn(b, E).astype(np.float32))
    assert store.rows_cold > 0
    # geometric growth up to half the budget, then straight to the budget: never past it, no cut back
    assert grown == sorted(grown) and len(grown) >= 3 and grown[-1] == hot, grown
    assert all(2 * g <= hot for g in grown[:-1]), grown
    assert store.mem.capacity == memlib.round_capacity(hot)


def test_the_environment_can_send_every_read_through_tensorstore():
    import subprocess
    import sys

    code = "import growmem.backends.tier_files as t; print(t.LOCAL_READS)"
    for value, want in (("tensorstore", "False"), ("TensorStore", "False"), ("local", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "GROWMEM_TIER_READS": value, "JAX_PLATFORMS": "cpu"})
        assert out.returncode == 0 and out.stdout.strip() == want, (value, out.stdout, out.stderr[-500:])


def test_only_raw_little_endian_chunk_files_are_read_directly(tmp_path, monkeypatch):
    tier = ColdTier.create(tmp_path / "t", d_in=D, d_out=E, chunk_rows=C)
    meta = tier._arrays["k"].spec().to_json()["metadata"]
    assert tier_files.raw_chunk_files(meta, C) and tier._local is not None
    compressed = dict(meta, codecs=[{"name": "bytes", "configuration": {"endian": "little"}},
                                    {"name": "zstd", "configuration": {"level": 1}}])
    for other in (compressed, dict(meta, codecs=[{"name": "bytes", "configuration": {"endian": "big"}}]),
                  dict(meta, chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}}),
                  dict(meta, chunk_key_encoding={"name": "default", "configuration": {"separator": "."}}),
                  dict(meta, chunk_grid={"name": "regular", "configuration": {"chunk_shape": [C, D // 2]}})):
        assert not tier_files.raw_chunk_files(other, C), other
    assert not tier_files.raw_chunk_files(meta, 2 * C)
    # a tier whose arrays are not raw is read through TensorStore, with the same rows
    monkeypatch.setattr(tier_files, "raw_chunk_files", lambda metadata, chunk_rows: False)
    rows = _rows(C, 10)
    tier.write(rows)
    again = ColdTier.open(tmp_path / "t")
    assert again._local is None
    calls = _spy(monkeypatch)
    got = {f: fu.result() for f, fu in again.issue(0, C).items()}
    assert calls == []
    for f in rows:
        assert np.array_equal(got[f], rows[f])
