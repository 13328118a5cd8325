"""One process of the 2-process ``jax.distributed`` test (tests/test_sharded.py).

    python tests/sharded_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

Each process holds only its own half of the rows (shard = process), retrieves
through the cross-process log-sum-exp merge, appends a batch, retrieves again,
and writes the results plus an unsharded reference computed from all rows.
"""
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402


def main():
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    import growmem as gm
    from growmem import memory as memlib
    from growmem.layers import retrieve
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.store import Store

    assert jax.process_count() == nproc and len(jax.local_devices()) == 1, (jax.process_count(), jax.local_devices())
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=0.5, eta=1.0, beta=1.0, momentum=0.5, chunk=64)
    rs = np.random.RandomState(0)
    n, d, e = 600, 16, 4
    rows = {"w": rs.rand(n).astype(np.float32), "k": rs.randn(n, d).astype(np.float32),
            "v": rs.randn(n, e).astype(np.float32), "born": rs.randint(0, 5, n).astype(np.int32)}
    q = rs.randn(24, d).astype(np.float32)
    cand = {"w": rs.rand(30).astype(np.float32), "k": rs.randn(30, d).astype(np.float32),
            "v": rs.randn(30, e).astype(np.float32)}
    per = n // nproc
    mesh = row_mesh()  # all processes' devices
    shard_of_process = {dev.process_index: i for i, dev in enumerate(mesh.devices.flat)}
    mine = shard_of_process[pid]
    # this process only ever holds its own rows
    local = {mine: {f: a[mine * per:(mine + 1) * per] for f, a in rows.items()}}
    sm = Store.from_shard_rows(Sharded(mesh, placement="least_filled"), local, [per] * nproc, d_in=d, d_out=e,
                               spec=spec, t=5)
    out1 = np.asarray(sm.retrieve(q).addressable_data(0))
    sm.append(cand["w"], cand["k"], cand["v"], born=6)
    sm.advance()
    out2 = np.asarray(sm.retrieve(q).addressable_data(0))
    held = sm.shard_rows(mine)
    # unsharded reference from all rows (computed locally, for the check only)
    ref_mem = memlib.from_rows(rows["w"], rows["k"], rows["v"], rows["born"], spec=spec).replace(t=5)
    ref1 = np.asarray(retrieve(ref_mem, q))
    ref_mem = memlib.append(memlib.with_capacity(ref_mem, int(ref_mem.size) + 30), cand["w"], cand["k"], cand["v"], born=6).replace(t=6)
    ref2 = np.asarray(retrieve(ref_mem, q))
    np.savez(out, out1=out1, out2=out2, ref1=ref1, ref2=ref2, held_rows=len(held["w"]),
             host_sizes=sm.host_sizes, process_count=jax.process_count(), n_devices=len(jax.devices()))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
