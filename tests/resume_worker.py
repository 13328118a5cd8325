"""Subprocess used by tests/test_checkpoint.py: a small run that checkpoints as it trains.

    python tests/resume_worker.py OUT.npz STEPS [--ckpt DIR --every K] [--resume] [--sleep S]

Prints ``step N`` (flushed) after every step; writes the final rows of every memory
and the predictions on a fixed test set to OUT.npz.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import growmem as gm  # noqa: E402
from growmem.checkpoint import Checkpointer  # noqa: E402
from growmem.train import Batches, fit  # noqa: E402


class Net(nn.Module):
    """A parametric front end (trained by Adam) feeding growing layers."""

    spec: gm.GrowingSpec

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(16)(x))
        return gm.ResidualGrowingNet(d_out=3, n_blocks=1, readout=self.spec, capacity=256)(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("steps", type=int)
    ap.add_argument("--ckpt")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    rs = np.random.RandomState(0)
    x = rs.randn(96, 12).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 0.5).astype(np.int32)
    xt = rs.randn(40, 12).astype(np.float32)
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0, init="random", init_rows=8)
    # a parametric front end trained by Adam, so params and optimizer state matter for the resume too
    model = Net(spec)
    trainer = gm.Trainer(model, loss="cross_entropy", tx=optax.adam(1e-2), sample_input=x[:16],
                         rng=jax.random.key(1))
    ckpt = Checkpointer(a.ckpt, keep=2) if a.ckpt else None
    config = {"model": "ResidualGrowingNet", "n_blocks": 1, "d_out": 3, "T": 1.0}

    def on_step(step, m):
        print(f"step {step}", flush=True)
        if a.sleep:
            time.sleep(a.sleep)

    batches = Batches(x, y, 16, rng=jax.random.key(7))
    start = 0
    if a.resume and ckpt is not None and ckpt.latest_step() is not None:
        start = ckpt.restore(trainer, config=config).step
    save = lambda step: ckpt.save(trainer, step, data_position=batches.position(step), config=config)
    fit(trainer, batches, steps=a.steps, start=start, checkpoint=save if ckpt else None, every=a.every,
        on_step=on_step)
    out = {"pred": np.asarray(trainer.predict(xt)), "step": np.asarray(int(trainer.state.step)),
           "resumed_from": np.asarray(start if a.resume else -1)}
    for path, mem in trainer.memories().items():
        for f in ("w", "k", "v", "born"):
            out["/".join(path) + "/" + f] = np.asarray(getattr(mem, f))
        out["/".join(path) + "/size"] = np.asarray(mem.size)
    np.savez(a.out, **out)
    if ckpt:
        ckpt.close()
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
