"""Orbax checkpoints of ``ShardedMemory``: 4 forced host devices, a real 2-process
``jax.distributed`` run, inspect/export, and clear errors."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import growmem as gm
from growmem import checkpoint as ck
from growmem.backends.sharded import Sharded, row_mesh
from growmem.memory import FIELDS
from growmem.store import Store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sharded_ckpt_worker as worker  # noqa: E402  (data and spec shared with the 2-process workers)

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
MU = 0.5


def _spec(temperature=0.5):
    return gm.GrowingSpec.make("weighted_softmax", temperature=temperature, eta=1.0, beta=1.0, momentum=MU, chunk=64)


def _coeff(born, t):
    """Momentum coefficient (Eq. 23), written out in numpy: 1 for initial rows."""
    age = np.maximum(t - np.asarray(born, np.float64), 0)
    return np.where(np.asarray(born) < 0, 1.0, (1 - MU ** (age + 1)) / (1 - MU))


def _np_ref(ref, q, w, k, v, born, t):
    return ref.weighted_softmax(q, k, v, w, 0.5, coeff=_coeff(born, t))


def _bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _close(out, want):
    return np.abs(np.asarray(out, np.float64) - want).max() <= 1e-5 * (np.abs(want).max() + 1.0)


# ----------------------------------------------------------------------------- 4 forced host devices

_PRELUDE = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    import growmem as gm
    from growmem import checkpoint as ck
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.memory import FIELDS
    from growmem.store import Store
    assert len(jax.devices()) == 4, jax.devices()
    ckpt_dir, out = sys.argv[1], sys.argv[2]
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=0.5, eta=1.0, beta=1.0, momentum=0.5, chunk=64)
    rs = np.random.RandomState(1)
    n, d, e = 301, 8, 3
    rows = {"w": rs.rand(n).astype(np.float32), "k": rs.randn(n, d).astype(np.float32),
            "v": rs.randn(n, e).astype(np.float32), "born": rs.randint(-1, 4, n).astype(np.int32)}
    q = rs.randn(16, d).astype(np.float32)
    cand1 = [rs.rand(40).astype(np.float32), rs.randn(40, d).astype(np.float32), rs.randn(40, e).astype(np.float32)]
    mask1 = rs.rand(40) > 0.25
    cand2 = [rs.rand(7).astype(np.float32), rs.randn(7, d).astype(np.float32), rs.randn(7, e).astype(np.float32)]

    def dump(sm, prefix, res):
        res[prefix + "host_sizes"] = sm.host_sizes
        res[prefix + "next_shard"] = sm.next_shard
        res[prefix + "t"] = int(sm.t)
        res[prefix + "capacity"] = sm.capacity_per_shard
        res[prefix + "out"] = np.asarray(sm.retrieve(q))
        for f in FIELDS:
            blocks = sm.local_blocks(f)
            assert sorted(blocks) == list(range(sm.n_shards))
            res[prefix + "blocks_" + f] = np.stack([blocks[j] for j in range(sm.n_shards)])
""")

SAVE_4 = _PRELUDE + textwrap.dedent("""
    from growmem import memory as memlib
    mem = memlib.from_rows(rows["w"], rows["k"], rows["v"], rows["born"], spec=spec).replace(t=3)
    sm = Store.from_memory(mem, Sharded(row_mesh(4), placement="round_robin"), name="mem")
    sm.append(*cand1, born=4, mask=mask1)
    sm.advance(2)
    res = {"rows_" + f: a for f, a in rows.items()}
    res.update(q=q, mask1=mask1, **{f"cand1_{i}": a for i, a in enumerate(cand1)},
               **{f"cand2_{i}": a for i, a in enumerate(cand2)})
    dump(sm, "", res)
    with ck.Checkpointer(ckpt_dir) as c:
        c.save(None, 5, stores={"mem": sm})
    # the original keeps going: the restored memory must continue exactly like it
    res["assigned2"] = sm.append(*cand2, born=6)
    sm.advance()
    dump(sm, "after_", res)
    np.savez(out, **res)
    print("OK")
""")

