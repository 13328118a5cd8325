"""The training runs the reproductions are made of.

* :func:`run_growing` — a growing network (a preset's :class:`~growmem.train.Trainer`) trained
  with :func:`growmem.train.fit`, the one training loop (a NaN loss stops it with the step and
  the last finite loss);
* :func:`run_parametric` — a parametric Flax model (the residual MLP of Eq. 12, the parametric
  softmax of F.5, a ViT) trained with any optimizer of :func:`growmem.optim.make` (Mesa and Delta
  get each Dense layer's inputs through :func:`growmem.optim.dense_inputs`);
* :func:`mlp_optimizer` — the optimizers of Tables 9, 10, 12 by name.

Both run in :func:`growmem.train.fit` (a parametric model through :class:`_Parametric`, its ``step``)
and report the same things: the test-accuracy curve against samples seen, the mean training loss of
every epoch, the final test accuracy (and the training accuracy of every epoch when asked: Fig. 4),
and the wall time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import optim
from ..train import NonFiniteLossError, Trainer, cross_entropy
from .core import UNIT_EVERY_S, Context, Images, UnitCheckpoint, accuracy, batches_for


def preset_trainer(cfg: dict, data: Images, name: str):
    """``(preset, trainer)``: the shipped growing preset ``name`` for ``data`` (its first batch
    initialises the model), with ``cfg["growing_n_blocks"]`` blocks when set."""
    import dataclasses

    from .. import config
    pre = config.load(name)
    if cfg.get("growing_n_blocks") is not None:
        pre = dataclasses.replace(pre, n_blocks=int(cfg["growing_n_blocks"]))
    return pre, pre.trainer(data.x[:cfg["batch"]], data.classes, rng=jax.random.key(cfg["seed"]))


#: a unit's checkpoint is considered every this many steps (and written once ``unit_every_s`` passed)
UNIT_STEPS = 100


def _curve_every(steps: int, points: int) -> int:
    return max(1, steps // max(points, 1))


def _fit_report(ctx: Context, learner, data: Images, *, batch: int, epochs: int, seed: int, curve_points: int,
                curve_test: int, train_accuracy: bool, train_eval: int, label: str, augment: bool,
                eval_epochs=None, after_step: Optional[Callable[[int], None]] = None,
                unit: Optional[Path] = None, unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Train ``learner`` (anything :func:`growmem.train.fit` steps: ``step(x, y)``, ``predict(x)``) for
    ``epochs`` passes over ``data`` and report what every reproduction reports: the final test accuracy,
    the test-accuracy curve against samples, the training accuracy of every epoch (``train_accuracy``),
    the mean training loss of every epoch, the steps, samples and wall time. ``eval_epochs``: evaluate
    only after these epochs (1-based). A non-finite evaluation raises
    :class:`~growmem.train.NonFiniteLossError` (the state cannot recover). ``unit``: a folder where a
    :class:`~growmem.Trainer` checkpoints itself about every ``unit_every_s`` seconds and from which a rerun
    goes on (:class:`growmem.repro.core.UnitCheckpoint`; the batches are a function of the step)."""
    batches = batches_for(data, batch, seed=seed, augment=augment)
    per_epoch = batches.per_epoch
    steps = epochs * per_epoch
    every = per_epoch if train_accuracy or eval_epochs is not None else _curve_every(steps, curve_points)
    xt, yt = data.xt[:curve_test], data.yt[:curve_test]
    run = UnitCheckpoint(unit, learner, every=min(every, UNIT_STEPS), min_seconds=unit_every_s,
                         key={"steps": steps, "batch": batch, "seed": seed, "augment": augment})
    rec = run.carry                    # the training losses so far (host floats), checkpointed with the learner
    if run.resumed:
        ctx.update(run.start)
    else:
        rec["losses"] = []
    losses = []                        # device scalars since the last checkpoint: no sync per step

    def flush():
        rec["losses"] += [float(v) for v in jax.device_get(losses)]
        losses.clear()

    def on_step(step, metrics):
        losses.append(metrics["loss"])
        ctx.update(1)
        if after_step is not None:
            after_step(step)

    def evaluate(step):
        if eval_epochs is not None and not (step % per_epoch == 0 and step // per_epoch in eval_epochs):
            return {}
        ev = {"test_accuracy": accuracy(learner.predict, xt, yt)}
        if train_accuracy:
            ev["train_accuracy"] = accuracy(learner.predict, data.x[:train_eval], data.y[:train_eval])
        ctx.status(f"{label} {step}/{steps} acc {ev['test_accuracy']:.3f}")
        return ev

    out = run.fit(batches, steps=steps, on_step=on_step, evaluate=evaluate, eval_every=every, before_save=flush)
    if out["stopped"]:
        raise NonFiniteLossError(f"{label}: {out['stopped']}")
    flush()
    evals = [e for e in out["evals"] if "test_accuracy" in e]
    loss = np.asarray(rec["losses"], np.float64)
    return {"accuracy": accuracy(learner.predict, data.xt, data.yt), "seconds": out["seconds"], "steps": steps,
            "samples": steps * batch, "curve": [[e["step"] * batch, e["test_accuracy"]] for e in evals],
            "train_curve": ([[e["step"] // per_epoch, e["train_accuracy"]] for e in evals]
                            if train_accuracy else None),
            "epoch_train_loss": [float(loss[i * per_epoch:(i + 1) * per_epoch].mean()) for i in range(epochs)]}


def run_growing(ctx: Context, trainer: Trainer, data: Images, *, batch: int, epochs: int = 1, seed: int = 0,
                curve_points: int = 12, curve_test: int = 2000, train_accuracy: bool = False,
                train_eval: int = 2000, label: str = "", after_step: Optional[Callable[[int], None]] = None,
                augment: bool = False, unit: Optional[Path] = None, unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Train ``trainer`` for ``epochs`` passes over ``data`` (batches of ``batch``, reshuffled
    every epoch). ``curve_points`` test accuracies on the first ``curve_test`` test images along
    the way; the final one on the whole test set. ``train_accuracy``: also the accuracy on the
    first ``train_eval`` training images at the end of every epoch. ``augment``: CIFAR epochs
    augmented as in App. F.1.1. ``unit``: the folder where the run checkpoints itself (e.g.
    ``ctx.unit_dir()``; only a run whose ``after_step`` keeps no state of its own). The result also has
    the rows in use per layer."""
    out = _fit_report(ctx, trainer, data, batch=batch, epochs=epochs, seed=seed, curve_points=curve_points,
                      curve_test=curve_test, train_accuracy=train_accuracy, train_eval=train_eval, label=label,
                      augment=augment, after_step=after_step, unit=unit, unit_every_s=unit_every_s)
    rows = trainer.rows_in_use()
    return {**out, "rows": rows, "total_rows": int(sum(rows.values()))}


# ------------------------------------------------------------------------------------------ parametric

def mlp_optimizer(name: str, hyper: dict, *, steps: int) -> optax.GradientTransformation:
    """An optimizer of F.9 / Tables 9, 10, 12 from a sweep's hyperparameters.

    ``lr`` is the learning rate; ``wd`` AdamW's weight decay; Mesa: ``lam`` (λ), ``gamma`` (γ),
    ``ns_steps`` (k Newton–Schulz steps, or None for the exact inverse), Adam base with
    momentum 0.85 (Table 9, our reading); Delta: ``lam`` (the decay rate λ of Eq. 122);
    ``schedule="warmup_cosine"`` with ``warmup`` steps: Table 11's schedule."""
    lr = hyper["lr"]
    if hyper.get("schedule") == "warmup_cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, hyper["lr"], max(1, hyper.get("warmup", 0)), max(steps, 2))
    if name == "mesa":
        inverse = "exact" if hyper.get("ns_steps") is None else "newton_schulz"
        return optim.make("mesa", learning_rate=lr, lam=hyper.get("lam", 0.01), gamma=hyper.get("gamma", 0.99),
                          inverse=inverse, ns_steps=hyper.get("ns_steps") or 10, base="adam",
                          momentum=hyper.get("momentum", 0.85))
    if name == "delta":
        return optim.make("delta", learning_rate=lr, lam=hyper.get("lam", 0.0))
    if name == "adamw":
        return optim.make("adamw", learning_rate=lr, weight_decay=hyper.get("wd", 1e-4))
    if name == "sgd" and hyper.get("wd"):
        # multiplicative weight decay W <- (1 - ηβ) W (Fig. 7), decay aligned with the schedule
        return optax.with_extra_args_support(optax.chain(optax.add_decayed_weights(hyper["wd"]), optax.sgd(lr)))
    return optim.make(name, learning_rate=lr)


def make_step(model, tx, loss_fn=cross_entropy, *, dropout: bool = False):
    """A jitted ``step(params, opt_state, x, y, key) -> (params, opt_state, loss)`` passing every
    Dense layer's inputs to ``tx`` (Mesa, Delta). ``dropout``: the model is called with
    ``train=True`` and a ``"dropout"`` rng (:func:`growmem.optim.make_train_step` otherwise)."""
    if not dropout:
        inner = optim.make_train_step(model, loss_fn, tx)
        return lambda params, opt_state, x, y, key: inner(params, opt_state, x, y)
    tx = optax.with_extra_args_support(tx)

    @jax.jit
    def step(params, opt_state, x, y, key):
        def objective(p):
            out, inputs = optim.dense_inputs(model, {"params": p}, x, train=True, rngs={"dropout": key})
            return loss_fn(out, y), inputs

        (loss, inputs), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params, layer_inputs=inputs)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def run_parametric(ctx: Context, model, tx, data: Images, *, batch: int, epochs: int = 1, seed: int = 0,
                   curve_points: int = 12, curve_test: int = 2000, train_accuracy: bool = False,
                   train_eval: int = 2000, dropout: bool = False, label: str = "", eval_epochs=None,
                   augment: bool = False, final: Optional[Callable] = None) -> Dict:
    """Train a parametric model for ``epochs`` passes (same batches and reports as
    :func:`run_growing`). A NaN/inf loss raises :class:`~growmem.train.NonFiniteLossError`
    naming the step and the last finite loss. ``eval_epochs``: evaluate only after these epochs
    (1-based; default every epoch when ``train_accuracy``). ``augment``: App. F.1.1 CIFAR epochs.
    ``final(params, opt_state) -> dict``: extra entries of the result from the trained state."""
    run = _Parametric(model, tx, jnp.asarray(data.x[:batch]), jax.random.key(seed), dropout=dropout)
    out = _fit_report(ctx, run, data, batch=batch, epochs=epochs, seed=seed, curve_points=curve_points,
                      curve_test=curve_test, train_accuracy=train_accuracy, train_eval=train_eval, label=label,
                      augment=augment, eval_epochs=eval_epochs)
    extra = final(run.params, run.opt_state) if final is not None else {}
    return {**extra, **out, "params": count_params(run.params)}


class _Parametric:
    """A parametric model and its optimizer as :func:`growmem.train.fit` drives a trainer: ``step(x, y)``
    is one update (:func:`make_step`; step ``t``'s dropout key is ``fold_in(key, t)``), ``predict(x)``."""

    def __init__(self, model, tx, sample, key, *, dropout: bool):
        self.params = model.init(key, sample)["params"]
        self.opt_state = tx.init(self.params)
        self.key, self.t = key, 0
        self._step = make_step(model, tx, dropout=dropout)
        self._predict = jax.jit(lambda p, x: model.apply({"params": p}, x))

    def step(self, x, y) -> dict:
        self.t += 1
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, jnp.asarray(x), jnp.asarray(y),
                                                       jax.random.fold_in(self.key, self.t))
        return {"loss": loss}

    def predict(self, x):
        return self._predict(self.params, jnp.asarray(x))


def count_params(params) -> int:
    """Number of scalars in a parameter tree."""
    return int(sum(np.prod(a.shape) for a in jax.tree_util.tree_leaves(params)))


def residual_mlp(cfg: dict, data: Images):
    """The residual MLP baseline of Eq. 12 / F.9: ``n_blocks`` blocks ``e ← e + W2 σ(W1 RMSNorm(e))``
    of ``hidden`` units (default: the residual stream width d_e = d), GELU, a linear head."""
    from ..layers import ResidualMLP
    return ResidualMLP(d_out=data.classes, n_blocks=cfg.get("n_blocks", 2), hidden=cfg.get("hidden") or data.d,
                       activation=cfg.get("activation", "gelu"))


def run_mlp(ctx: Context, data: Images, optimizer: str, hyper: dict, *, mlp: dict, batch: int, epochs: int = 1,
            seed: int = 0, label: str = None, **kw) -> Dict:
    """The residual MLP (:func:`residual_mlp`) trained with ``optimizer`` at ``hyper``
    (:func:`mlp_optimizer`) by :func:`run_parametric`; the result carries its ``hyper``."""
    steps = epochs * (len(data.x) // batch)
    model = residual_mlp(mlp, data)
    tx = mlp_optimizer(optimizer, hyper, steps=steps)
    return {"hyper": hyper, **run_parametric(ctx, model, tx, data, batch=batch, epochs=epochs, seed=seed,
                                             label=label or f"mlp_{optimizer}", **kw)}


def mlp_sweep(ctx: Context, data: Images, optimizer: str, hypers, *, mlp: dict, batch: int, epochs: int = 1,
              seed: int = 0, key: str = None, extend: Optional[dict] = None, reasons: Optional[dict] = None,
              **kw) -> Dict:
    """The residual MLP trained with ``optimizer`` for every configuration of ``hypers`` (a list
    of dicts); the best by final test accuracy (App. F.1), the grid extended along the axes of
    ``extend`` while the best sits at an end. See :func:`growmem.repro.core.sweep`."""
    from .core import sweep
    steps = epochs * (len(data.x) // batch)

    def one(hp):
        r = run_mlp(ctx, data, optimizer, hp, mlp=mlp, batch=batch, epochs=epochs, seed=seed,
                    label=key or f"mlp_{optimizer}", **kw)
        r.pop("hyper")
        return r

    return sweep(ctx, key or f"mlp_{optimizer}", hypers, one, steps=steps, extend=extend, reasons=reasons)
