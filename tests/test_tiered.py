"""TensorStore cold tier: results equal the all-in-RAM memory; failures leave the memory intact."""
import json
import os
import uuid

import jax.numpy as jnp
import numpy as np
import pytest

import growmem as gm
from growmem import checkpoint as ck
from growmem import memory as memlib
from growmem.backends.tiered import ColdTier, Tiered, TierError, TierWriteError, row_bytes
from growmem.layers import retrieve
from growmem.store import Store

D, E, CHUNK = 16, 3, 64


def _spec(kernel="weighted_softmax", momentum=0.5):
    hyper = {"beta": 1.0} if kernel == "weighted_softmax" else {}
    return gm.GrowingSpec.make(kernel, temperature=0.5, eta=1.0, momentum=momentum, chunk=CHUNK, **hyper)


def _budget(hot_rows):
    return row_bytes(D, E) * hot_rows   # rows kept on the device


def _tier(location, kernel="weighted_softmax", hot_rows=160, **kw):
    return Store.create(_spec(kernel), D, E, name="readout",
                        backend=Tiered(location, ram_budget_bytes=_budget(hot_rows), chunk_rows=CHUNK, **kw))


def _cold(location):
    """Every cold row of the tier at ``location``, read straight from disk."""
    tier = ColdTier.open(location)
    parts = {f: [] for f in memlib.FIELDS}
    for rows, n in tier.chunks():
        for f in parts:
            parts[f].append(np.asarray(rows[f][:n]))
    return tier, {f: np.concatenate(p) if p else np.zeros(0) for f, p in parts.items()}


def _batches(n_steps=10, b=57, seed=0):
    rs = np.random.RandomState(seed)
    for step in range(n_steps):
        yield (rs.rand(b).astype(np.float32), rs.randn(b, D).astype(np.float32), rs.randn(b, E).astype(np.float32),
               step + 1, rs.rand(b) > 0.2)


def _fill(tier, mem=None, **kw):
    for w, k, v, born, m in _batches(**kw):
        tier.append(w, k, v, born=born, mask=m)
        tier.advance()
        if mem is not None:
            mem = memlib.append(memlib.with_capacity(mem, int(mem.size) + len(w)), w, k, v, born=born, mask=m)
            mem = mem.replace(t=mem.t + 1)
    return mem


@pytest.mark.parametrize("kernel", ["weighted_softmax", "rbf", "linear"])
def test_retrieval_over_cold_and_hot_rows_equals_all_in_ram(tmp_path, kernel):
    tier = _tier(tmp_path / "t", kernel)
    mem = _fill(tier, memlib.empty(D, E, spec=_spec(kernel)))
    assert tier.rows_cold > 0 and 0 < tier.rows_hot <= tier.hot_capacity
    assert tier.rows_cold % CHUNK == 0  # spills are whole chunks
    assert tier.size == int(mem.size)
    q = np.random.RandomState(1).randn(20, D).astype(np.float32)
    ref = np.asarray(retrieve(mem, q))
    out = np.asarray(tier.retrieve(q))
    assert np.abs(out - ref).max() <= 1e-5 * (np.abs(ref).max() + 1.0)
    # novelty search spans both tiers
    keys = np.asarray(mem.k[: int(mem.size)])
    d2 = ((q[:, None] - keys[None]) ** 2).sum(-1).min(1)
    np.testing.assert_allclose(np.asarray(tier.min_sq_distance(q)), d2, rtol=1e-4, atol=1e-3)
    tau = float(np.sqrt(np.median(d2)))
    assert np.array_equal(tier.novel(q, tau), d2 > tau ** 2)


def test_rows_keep_their_order_and_the_tier_reopens(tmp_path):
    tier = _tier(tmp_path / "t")
    mem = _fill(tier, memlib.empty(D, E, spec=_spec()))
    rows = tier.rows()
    for f in ("w", "k", "v", "born"):
        assert np.array_equal(rows[f], mem.rows()[f])
    # zarr v3 arrays chunked along rows, one per field, under <directory>/<layer>
    meta = json.loads((tmp_path / "t" / "readout" / "gen-0" / "k" / "zarr.json").read_text())
    assert meta["zarr_format"] == 3 and meta["chunk_grid"]["configuration"]["chunk_shape"] == [CHUNK, D]
    again, cold = _cold(tmp_path / "t" / "readout")
    assert again.rows == tier.rows_cold   # the tier holds the cold rows; hot rows live in checkpoints
    assert np.array_equal(cold["k"], rows["k"][: tier.rows_cold])


