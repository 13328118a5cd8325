"""One process of the 2-process ``jax.distributed`` checkpoint test (tests/test_sharded_checkpoint.py).

    python tests/sharded_ckpt_worker.py save|restore PROCESS_ID NUM_PROCESSES PORT CKPT_DIR OUT.npz

``save``: each process builds only its own shard's rows, appends a batch (same in
every process), and saves the memory with :class:`Checkpointer` (every process
calls ``save``). ``restore``: fresh processes restore onto the mesh of all
processes' devices, retrieve, append another batch and retrieve again; they also
check that a mesh with another shard count and ``export`` are refused clearly.
Both write what their own shard holds (whole blocks) and the retrieval outputs;
the test compares them with each other and with a float64 numpy reference.
"""
import os
import sys

import numpy as np

N, D, E, STEP = 600, 16, 4, 7


def make_data():
    """Every row, the queries and the two candidate batches (the same in every process)."""
    rs = np.random.RandomState(0)
    rows = {"w": rs.rand(N).astype(np.float32), "k": rs.randn(N, D).astype(np.float32),
            "v": rs.randn(N, E).astype(np.float32), "born": rs.randint(0, 5, N).astype(np.int32)}
    q = rs.randn(24, D).astype(np.float32)
    cand1 = {"w": rs.rand(30).astype(np.float32), "k": rs.randn(30, D).astype(np.float32),
             "v": rs.randn(30, E).astype(np.float32)}
    cand2 = {"w": rs.rand(9).astype(np.float32), "k": rs.randn(9, D).astype(np.float32),
             "v": rs.randn(9, E).astype(np.float32)}
    return rows, q, cand1, cand2


def make_spec():
    import growmem as gm

    return gm.GrowingSpec.make("weighted_softmax", temperature=0.5, eta=1.0, beta=1.0, momentum=0.5, chunk=64)


def main():
    mode, pid, nproc, port, ckpt_dir, out = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                             sys.argv[5], sys.argv[6])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    from jax.sharding import Mesh

    from growmem import checkpoint as ck
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.memory import FIELDS
    from growmem.store import Store

    assert jax.process_count() == nproc and len(jax.local_devices()) == 1
    spec = make_spec()
    rows, q, cand1, cand2 = make_data()
    mesh = row_mesh()  # all processes' devices
    mine = [i for i, dev in enumerate(mesh.devices.flat) if dev.process_index == pid]
    assert len(mine) == 1, mine
    mine = mine[0]
    per = N // nproc
    res = {"shard": mine}
    c = ck.Checkpointer(ckpt_dir)
    if mode == "save":
        local = {mine: {f: a[mine * per:(mine + 1) * per] for f, a in rows.items()}}
        sm = Store.from_shard_rows(Sharded(mesh, placement="round_robin"), local, [per] * nproc, d_in=D, d_out=E,
                                   spec=spec, t=5, name="mem")
        assert not sm.mem.k.is_fully_addressable  # no process could gather the rows even if it tried
        res["assigned1"] = sm.append(cand1["w"], cand1["k"], cand1["v"], born=6)
        sm.advance(2)
        c.save(None, STEP, stores={"mem": sm})
    else:
        # a mesh with another shard count cannot be filled across processes: a clear error, before any I/O
        try:
            c.restore(stores={"mem": Sharded(Mesh(np.array(jax.devices()[:1]), ("rows",)))})
        except ck.ConfigMismatchError as e:
            res["mismatch_error"] = str(e)
        try:
            ck.export(ckpt_dir, os.path.join(os.path.dirname(out), f"never{pid}.npz"))
        except ck.CheckpointError as e:
            res["export_error"] = str(e)
        template = Store.create(spec, D, E, backend=Sharded(mesh), name="mem")
        sm = c.restore(stores={"mem": template}).stores["mem"]
        assert sm.mem.k.sharding.mesh == mesh and not sm.mem.k.is_fully_addressable
    res.update(host_sizes=sm.host_sizes, next_shard=sm.next_shard, t=int(sm.t), capacity=sm.capacity_per_shard,
               out=np.asarray(sm.retrieve(q).addressable_data(0)))
    for f in FIELDS:
        blocks = sm.local_blocks(f)
        assert list(blocks) == [mine]
        res[f"block_{f}"] = blocks[mine]
    if mode == "restore":
        res["assigned2"] = sm.append(cand2["w"], cand2["k"], cand2["v"], born=8)
        sm.advance()
        res["out2"] = np.asarray(sm.retrieve(q).addressable_data(0))
        res["host_sizes2"] = sm.host_sizes
        res["next_shard2"] = sm.next_shard
        for f in FIELDS:
            res[f"block2_{f}"] = sm.local_blocks(f)[mine]
    c.close()
    np.savez(out, process_count=jax.process_count(), **{k: np.asarray(v) for k, v in res.items()})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
