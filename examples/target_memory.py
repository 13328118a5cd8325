"""A target memory on a class-incremental stream: nothing learnt is overwritten.

Ten classes of 20-dimensional data (a Gaussian cloud per class) arrive two at a time, as in
Split-MNIST. A Nadaraya–Watson target memory (growmem.nadaraya: each sample stored as a row
whose value is its label, the bandwidth T learned online) is compared with the same memory
fed the shuffled stream: the accuracies match, i.e. the order of the stream — and with it
catastrophic forgetting — does not matter. Then the same stream under a 40 kB budget.

    python examples/target_memory.py
"""
import numpy as np

from growmem import keyspaces, nadaraya

rng = np.random.default_rng(0)
centres = rng.normal(size=(10, 20)) * 1.2
y_train = np.repeat(np.arange(10), 400)
x_train = (centres[y_train] + rng.normal(size=(4000, 20))).astype(np.float32)
y_test = np.repeat(np.arange(10), 100)
x_test = (centres[y_test] + rng.normal(size=(1000, 20))).astype(np.float32)

class_incremental = np.concatenate([rng.permutation(np.flatnonzero(y_train // 2 == t)) for t in range(5)])
shuffled = rng.permutation(4000)


def run(order, budget_bytes=None):
    mem = nadaraya.TargetMemory(keyspaces.Identity(20, normalise=False), 10, temperature=0.1,
                                budget_bytes=budget_bytes)
    for a in range(0, len(order), 32):
        i = order[a:a + 32]
        mem.observe(x_train[i], y_train[i])        # test-then-train: a step on log T, then the rows
    acc = float((mem.predict(x_test).argmax(1) == y_test).mean())
    return acc, mem


for name, order in (("class-incremental", class_incremental), ("shuffled", shuffled)):
    acc, mem = run(order)
    print(f"{name:18s} accuracy {acc:.3f}  rows {mem.rows_in_use()}  T {mem.temperature:.3f}  "
          f"bytes {mem.nbytes()['bytes_in_use']}")
acc, mem = run(class_incremental, budget_bytes=40_000)
b = mem.nbytes()
print(f"{'40 kB budget':18s} accuracy {acc:.3f}  rows {mem.rows_in_use()}  evicted {mem.counts['evicted']}  "
      f"bytes {b['bytes_in_use']} (allocated {b['bytes_allocated']})")
