"""One process of the 2-process trainer test (tests/test_sharded_training.py).

    python tests/trainer_worker.py PROCESS_ID NUM_PROCESSES PORT CKPT_DIR OUT.npz

Every process runs the same ``Trainer`` with its memories sharded over the devices of all
processes (one each): it holds, trains and checkpoints only its own shard. The run trains half
its steps, saves a checkpoint (every process writes its own shards), restores it into a fresh
trainer and trains on; each process writes the rows of its shard and the predictions.
"""
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402

B, D, STEPS = 16, 8, 24


def data():
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(600, D))     # repeated patterns: novelty refuses some candidates
    x = (protos[rng.integers(0, 600, STEPS * B)] + 0.05 * rng.normal(size=(STEPS * B, D))).astype(np.float32)
    return x, np.sin(x[:, :2]).astype(np.float32), x[:64] + 0.01


def model_and_policy():
    from growmem import GrowingSpec, ResidualGrowingNet, policies

    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=0.5, init="random", init_rows=B, chunk=128)
    model = ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)
    return model, lambda: policies.chain(policies.novelty(0.3), policies.weight_decay(0.01), policies.momentum(0.5))


def main():
    pid, nproc, port, ckpt_dir, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    from growmem import Trainer
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.checkpoint import Checkpointer

    assert jax.process_count() == nproc and len(jax.local_devices()) == 1
    x, y, xt = data()
    model, pol = model_and_policy()
    mesh = row_mesh()   # every process's devices
    tr = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded(mesh))
    half = STEPS // 2
    for i in range(half):
        tr.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
    with Checkpointer(ckpt_dir) as c:
        c.save(tr)
        fresh = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol(), backend=Sharded(mesh))
        assert c.restore(fresh).step == half
    for i in range(half, STEPS):
        fresh.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
    res = {"pred": np.asarray(fresh.predict(xt)), "process_count": jax.process_count()}
    mine = [j for j, dev in enumerate(mesh.devices.flat) if dev.process_index == pid]
    for path, m in fresh.memories().items():
        be = fresh.backends[path]
        assert not m.k.is_fully_addressable
        name = "/".join(path)
        for f in ("w", "k", "v", "born"):
            res[f"{name}/{f}"] = np.concatenate([be.shard_rows(m, j)[f] for j in mine])
        res[f"{name}/rows"] = fresh.rows_in_use()[name]
    np.savez(out, **res)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
