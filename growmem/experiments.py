"""Training loops shared by the CLI and the benchmarks (teacher-student regression).

Each ``run_*`` trains one model on fresh teacher samples for ``steps`` steps of
``batch`` samples and returns its test-loss curve ``[(samples_seen, test_mse)]``.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import jax
import optax

from .data.teacher_student import TeacherStudent
from .layers import GrowingSpec, ParametricSoftmax, ResidualGrowingNet, TeacherMLP
from .train import Trainer, fit, squared_error


def _loop(trainer: Trainer, task: TeacherStudent, *, steps: int, batch: int, eval_every: int,
          test, progress: Optional[Callable[[int], None]] = None, stream_seed: int = 1) -> Dict:
    """Train on fresh teacher samples with :func:`growmem.train.fit`; the test-MSE curve."""
    xt, yt = test
    train_loss = []

    def evaluate(step):
        mse = float(squared_error(trainer.predict(xt), yt))
        return {"mse": mse if math.isfinite(mse) else float("inf")}

    def on_step(step, m):
        if step % eval_every == 0 or step == steps:
            train_loss.append([step * batch, float(m["loss"])])
        if progress:
            progress(1)

    first = evaluate(0)["mse"]
    out = fit(trainer, lambda step: task.batch(step, batch, stream_seed), steps=steps, on_step=on_step,
              evaluate=evaluate, eval_every=eval_every)   # a diverged run stops: it cannot recover
    curve = [[0, first]] + [[e["step"] * batch, e["mse"]] for e in out["evals"]]
    return {"curve": curve, "train_loss": train_loss, "final_test_loss": curve[-1][1],
            "seconds": out["seconds"], "rows": trainer.rows_in_use()}


def growing_ws_spec(*, temperature, eta, beta, momentum=0.0, batch=64, clip=None) -> GrowingSpec:
    """The paper's growing weighted softmax (Alg. 3, D0 of F.3 with B random rows)."""
    extra = {"clip": clip} if clip is not None else {}
    return GrowingSpec.make("weighted_softmax", temperature=temperature, eta=eta, beta=beta,
                            momentum=momentum, init="random", init_rows=batch, **extra)


def run_growing_ws(task: TeacherStudent, *, steps, batch, temperature, eta, beta, momentum=0.0,
                   eval_every=100, test=None, progress=None, seed=0) -> Dict:
    """Single growing weighted-softmax layer on RMSNorm(x) (Table 2)."""
    spec = growing_ws_spec(temperature=temperature, eta=eta, beta=beta, momentum=momentum, batch=batch)
    model = ResidualGrowingNet(d_out=task.d_out, n_blocks=0, readout=spec)
    test = test or task.test_set()
    trainer = Trainer(model, loss="squared_error", sample_input=test[0][:batch], rng=jax.random.key(seed))
    return _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress)


def run_parametric_softmax(task: TeacherStudent, *, steps, batch, width, temperature, lr, b1=0.85,
                           eval_every=100, test=None, progress=None, seed=0) -> Dict:
    """Fixed-size softmax keys/values trained by Adam (F.5, Table 6)."""
    model = ParametricSoftmax(width=width, d_out=task.d_out, temperature=temperature)
    test = test or task.test_set()
    trainer = Trainer(model, loss="squared_error", tx=optax.adam(lr, b1=b1), sample_input=test[0][:batch],
                      rng=jax.random.key(seed))
    return _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress)


def run_reference_mlp(task: TeacherStudent, *, steps, batch, width, lr, momentum=0.0,
                      eval_every=100, test=None, progress=None, seed=0) -> Dict:
    """Over-parameterised student with the teacher's architecture, trained by SGD (Table 13)."""
    model = TeacherMLP(width=width, n_layers=task.n_layers, d_out=task.d_out, use_bias=True)
    test = test or task.test_set()
    tx = optax.sgd(lr, momentum=momentum or None)
    trainer = Trainer(model, loss="squared_error", tx=tx, sample_input=test[0][:batch], rng=jax.random.key(seed))
    return _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress)
