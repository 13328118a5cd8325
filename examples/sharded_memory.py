"""A memory sharded along its rows over every device of every process.

One machine, 4 forced CPU devices:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/sharded_memory.py

Two processes on localhost (or one per host of a cluster: point --coordinator at
process 0's host; on GPU/TPU hosts each process contributes its local accelerators):

    python examples/sharded_memory.py --coordinator localhost:12345 --num-processes 2 --process-id 0 &
    python examples/sharded_memory.py --coordinator localhost:12345 --num-processes 2 --process-id 1

Every process builds only the rows of its own shards, appends the same candidate
batch, and gets the same merged retrieval result.
"""
import argparse

import jax
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (multi-process runs)")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--rows-per-shard", type=int, default=10_000)
    a = ap.parse_args()
    if a.coordinator:
        # cross-process collectives between CPU devices (gloo); accelerators use NCCL/ICI regardless
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)

    import growmem as gm
    from growmem.backends.sharded import Sharded, row_mesh
    from growmem.store import Store

    mesh = row_mesh()  # every device of every process, one mesh axis "rows"
    n_shards = mesh.devices.size
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0)
    d_in, d_out, n = 64, 8, a.rows_per_shard
    mine = {i: dev for i, dev in enumerate(mesh.devices.flat) if dev.process_index == jax.process_index()}
    # each process materialises only its own shards' rows (here: random rows seeded by shard index)
    rows = {}
    for i in mine:
        rs = np.random.default_rng(i)
        rows[i] = {"w": rs.random(n, dtype=np.float32), "k": rs.standard_normal((n, d_in), dtype=np.float32),
                   "v": rs.standard_normal((n, d_out), dtype=np.float32)}
    mem = Store.from_shard_rows(Sharded(mesh, placement="least_filled"), rows, [n] * n_shards, d_in=d_in,
                                d_out=d_out, spec=spec)
    rs = np.random.default_rng(1234)  # the same queries and candidates in every process
    q = rs.standard_normal((16, d_in), dtype=np.float32)
    mem.append(rs.random(32, dtype=np.float32), rs.standard_normal((32, d_in), dtype=np.float32),
               rs.standard_normal((32, d_out), dtype=np.float32))
    out = np.asarray(mem.retrieve(q).addressable_data(0))
    print(f"process {jax.process_index()}/{jax.process_count()}: {n_shards} shards, rows per shard "
          f"{mem.host_sizes.tolist()}, output {out.shape}, checksum {float(np.abs(out).sum()):.6f}")
    if a.coordinator:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
