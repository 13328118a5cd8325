"""The ``growmem`` command.

    growmem train [--steps N] [--out DIR] ...   train a growing model (default: teacher-student
                                                regression, no data to fetch); writes
                                                metrics.json and plot.png to --out
    growmem train --policy policies/NAME.toml   the same with a preset's layers and policy chain
    growmem policies                            list the presets with a one-line description
    growmem train ... --checkpoint-dir DIR [--resume]   checkpoint as it trains / continue exactly
    growmem inspect DIR                         rows per layer, hot/cold, bytes, policy, step, format
    growmem export DIR --npz FILE               every layer's rows as plain numpy + a JSON description
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional


def _add_train(sub):
    p = sub.add_parser("train", help="train a growing model and write metrics.json + plot.png",
                       description="Train a growing weighted-softmax model on teacher-student regression "
                                   "(Sec. 5 of the paper; data generated on the fly, nothing to download).")
    p.add_argument("--out", type=Path, default=Path("runs/train"), help="output directory (default: runs/train)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per step B (default: the preset's, else 64)")
    p.add_argument("--eval-every", type=int, default=50, help="evaluate the test loss every N steps")
    p.add_argument("--test-size", type=int, default=2048, help="held-out samples for the test loss")
    p.add_argument("--kernel", choices=["weighted_softmax", "rbf"], default="weighted_softmax")
    p.add_argument("--temperature", type=float, default=1.0, help="T (default: 1.0)")
    p.add_argument("--eta", type=float, default=30.0, help="η: weight learning rate (RBF: value rate)")
    p.add_argument("--beta", type=float, default=0.3, help="β: value learning rate (weighted softmax)")
    p.add_argument("--momentum", type=float, default=0.6, help="μ of the timestamp momentum (0 = off)")
    p.add_argument("--blocks", type=int, default=0, help="residual growing blocks L before the readout")
    p.add_argument("--seed", type=int, default=0, help="teacher / data seed")
    p.add_argument("--task", choices=["auto", "teacher-student", "mnist"], default="auto",
                   help="teacher-student regression (generated, the default without --policy) or MNIST "
                        "classification (the default with --policy: the presets carry classification settings)")
    p.add_argument("--data-dir", default=None,
                   help="folder with the MNIST IDX files (else $GROWMEM_DATA, then ../shared/data/mnist)")
    p.add_argument("--policy", default=None, metavar="PATH",
                   help="a preset TOML (policies/NAME.toml, or just NAME; see `growmem policies`): its layers, "
                        "policy chain and hybrid optimizer replace --kernel/--temperature/--eta/--beta/"
                        "--momentum/--blocks")
    from .storage.commands import add_train_arguments
    add_train_arguments(p)  # --checkpoint-dir, --checkpoint-every, --keep, --resume
    p.set_defaults(func=cmd_train)


def _positive(name, value):
    if value <= 0:
        raise SystemExit(f"growmem train: --{name} must be positive, got {value}")


class _Task:
    """What `growmem train` trains on: batches by step (deterministic, so a resume replays them),
    a test set, the loss and the reported metric."""

    def __init__(self, d_out, loss, batch, test, metric, metric_name, info, describe):
        self.d_out, self.loss, self.batch, self.test = d_out, loss, batch, test
        self.metric, self.metric_name, self.info, self.describe = metric, metric_name, info, describe


def _make_task(name: str, args) -> _Task:
    import jax.numpy as jnp
    import numpy as np

    if name == "teacher-student":
        from .data.teacher_student import TeacherStudent
        from .train import squared_error

        ts = TeacherStudent(seed=args.seed)
        xt, yt = ts.test_set(args.test_size)
        var = float(yt.var())
        return _Task(ts.d_out, "squared_error", ts.batch, (xt, yt),
                     lambda p, y: float(squared_error(p, y)), "mse", {"target_variance": var},
                     f"target variance {var:.4e}")
    from .data import mnist

    try:
        x, y = mnist.load("train", args.data_dir)
        xt, yt = mnist.load("test", args.data_dir, limit=args.test_size)
    except (FileNotFoundError, OSError) as e:
        raise SystemExit(f"growmem train --task mnist: {e}")
    # RMS-normalised images (‖x‖ = √d), the residual stream's scale in the paper's setting
    x, xt = (a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) for a in (x, xt))
    n, b = len(x), args.batch_size

    def batch(step: int, size: int):
        # epoch-wise reshuffled order, a pure function of (seed, epoch): resumable
        i = (step - 1) * size
        epoch, pos = divmod(i, n)
        order = np.random.default_rng([args.seed, epoch]).permutation(n)
        idx = order[np.arange(pos, pos + size) % n]
        return x[idx], y[idx]

    return _Task(10, "cross_entropy", batch, (xt, yt),
                 lambda logits, labels: float(np.mean(np.asarray(jnp.argmax(logits, -1)) == labels)),
                 "accuracy", {"train_samples": n, "test_samples": len(xt)}, f"{len(xt)} test images")


def cmd_train(args) -> int:
    import jax
    import jax.numpy as jnp
    from tqdm import tqdm

    from .layers import GrowingSpec, ResidualGrowingNet
    from .reporting import pyplot, save_figure, write_json
    from .train import Trainer

    preset = None
    if args.policy is not None:
        from .config import ConfigError, load
        try:
            preset = load(args.policy)
        except ConfigError as e:
            raise SystemExit(f"growmem train: --policy: {e}")
    if args.batch_size is None:
        args.batch_size = preset.settings["batch_size"] if preset is not None else 64
    for name in ("steps", "batch_size", "eval_every", "test_size"):
        _positive(name.replace("_", "-"), getattr(args, name))
    b = args.batch_size
    task_name = args.task if args.task != "auto" else ("mnist" if preset is not None else "teacher-student")
    task = _make_task(task_name, args)
    xt, yt = task.test
    if preset is not None:
        spec, model, hybrid_tx = preset.readout, preset.model(task.d_out), preset.hybrid_tx()
    else:
        if args.kernel == "weighted_softmax":
            spec = GrowingSpec.make("weighted_softmax", temperature=args.temperature, eta=args.eta,
                                    beta=args.beta, momentum=args.momentum, init="random", init_rows=b)
        else:
            spec = GrowingSpec.make("rbf", temperature=args.temperature, eta=args.eta, momentum=args.momentum)
        model, hybrid_tx = ResidualGrowingNet(d_out=task.d_out, n_blocks=args.blocks, readout=spec), None
    trainer = Trainer(model, loss=task.loss, sample_input=xt[:b], rng=jax.random.key(args.seed),
                      hybrid_tx=hybrid_tx)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    from .storage.commands import RUN_CONTROL, TrainCheckpoints
    ckpts = TrainCheckpoints(args, trainer, {k: v for k, v in config.items() if k not in RUN_CONTROL},
                             every_default=args.eval_every)  # restores the latest checkpoint with --resume

    def test_loss():
        return task.metric(trainer.predict(xt), yt)

    curve = ckpts.extra["curve"] if ckpts.extra else [[0, test_loss()]]
    train_curve = ckpts.extra["train_curve"] if ckpts.extra else []
    t0 = time.perf_counter()
    with tqdm(total=args.steps, initial=ckpts.start, desc="growmem train", unit="step", dynamic_ncols=True) as bar:
        for step in range(ckpts.start + 1, args.steps + 1):
            x, y = task.batch(step, b)
            m = trainer.step(x, y)
            if step % args.eval_every == 0 or step == args.steps:
                train_curve.append([step * b, float(m["loss"])])
                curve.append([step * b, test_loss()])
                bar.set_postfix({task.metric_name: f"{curve[-1][1]:.4g}", "rows": sum(trainer.rows_in_use().values())})
            bar.update(1)
            ckpts.after_step(step, extra={"curve": curve, "train_curve": train_curve},
                             policy={"preset": args.policy, "policy": repr(spec.policy)} if args.policy else None)
    ckpts.close()
    seconds = time.perf_counter() - t0
    metrics = {"task": task_name, "config": config, "spec": repr(spec), "metric": task.metric_name,
               "test_curve": curve, "train_curve": train_curve,
               ("final_test_loss" if task.metric_name == "mse" else f"final_test_{task.metric_name}"): curve[-1][1],
               **task.info,
               "rows": trainer.rows_in_use(), "seconds": seconds,
               "steps_per_second": (args.steps - ckpts.start) / seconds}
    out = Path(args.out)
    write_json(out / "metrics.json", metrics)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*zip(*curve), marker="o", label=f"test {task.metric_name}")
    if train_curve and task.metric_name == "mse":
        ax.plot(*zip(*train_curve), alpha=0.6, label="train loss (batch)")
    if "target_variance" in task.info:
        ax.axhline(task.info["target_variance"], ls=":", color="k", lw=0.8, label="target variance")
        ax.set_yscale("log")
    ax.set_xlabel("training samples")
    ax.set_ylabel(f"test {task.metric_name}")
    model_desc = f"preset {Path(args.policy).stem}" if preset is not None else f"{args.kernel}, L={args.blocks}"
    ax.set_title(f"growmem train: {task_name}, {model_desc}")
    ax.legend()
    save_figure(fig, out / "plot.png")
    print(f"final test {task.metric_name} {curve[-1][1]:.4g} ({task.describe}); "
          f"rows {trainer.rows_in_use()}; {(args.steps - ckpts.start) / seconds:.1f} steps/s")
    print(f"wrote {out / 'metrics.json'} and {out / 'plot.png'}")
    return 0


def _add_policies(sub):
    p = sub.add_parser("policies", help="list the preset TOML files (growth policies) with a one-line description",
                       description="List the presets in policies/ usable with `growmem train --policy NAME`.")
    p.add_argument("--dir", type=Path, default=None, help="list the presets in this folder instead")
    p.set_defaults(func=cmd_policies)


def cmd_policies(args) -> int:
    from .config import available
    presets = available(args.dir)
    if not presets:
        print("no presets found")
        return 1
    width = max(len(name) for name, _, _ in presets)
    for name, _, desc in presets:
        print(f"{name:{width}s}  {desc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="growmem", description="Continual learning with growing memories.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_policies(sub)
    from .storage.commands import add_commands
    add_commands(sub)  # inspect, export
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
