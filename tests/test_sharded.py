"""Sharded memories: per-shard partials merged by log-sum-exp equal the unsharded memory."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from growmem.backends.sharded import assign_shards

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}

FOUR_DEVICES = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    import growmem as gm
    from growmem import memory as memlib
    from growmem.layers import retrieve
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.store import Store

    assert len(jax.devices()) == 4, jax.devices()
    rs = np.random.RandomState(0)
    n, d, e = 700, 16, 3
    for kernel in ("weighted_softmax", "rbf", "linear"):
        hyper = {"beta": 1.0} if kernel == "weighted_softmax" else {}
        spec = gm.GrowingSpec.make(kernel, temperature=0.5, eta=1.0, momentum=0.5, chunk=64, **hyper)
        mem = memlib.from_rows(rs.rand(n).astype(np.float32), rs.randn(n, d).astype(np.float32),
                               rs.randn(n, e).astype(np.float32), rs.randint(0, 10, n), spec=spec)
        mem = mem.replace(t=jnp.asarray(10, jnp.int32))
        q = rs.randn(32, d).astype(np.float32)
        cand = (rs.rand(300).astype(np.float32), rs.randn(300, d).astype(np.float32),
                rs.randn(300, e).astype(np.float32))
        mask = rs.rand(300) > 0.3
        ref = np.asarray(retrieve(mem, q))
        grown = memlib.append(memlib.with_capacity(mem, int(mem.size) + 300), *cand, born=11, mask=mask).replace(t=11)
        ref2 = np.asarray(retrieve(grown, q))
        scale = np.abs(ref).max() + 1.0
        grid = [(1, "round_robin"), (2, "least_filled"), (4, "round_robin"), (4, "least_filled")]
        if kernel != "weighted_softmax":
            grid = [(4, "least_filled")]
        for n_dev, placement in grid:
            sm = Store.from_memory(mem, Sharded(row_mesh(n_dev), placement=placement))
            assert sm.mem.k.sharding.spec == jax.sharding.PartitionSpec("rows")
            assert len({s.device for s in sm.mem.k.addressable_shards}) == n_dev
            out = np.asarray(sm.retrieve(q))
            assert np.abs(out - ref).max() <= 1e-5 * scale, (kernel, n_dev, placement, np.abs(out - ref).max())
            # appends (with growth of every shard's capacity) keep the equality
            sm.append(*cand, born=11, mask=mask)
            sm.advance()
            assert sm.size == int(grown.size) and int(np.asarray(sm.mem.size).sum()) == sm.size
            assert sm.host_sizes.max() - sm.host_sizes.min() <= 1, sm.host_sizes
            out2 = np.asarray(sm.retrieve(q))
            assert np.abs(out2 - ref2).max() <= 1e-5 * (np.abs(ref2).max() + 1.0), (kernel, n_dev, placement)
            # no row is lost or duplicated
            back = sm.to_memory().rows()
            key = lambda r: np.lexsort(r["k"].T)
            a, b = grown.rows(), back
            assert np.array_equal(a["k"][key(a)], b["k"][key(b)])
            assert np.array_equal(a["born"][key(a)], b["born"][key(b)])
    print("OK")
""")


def test_assign_shards_round_robin_and_least_filled():
    assert assign_shards([0, 0, 0], 7, "round_robin").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert assign_shards([5, 0, 0], 4, "round_robin", start=2).tolist() == [2, 0, 1, 2]
    assert assign_shards([5, 1, 3], 6, "least_filled").tolist() == [1, 1, 1, 2, 1, 2]
    try:
        assign_shards([0], 1, "random")
    except ValueError as e:
        assert "placement" in str(e)
    else:
        raise AssertionError


def test_sharded_retrieval_equals_unsharded_on_four_forced_host_devices():
    res = subprocess.run([sys.executable, "-c", FOUR_DEVICES], env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-4000:]


def test_two_processes_under_jax_distributed_each_holding_half_the_rows(tmp_path, distributed_run):
    distributed_run(HERE / "sharded_worker.py", lambda i, port: (i, 2, port, tmp_path / f"p{i}.npz"))
    for i in range(2):
        z = np.load(tmp_path / f"p{i}.npz")
        assert int(z["process_count"]) == 2 and int(z["n_devices"]) == 2
        assert int(z["held_rows"]) == 315 and z["host_sizes"].tolist() == [315, 315]
        for a, r in (("out1", "ref1"), ("out2", "ref2")):
            assert np.abs(z[a] - z[r]).max() <= 1e-5 * (np.abs(z[r]).max() + 1.0)
    z0, z1 = np.load(tmp_path / "p0.npz"), np.load(tmp_path / "p1.npz")
    assert np.array_equal(z0["out2"], z1["out2"])  # both processes see the same merged result


def test_a_sharded_backend_takes_a_tier_or_nothing_inside():
    """``inner`` is where each shard keeps its rows: None (in RAM) or a Tiered; anything else is refused by
    name, before any row is placed."""
    import pytest

    from growmem.backends import RAM
    from growmem.backends.sharded import InRAM, Sharded
    from growmem.errors import WrongTypeError

    assert Sharded().inner == InRAM() and Sharded() == Sharded(inner=InRAM())
    with pytest.raises(WrongTypeError, match="not RAM: it lacks"):
        Sharded(inner=RAM())
