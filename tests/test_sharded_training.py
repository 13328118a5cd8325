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
    from growmem.storage.checkpoint import Checkpointer

    assert len(jax.devices()) == 4
    B, D, STEPS = 32, 8, 40
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(1500, D))     # repeated patterns: novelty refuses some candidates
    x = (protos[rng.integers(0, 1500, STEPS * B)] + 0.05 * rng.normal(size=(STEPS * B, D))).astype(np.float32)
    y = np.sin(x[:, :2]).astype(np.float32)
    for kernel in ("weighted_softmax", "rbf"):
        pol = policies.chain(policies.novelty(0.3), policies.weight_decay(0.01), policies.momentum(0.5))
        if kernel == "weighted_softmax":
            spec = GrowingSpec.make(kernel, eta=1.0, beta=0.5, init="random", init_rows=B, policy=pol, chunk=128)
        else:
            spec = GrowingSpec.make(kernel, eta=0.1, policy=pol, chunk=128)
        model = ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)
        ref = Trainer(model, loss="squared_error", sample_input=x[:1])
        tr = Trainer(model, loss="squared_error", sample_input=x[:1])
        tr.enable_sharding()
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
            r, g = ref.memories()[path].rows(), m.rows()
            np.testing.assert_array_equal(g["born"], r["born"])
            for f in ("w", "k", "v"):
                np.testing.assert_allclose(g[f], r[f], rtol=1e-3, atol=1e-5, err_msg=f"{kernel} {path} {f}")
        xt = x[:64] + 0.01
        pr, ps = np.asarray(ref.predict(xt)), np.asarray(tr.predict(xt))
        assert np.abs(pr).max() > 1e-2
        np.testing.assert_allclose(ps, pr, rtol=1e-4, atol=1e-5)
        # a checkpoint of the sharded trainer restores into a sharded trainer, sharded again
        ck = Checkpointer(os.path.join(sys.argv[1], kernel))
        ck.save(tr)
        fresh = Trainer(model, loss="squared_error", sample_input=x[:1])
        fresh.enable_sharding()
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


def test_enable_sharding_refuses_a_spilling_trainer(tmp_path):
    import numpy as np
    import pytest
    from growmem import GrowingSpec, ResidualGrowingNet, Trainer

    x = np.zeros((1, 8), np.float32)
    tr = Trainer(ResidualGrowingNet(d_out=2, readout=GrowingSpec.make("rbf", eta=0.1)), loss="squared_error",
                 sample_input=x)
    tr.enable_spill(tmp_path / "cold", ram_budget_bytes=64 << 20)
    with pytest.raises(ValueError, match="spill"):
        tr.enable_sharding()
