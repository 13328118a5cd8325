"""A Trainer whose memories are sharded along rows over 4 forced host devices trains like the
unsharded Trainer (the reference), with each device holding a quarter of every memory."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from growmem import GrowingSpec, ResidualGrowingNet, Trainer, policies
    from growmem.backends.sharded import Sharded
    from growmem.checkpoint import Checkpointer

    assert len(jax.devices()) == 4
    B, D, STEPS = 32, 8, 40
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(1500, D))     # repeated patterns: novelty refuses some candidates
    x = (protos[rng.integers(0, 1500, STEPS * B)] + 0.05 * rng.normal(size=(STEPS * B, D))).astype(np.float32)
    y = np.sin(x[:, :2]).astype(np.float32)
    for kernel in ("weighted_softmax", "rbf"):
        pol = lambda: policies.chain(policies.novelty(0.3), policies.weight_decay(0.01), policies.momentum(0.5))
        if kernel == "weighted_softmax":
            spec = GrowingSpec.make(kernel, eta=1.0, beta=0.5, init="random", init_rows=B, chunk=128)
        else:
            spec = GrowingSpec.make(kernel, eta=0.1, chunk=128)
        model = ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)
        ref = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol())
        tr = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded())
        for i in range(STEPS):
            ref.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
            tr.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
        rows = ref.rows_in_use()
        assert tr.rows_in_use() == rows, (tr.rows_in_use(), rows)
        assert all(n < B + STEPS * B for n in rows.values()), rows           # novelty refused candidates
        for path, m in tr.memories().items():
            assert m.capacity > 256                                          # grew, and stayed sharded
            for f in ("w", "k", "v", "born"):
                a = getattr(m, f)
                assert a.sharding.spec == P("rows"), (f, a.sharding)
                assert {s.data.shape[0] for s in a.addressable_shards} == {m.capacity // 4}
            # the same rows, placed round robin over the shards: compared in a common order
            r, g = ref.memories()[path].rows(), m.rows()
            order = lambda rows: np.lexsort((rows["k"][:, 0], rows["born"]))
            r, g = ({f: a[order(x)] for f, a in x.items()} for x in (r, g))
            np.testing.assert_array_equal(g["born"], r["born"])
            for f in ("w", "k", "v"):
                np.testing.assert_allclose(g[f], r[f], rtol=1e-3, atol=1e-5, err_msg=f"{kernel} {path} {f}")
            sizes = np.asarray(m.size)
            assert sizes.max() - sizes.min() <= B, sizes                       # every shard holds its share
        xt = x[:64] + 0.01
        pr, ps = np.asarray(ref.predict(xt)), np.asarray(tr.predict(xt))
        assert np.abs(pr).max() > 1e-2
        np.testing.assert_allclose(ps, pr, rtol=1e-4, atol=1e-5)
        # a checkpoint of the sharded trainer restores into a sharded trainer, sharded again
        ck = Checkpointer(os.path.join(sys.argv[1], kernel))
        ck.save(tr)
        fresh = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded())
        ck.restore(fresh)
        assert all(m.k.sharding.spec == P("rows") for m in fresh.memories().values())
        np.testing.assert_array_equal(np.asarray(fresh.predict(xt)), ps)
        print(kernel, "ok", rows)
""")


def test_trainer_with_sharded_memories_matches_the_unsharded_trainer(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=600, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "weighted_softmax ok" in r.stdout and "rbf ok" in r.stdout


SPILLING = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    from growmem import GrowingSpec, ResidualGrowingNet, Trainer, policies
    from growmem.backends.sharded import Sharded
    from growmem.backends.tiered import Tiered, row_bytes
    from growmem.checkpoint import Checkpointer
    from growmem.errors import CheckpointError

    assert len(jax.devices()) == 4
    B, D, STEPS, CHUNK = 32, 8, 60, 128
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(3000, D))
    x = (protos[rng.integers(0, 3000, STEPS * B)] + 0.05 * rng.normal(size=(STEPS * B, D))).astype(np.float32)
    y = np.sin(x[:, :2]).astype(np.float32)
    pol = lambda: policies.chain(policies.novelty(0.3), policies.weight_decay(0.01), policies.momentum(0.5))
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=0.5, init="random", init_rows=B, chunk=128)
    model = ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)
    ref = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol())
    # per shard: at most 256 hot rows of each layer; the rest spills to that shard's own tier
    tier = Tiered(os.path.join(sys.argv[1], "cold"), ram_budget_bytes=256 * (row_bytes(D, D) + row_bytes(D, 2)),
                  chunk_rows=CHUNK)
    tr = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded(inner=tier))
    for i in range(STEPS):
        ref.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
        tr.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
    assert tr.rows_in_use() == ref.rows_in_use(), (tr.rows_in_use(), ref.rows_in_use())
    cold = tr.cold_rows()
    assert all(n >= CHUNK for n in cold.values()), cold                      # shards spilled
    for path, m in tr.memories().items():
        sizes = np.asarray(m.size)
        assert sizes.max() <= 256, sizes                                     # each shard within its budget
        assert len(os.listdir(os.path.join(sys.argv[1], "cold", "/".join(path)))) == 4   # a tier per shard
    # a model preallocated past the budget (1,024 rows a shard) is cut back to it and spills the same rows
    # (the budget used to be checked only once a shard's block was full: nothing spilled)
    big = Trainer(ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=4096),
                  loss="squared_error", sample_input=x[:1], policy=pol(),
                  backend=Sharded(inner=Tiered(os.path.join(sys.argv[1], "cold_big"),
                                                ram_budget_bytes=tier.ram_budget_bytes, chunk_rows=CHUNK)))
    for i in range(STEPS):
        big.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
    for m in big.memories().values():
        assert m.capacity // 4 <= 256 and np.asarray(m.size).max() <= 256, (m.capacity, np.asarray(m.size))
    assert big.cold_rows() == cold and big.rows_in_use() == tr.rows_in_use(), (big.cold_rows(), cold)
    order = lambda rows: np.lexsort((rows["k"][:, 0], rows["born"]))
    for name, r in ref.host_rows().items():
        g = tr.host_rows()[name]
        r, g = ({f: a[order(z)] for f, a in z.items()} for z in (r, g))
        np.testing.assert_array_equal(g["born"], r["born"])
        for f in ("w", "k", "v"):
            np.testing.assert_allclose(g[f], r[f], rtol=1e-3, atol=1e-5, err_msg=f"{name} {f}")
    xt = x[:64] + 0.01
    pr, ps = np.asarray(ref.predict(xt)), np.asarray(tr.predict(xt))
    assert np.abs(pr).max() > 1e-2
    np.testing.assert_allclose(ps, pr, rtol=2e-4, atol=1e-5)
    # a checkpoint refers to every shard's tier; a fresh sharded + spilling trainer resumes from it
    with Checkpointer(os.path.join(sys.argv[1], "ckpt")) as c:
        c.save(tr)
        again = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(),
                        backend=Sharded(inner=Tiered(os.path.join(sys.argv[1], "cold"), resume=True,
                                                      ram_budget_bytes=tier.ram_budget_bytes, chunk_rows=CHUNK)))
        c.restore(again)
        # into a sharded backend that keeps every row in RAM, the rows on the tiers would be lost: refused
        lost = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded())
        try:
            c.restore(lost)
            raise AssertionError("a checkpoint with disk tiers restored into an all-in-RAM Sharded backend")
        except CheckpointError as e:
            assert "inner=Tiered" in str(e), e
    np.testing.assert_array_equal(np.asarray(again.predict(xt)), ps)
    assert again.cold_rows() == cold
    print("spilling shards ok", tr.rows_in_use(), cold)