@pytest.mark.parametrize("name", ["x%41y", "a#b", "sp ace?q=1"])
def test_a_folder_name_that_looks_like_url_syntax_holds_the_rows_itself(tmp_path, name):
    """``%41`` must not be decoded into ``A`` (another folder), nor ``#`` / ``?`` start a fragment or a query."""
    tier = _tier(tmp_path / name)
    mem = _fill(tier, memlib.empty(D, E, spec=_spec()), n_steps=5)
    assert tier.rows_cold > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert (tmp_path / name / "readout" / "gen-0" / "k" / "zarr.json").is_file()
    again, cold = _cold(tmp_path / name / "readout")
    assert again.rows == tier.rows_cold and np.array_equal(cold["k"], np.asarray(mem.k[: tier.rows_cold]))


def test_any_tensorstore_kvstore_url_works():
    tier = _tier(f"memory://growmem-{uuid.uuid4().hex}/", hot_rows=140)
    mem = _fill(tier, memlib.empty(D, E, spec=_spec()), n_steps=5)
    assert tier.rows_cold > 0
    q = np.random.RandomState(2).randn(8, D).astype(np.float32)
    np.testing.assert_allclose(np.asarray(tier.retrieve(q)), np.asarray(retrieve(mem, q)), rtol=1e-5, atol=1e-5)


def test_unwritable_directory_is_a_clear_error(tmp_path):
    target = "/proc/growmem-tier" if os.geteuid() == 0 else str(tmp_path / "ro" / "t")
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(TierError, match="cannot write the cold tier directory"):
        _tier(target)


def _snapshot(tier):
    return tier.rows_cold, tier.rows_hot, {f: a.copy() for f, a in tier.rows().items()}


def _assert_unchanged(tier, snap):
    cold, hot, rows = snap
    assert (tier.rows_cold, tier.rows_hot) == (cold, hot)
    now = tier.rows()
    for f in rows:
        assert np.array_equal(now[f], rows[f])
    url = tier.backend.store(tier.mem).tier.url
    manifest = json.loads(bytes(ColdTier._kv(url).read("tier.json").result().value))
    assert manifest["rows_cold"] == cold


def test_failed_spill_leaves_the_memory_unchanged(tmp_path, monkeypatch):
    tier = _tier(tmp_path / "t")
    _fill(tier, n_steps=4)
    snap = _snapshot(tier)
    real = ColdTier._write_manifest

    def disk_full(kv, manifest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ColdTier, "_write_manifest", staticmethod(disk_full))
    rs = np.random.RandomState(5)
    with pytest.raises(TierWriteError, match="No space left on device.*memory is unchanged"):
        for _ in range(10):
            snap = _snapshot(tier)
            tier.append(rs.rand(57), rs.randn(57, D), rs.randn(57, E))
    monkeypatch.setattr(ColdTier, "_write_manifest", staticmethod(real))
    # the rows accepted before the failing append are still all there; the failing append added nothing
    _assert_unchanged(tier, snap)
    reopened, cold = _cold(tmp_path / "t" / "readout")
    assert reopened.rows == snap[0]
    assert np.array_equal(cold["k"], snap[2]["k"][: snap[0]])


def test_real_disk_full_is_a_clear_error_and_leaves_the_memory_unchanged(small_tmpfs):
    mnt = small_tmpfs("256k")
    tier = _tier(mnt / "t", hot_rows=160)
    rs = np.random.RandomState(0)
    err = None
    for i in range(400):  # ~1 MB of rows into a 256 KiB filesystem
        snap = _snapshot(tier)
        try:
            tier.append(rs.rand(57), rs.randn(57, D), rs.randn(57, E), born=i + 1)
        except TierWriteError as e:
            err = e
            break
    assert err is not None, "the filesystem never filled"
    assert "No space left" in str(err) or "ENOSPC" in str(err) or "space" in str(err).lower()
    _assert_unchanged(tier, snap)
    q = rs.randn(4, D).astype(np.float32)
    assert np.isfinite(np.asarray(tier.retrieve(q))).all()


