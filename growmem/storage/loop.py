"""A resumable training loop: deterministic data order + periodic Orbax checkpoints.

The data order is a function of ``(rng, epoch)`` only, and the position in it
(``{"epoch", "batch"}``) is saved with every checkpoint together with the RNG
key and the full trainer state. Resuming from any checkpoint therefore replays
exactly the batches the interrupted run would have seen, and — on the same
machine and software — reaches a bitwise-identical memory.

>>> ckpt = Checkpointer("run/ckpt", keep=3)
>>> fit(trainer, x, y, batch_size=32, steps=1000, rng=jax.random.key(0),
...     checkpointer=ckpt, every=100, resume=True)
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import numpy as np

from .checkpoint import Checkpointer


def epoch_order(rng, epoch: int, n: int) -> np.ndarray:
    """The permutation of ``n`` examples used in ``epoch`` (a pure function of ``rng``)."""
    return np.asarray(jax.random.permutation(jax.random.fold_in(rng, epoch), n))


def fit(trainer, x, y, *, batch_size: int, steps: int, rng=None, checkpointer: Optional[Checkpointer] = None,
        every: int = 0, resume: bool = False, config: Any = None, policy: Any = None,
        on_step: Optional[Callable[[int, dict], None]] = None, progress: bool = False,
        drop_last: bool = True) -> dict:
    """Train until ``trainer.state.step == steps``; returns ``{"step", "resumed_from", "loss"}``.

    ``every``: save a checkpoint every this many steps (and at the end) when a
    ``checkpointer`` is given. ``resume``: first restore the latest checkpoint if one
    exists (``config`` is checked against the saved one). ``on_step(step, metrics)`` is
    called after each step.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    n = len(x)
    if batch_size <= 0 or batch_size > n:
        raise ValueError(f"batch_size must be in [1, {n}], got {batch_size}")
    rng = jax.random.key(0) if rng is None else rng
    pos = {"epoch": 0, "batch": 0}
    resumed_from = None
    if resume and checkpointer is not None and checkpointer.latest_step() is not None:
        r = checkpointer.restore(trainer, config=config)
        resumed_from = r.step
        rng = r.rng if r.rng is not None else rng
        pos = dict(r.data_position or pos)
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    step = int(trainer.state.step)
    order = epoch_order(rng, pos["epoch"], n)
    loss = None
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=step, desc="train", unit="step")
    while step < steps:
        if pos["batch"] >= per_epoch:
            pos = {"epoch": pos["epoch"] + 1, "batch": 0}
            order = epoch_order(rng, pos["epoch"], n)
        idx = order[pos["batch"] * batch_size:(pos["batch"] + 1) * batch_size]
        metrics = trainer.step(x[idx], y[idx])
        pos = {"epoch": pos["epoch"], "batch": pos["batch"] + 1}
        step += 1
        if on_step is not None or bar is not None:
            loss = float(metrics["loss"])
            if on_step is not None:
                on_step(step, {"loss": loss})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
        if checkpointer is not None and every and (step % every == 0 or step == steps):
            checkpointer.save(trainer, step, rng=rng, data_position=pos, config=config, policy=policy)
    if bar is not None:
        bar.close()
    return {"step": step, "resumed_from": resumed_from, "loss": loss}