""")


def test_sharded_and_spilling_trainer_matches_the_all_in_ram_trainer(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-c", SPILLING, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=900, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "spilling shards ok" in r.stdout


def test_two_process_trainer_matches_the_single_process_trainer(tmp_path, distributed_run):
    """The same Trainer run by 2 jax.distributed processes (each holding one shard, checkpointing
    and restoring its own shard mid-run) ends with the rows and predictions of one process."""
    import numpy as np

    sys.path.insert(0, str(HERE))
    import trainer_worker as worker
    from growmem import Trainer

    distributed_run(HERE / "trainer_worker.py", lambda i, port: (i, 2, port, tmp_path / "ckpt", tmp_path / f"p{i}.npz"))
    x, y, xt = worker.data()
    model, pol = worker.model_and_policy()
    ref = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol())
    for i in range(worker.STEPS):
        ref.step(x[i * worker.B:(i + 1) * worker.B], y[i * worker.B:(i + 1) * worker.B])
    z = [np.load(tmp_path / f"p{i}.npz") for i in range(2)]
    assert all(int(p["process_count"]) == 2 for p in z)
    np.testing.assert_array_equal(z[0]["pred"], z[1]["pred"])       # every process sees the same outputs
    np.testing.assert_allclose(z[0]["pred"], np.asarray(ref.predict(xt)), rtol=2e-4, atol=1e-5)
    order = lambda rows: np.lexsort((rows["k"][:, 0], rows["born"]))
    for name, r in ref.host_rows().items():
        assert int(z[0][f"{name}/rows"]) == len(r["w"])
        got = {f: np.concatenate([p[f"{name}/{f}"] for p in z]) for f in ("w", "k", "v", "born")}
        assert all(len(p[f"{name}/w"]) > 0 for p in z)                 # both processes hold rows
        r, got = ({f: a[order(q)] for f, a in q.items()} for q in (r, got))
        np.testing.assert_array_equal(got["born"], r["born"])
        for f in ("w", "k", "v"):
            np.testing.assert_allclose(got[f], r[f], rtol=1e-3, atol=1e-5, err_msg=f"{name} {f}")


def test_growmem_train_on_two_processes_matches_one_process(tmp_path, distributed_run):
    """`growmem train --coordinator ...` started twice (one process per host) trains the model of
    a single-process `growmem train`, checkpointing every process's shards."""
    import json

    from growmem.app import cli

    small = ["--steps", "6", "--batch-size", "16", "--test-size", "64", "--eval-every", "3", "--blocks", "1"]
    assert cli.main(["train", *small, "--out", str(tmp_path / "one")]) == 0
    distributed_run(HERE / "cli_worker.py", lambda i, port: (
        "train", *small, "--out", str(tmp_path / "two"), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--coordinator", f"localhost:{port}", "--num-processes", 2, "--process-id", i))
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["rows"] == one["rows"]
    for (s1, l1), (s2, l2) in zip(one["test_curve"], two["test_curve"]):
        assert s1 == s2 and abs(l1 - l2) <= 1e-4 * abs(l1) + 1e-7, (one["test_curve"], two["test_curve"])
    from growmem.checkpoint import inspect

    info = {l["layer"]: l for l in inspect(tmp_path / "ckpt")["layers"]}
    assert info["readout"]["backend"] == "sharded" and len(info["readout"]["shards"]) == 2