def test_checkpoint_references_the_cold_tier_by_generation_and_row_count(tmp_path):
    tier = _tier(tmp_path / "t")
    _fill(tier, n_steps=12)
    q = np.random.RandomState(3).randn(8, D).astype(np.float32)
    at_save = np.asarray(tier.retrieve(q))
    rows_at_save = tier.rows()
    c = ck.Checkpointer(tmp_path / "c")
    c.save(None, step=6, stores={"readout": tier})
    info = ck.inspect(tmp_path / "c")
    layer = info["layers"][0]
    assert layer["cold"] == tier.rows_cold and layer["hot"] == tier.rows_hot and layer["generation"] == 0
    cold_bytes_on_disk = sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert cold_bytes_on_disk < tier.rows_cold * row_bytes(D, E)  # the cold rows are referenced, not copied
    _fill(tier, n_steps=6, seed=9)  # rows written after the checkpoint
    assert tier.rows_cold > info["layers"][0]["cold"]
    onto = lambda: Tiered(tmp_path / "t", ram_budget_bytes=_budget(160), chunk_rows=CHUNK, resume=True)
    r = c.restore(None, stores={"readout": onto()})
    back = r.stores["readout"]
    assert back.rows_cold == layer["cold"] and back.rows_hot == layer["hot"]
    for f, a in back.rows().items():
        assert np.array_equal(a, rows_at_save[f])
    np.testing.assert_array_equal(np.asarray(back.retrieve(q)), at_save)
    # export reads the cold rows through the reference
    ck.export(tmp_path / "c", tmp_path / "x.npz")
    z = np.load(tmp_path / "x.npz")
    assert np.array_equal(z["readout/k"], rows_at_save["k"])
    # after a compaction (new generation) the old checkpoint refuses to restore
    back.compact(lambda rows, start: rows["w"] > 0.5)
    with pytest.raises(TierError, match="generation 0 .* now at generation 1"):
        c.restore(None, stores={"readout": onto()})
    c.close()


def test_compact_evicts_cold_rows_exactly(tmp_path):
    tier = _tier(tmp_path / "t")
    _fill(tier, n_steps=8)
    rows = tier.rows()
    n_cold = tier.rows_cold
    tier.compact(lambda r, start: r["born"] % 2 == 0)
    keep = np.concatenate([rows["born"][:n_cold] % 2 == 0, np.ones(len(rows["born"]) - n_cold, bool)])
    now = tier.rows()
    for f in rows:
        assert np.array_equal(now[f], rows[f][keep])
    assert tier.backend.store(tier.mem).tier.generation == 1
    mem = memlib.from_rows(rows["w"][keep], rows["k"][keep], rows["v"][keep], rows["born"][keep], spec=_spec())
    mem = mem.replace(t=jnp.asarray(tier.t, jnp.int32))
    q = np.random.RandomState(4).randn(8, D).astype(np.float32)
    np.testing.assert_allclose(np.asarray(tier.retrieve(q)), np.asarray(retrieve(mem, q)), rtol=1e-5, atol=1e-5)


def test_ram_budget_bounds_the_hot_rows(tmp_path):
    tier = _tier(tmp_path / "t", hot_rows=160)
    for w, k, v, born, m in _batches(n_steps=20):
        tier.append(w, k, v, born=born, mask=m)
        assert tier.rows_hot <= tier.hot_capacity
        # the budget bounds the rows on the device; the read-ahead buffers come on top, counted apart
        assert tier.rows_hot * row_bytes(D, E) <= tier.backend.ram_budget_bytes
        assert tier.backend.buffer_bytes == (tier.backend.read_ahead + 2) * CHUNK * row_bytes(D, E)
    with pytest.raises(ValueError, match="RAM budget .* too small"):
        _tier(tmp_path / "u", hot_rows=100)   # fewer than 2 chunks