RESTORE_4 = _PRELUDE + textwrap.dedent("""
    res = {}
    with ck.Checkpointer(ckpt_dir, create=False) as c:
        r = c.restore(stores={"mem": Sharded(row_mesh(4))})
        sm = r.stores["mem"]
        assert sm.spec == spec, sm.spec                    # rebuilt from the saved JSON
        assert sm.mem.k.sharding.spec == jax.sharding.PartitionSpec("rows")
        assert len({s.device for s in sm.mem.k.addressable_shards}) == 4
        dump(sm, "", res)
        res["assigned2"] = sm.append(*cand2, born=6)
        sm.advance()
        dump(sm, "after_", res)
        # another shard count: the rows are re-distributed over 2 shards
        sm2 = c.restore(stores={"mem": Sharded(row_mesh(2))}).stores["mem"]
        assert sm2.n_shards == 2
        res["redist_host_sizes"] = sm2.host_sizes
        res["redist_out"] = np.asarray(sm2.retrieve(q))
        res["redist_t"] = int(sm2.t)
    np.savez(out, **res)
    print("OK")
""")


def _run(script, *args):
    res = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-4000:]


def test_four_host_devices_save_then_restore_in_a_fresh_process_is_bitwise_and_appends_continue(tmp_path, ref):
    ckpt_dir = tmp_path / "ckpt"
    _run(SAVE_4, ckpt_dir, tmp_path / "saved.npz")
    _run(RESTORE_4, ckpt_dir, tmp_path / "restored.npz")
    s, r = np.load(tmp_path / "saved.npz"), np.load(tmp_path / "restored.npz")
    rows = {f: s["rows_" + f] for f in FIELDS}
    n = len(rows["w"])
    cand1 = [s[f"cand1_{i}"] for i in range(3)]
    mask1 = s["mask1"]
    n1 = int(mask1.sum())
    # what the saved shards hold, derived independently: round robin from shard 0, then the
    # appended batch continuing at shard n % 4
    assert s["host_sizes"].sum() == n + n1 and int(s["next_shard"]) == (n + n1) % 4 and int(s["t"]) == 5
    stream = {f: np.concatenate([rows[f], a[mask1]]) for f, a in zip(("w", "k", "v"), cand1)}
    stream["born"] = np.concatenate([rows["born"], np.full(n1, 4, np.int32)])
    for j in range(4):
        size = int(s["host_sizes"][j])
        for f in FIELDS:
            assert _bits(s["blocks_" + f][j][:size], stream[f][j::4]), (j, f)
    # restored: every shard's whole block (rows and padding), sizes, clock and placement are bitwise equal
    for key in ("host_sizes", "next_shard", "t", "capacity"):
        assert _bits(r[key], s[key]), key
    for f in FIELDS:
        assert _bits(r["blocks_" + f], s["blocks_" + f]), f
    # retrieval: bitwise equal to the original's, and equal to an unsharded float64 numpy reference
    q = s["q"]
    want = _np_ref(ref, q, stream["w"], stream["k"], stream["v"], stream["born"], 5)
    assert _bits(r["out"], s["out"]) and _close(r["out"], want)
    # appends after restore continue round robin from the saved next shard, exactly like the original
    start = int(s["next_shard"])
    assert r["assigned2"].tolist() == ((start + np.arange(7)) % 4).tolist() == s["assigned2"].tolist()
    assert int(r["after_next_shard"]) == (start + 7) % 4
    for f in FIELDS:
        assert _bits(r["after_blocks_" + f], s["after_blocks_" + f]), f
    cand2 = [s[f"cand2_{i}"] for i in range(3)]
    full = {f: np.concatenate([stream[f], a]) for f, a in zip(("w", "k", "v"), cand2)}
    full["born"] = np.concatenate([stream["born"], np.full(7, 6, np.int32)])
    want2 = _np_ref(ref, q, full["w"], full["k"], full["v"], full["born"], 6)
    assert _close(r["after_out"], want2) and _bits(r["after_out"], s["after_out"])
    # restored onto 2 shards: every row kept (re-distributed), same retrieval to float tolerance
    assert r["redist_host_sizes"].tolist() == [(n + n1 + 1) // 2, (n + n1) // 2] and int(r["redist_t"]) == 5
    assert _close(r["redist_out"], want)


# ----------------------------------------------------------------------------- 2 processes (jax.distributed)

def _two_processes(run, mode, ckpt_dir, tmp_path):
    outs = [tmp_path / f"{mode}{i}.npz" for i in range(2)]
    run(HERE / "sharded_ckpt_worker.py", lambda i, port: (mode, i, 2, port, ckpt_dir, outs[i]))
    return [np.load(o) for o in outs]


def test_two_processes_save_their_own_shards_and_restore_them_in_new_processes(tmp_path, ref, distributed_run):
    ckpt_dir = tmp_path / "ckpt"
    saved = _two_processes(distributed_run, "save", ckpt_dir, tmp_path)
    # each process wrote its own shard's data (Orbax: one OCDBT sub-store per process)
    for i in range(2):
        sub = ckpt_dir / str(worker.STEP) / "global" / f"ocdbt.process_{i}"
        assert sub.is_dir() and any(p.is_file() for p in (sub / "d").iterdir()), sub
    restored = _two_processes(distributed_run, "restore", ckpt_dir, tmp_path)
    rows, q, cand1, cand2 = worker.make_data()
    per = worker.N // 2
    by_shard = {int(z["shard"]): z for z in saved}
    assert sorted(by_shard) == [0, 1] and all(int(z["process_count"]) == 2 for z in saved + restored)
    for z in restored:
        j = int(z["shard"])
        s = by_shard[j]
        # the shard a process holds after restore is bitwise what the saving process held
        for f in FIELDS:
            assert _bits(z["block_" + f], s["block_" + f]), (j, f)
        for key in ("host_sizes", "next_shard", "t", "capacity"):
            assert _bits(z[key], s[key]), key
        # ... and is that process's half of the rows plus its round-robin share of the appended batch
        a1 = s["assigned1"]
        assert a1.tolist() == (np.arange(30) % 2).tolist()  # round robin from shard 0
        n_j = int(s["host_sizes"][j])
        mine_w = np.concatenate([rows["w"][j * per:(j + 1) * per], cand1["w"][a1 == j]])
        assert n_j == len(mine_w) and _bits(z["block_w"][:n_j], mine_w)
        assert not z["block_k"][n_j:].any()  # padding stays zero
        # the clear errors of the restore workers
        assert "saved with 2 shards but the target mesh has 1" in str(z["mismatch_error"])
        assert "single process" in str(z["export_error"])
    # retrieval matches an unsharded float64 numpy reference, before and after a post-restore append
    all_w = np.concatenate([rows["w"], cand1["w"]])
    all_k = np.concatenate([rows["k"], cand1["k"]])
    all_v = np.concatenate([rows["v"], cand1["v"]])
    all_born = np.concatenate([rows["born"], np.full(30, 6, np.int32)])
    want = _np_ref(ref, q, all_w, all_k, all_v, all_born, 7)
    want2 = _np_ref(ref, q, np.concatenate([all_w, cand2["w"]]), np.concatenate([all_k, cand2["k"]]),
                    np.concatenate([all_v, cand2["v"]]), np.concatenate([all_born, np.full(9, 8, np.int32)]), 8)
    for z in restored:
        assert _close(z["out"], want) and _close(z["out2"], want2)
        assert z["assigned2"].tolist() == ((int(z["next_shard"]) + np.arange(9)) % 2).tolist()
    assert _bits(restored[0]["out2"], restored[1]["out2"])
    for z in saved:
        assert _close(z["out"], want)

    # this (single, one-device) process reads the 2-process checkpoint: inspect, export, re-distribute
    info = ck.inspect(ckpt_dir)
    layer = {l["layer"]: l for l in info["layers"]}["mem"]
    sizes = saved[0]["host_sizes"].tolist()
    assert layer["shards"] == sizes and layer["rows"] == sum(sizes) == worker.N + 30
    assert info["format_version"] == ck.manager.FORMAT_VERSION
    assert f"rows per shard: [{sizes[0]}, {sizes[1]}]" in ck.format_inspect(info)
    desc = ck.export(ckpt_dir, tmp_path / "rows.npz")
    z = np.load(tmp_path / "rows.npz")
    assert desc["layers"]["mem"]["shards"] == sizes
    for f in FIELDS:
        want_f = np.concatenate([by_shard[j]["block_" + f][:sizes[j]] for j in range(2)])
        assert _bits(z["mem/" + f], want_f), f
    with ck.Checkpointer(ckpt_dir, create=False) as c:
        sm = c.restore(stores={"mem": Sharded(row_mesh(1))}).stores["mem"]
    assert sm.host_sizes.tolist() == [worker.N + 30]
    assert _close(sm.retrieve(q), want)


# ----------------------------------------------------------------------------- in-process: errors, inspect

def _small(temperature=0.5, n=21, seed=0):
    rs = np.random.RandomState(seed)
    sm = Store.create(_spec(temperature), 6, 2, backend=Sharded(row_mesh(1)), name="mem")
    sm.append(rs.rand(n).astype(np.float32), rs.randn(n, 6).astype(np.float32), rs.randn(n, 2).astype(np.float32))
    sm.advance(3)
    return sm


def test_mismatched_spec_unknown_layer_and_bad_checksum_are_clear_errors(tmp_path):
    sm = _small()
    with ck.Checkpointer(tmp_path / "c") as c:
        c.save(None, 1, stores={"mem": sm})
        other_spec = Store.create(_spec(temperature=1.0), 6, 2, backend=Sharded(row_mesh(1)))
        with pytest.raises(ck.ConfigMismatchError, match=r"memory mem: temperature: checkpoint 0.5, "
                                                         r"current 1.0"):
            c.restore(stores={"mem": other_spec})
        with pytest.raises(ck.ConfigMismatchError, match=r"no stand-alone memory \['other'\] in the checkpoint "
                                                         r"\(it holds \['mem'\]\)"):
            c.restore(stores={"other": Sharded(row_mesh(1))})
        # the matching spec restores, and without stores= the stand-alone memories are left alone
        r = c.restore(stores={"mem": Store.create(_spec(), 6, 2, backend=Sharded(row_mesh(1)))})
        assert _bits(r.stores["mem"].shard_rows(0)["k"], sm.shard_rows(0)["k"]) and r.stores["mem"].size == 21
        assert c.restore().stores == {}
    meta_file = tmp_path / "c" / "1" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["shard_crc32"]["store_mem_k"]["0"] ^= 1
    meta_file.write_text(json.dumps(meta))
    with ck.Checkpointer(tmp_path / "c", create=False) as c:
        with pytest.raises(ck.CorruptCheckpointError, match=r"store_mem_k \(shard at row 0\) does not match"):
            c.restore(stores={"mem": Sharded(row_mesh(1))})
        assert c.restore(stores={"mem": Sharded(row_mesh(1))}, verify=False).stores["mem"].size == 21


def test_sharded_layers_sit_beside_a_trainer_state_in_one_checkpoint(tmp_path):
    import jax

    x = np.random.RandomState(0).randn(16, 8).astype(np.float32)
    model = gm.ResidualGrowingNet(d_out=2, n_blocks=1, readout=gm.GrowingSpec.make(
        "weighted_softmax", eta=1.0, beta=1.0, init="random", init_rows=8))
    t = gm.Trainer(model, loss="cross_entropy", sample_input=x[:8], rng=jax.random.key(0))
    sm = _small(n=13)

    def host(a):
        return np.asarray(jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a)

    def same_state(s1, s2):
        return all(_bits(host(a), host(b)) for a, b in zip(jax.tree_util.tree_leaves(s1),
                                                          jax.tree_util.tree_leaves(s2)))

    with ck.Checkpointer(tmp_path / "c") as c:
        c.save(t, stores={"a/b": sm})
        t2 = gm.Trainer(model, loss="cross_entropy", sample_input=x[:8], rng=jax.random.key(1))
        assert not same_state(t.state, t2.state)  # another seed: other initial rows
        r = c.restore(t2, stores={"a/b": Sharded(row_mesh(1))})
    assert set(r.stores) == {"a/b"} and r.stores["a/b"].host_sizes.tolist() == [13]
    assert _bits(r.stores["a/b"].shard_rows(0)["v"], sm.shard_rows(0)["v"])
    assert same_state(t.state, t2.state)
    info = ck.inspect(tmp_path / "c")
    names = [l["layer"] for l in info["layers"]]
    assert "a/b" in names and "readout" in names
