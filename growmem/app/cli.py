"""The ``growmem`` command.

    growmem train [--steps N] [--out DIR] ...   train a growing model (default: teacher-student
                                                regression, no data to fetch); writes
                                                metrics.json and plot.png to --out
    growmem train --policy NAME|FILE.toml       the same with a preset's layers and policy chain (MNIST)
    growmem train ... --checkpoint-dir DIR [--resume]   checkpoint as it trains / continue exactly
    growmem train ... --ram-budget 512MB [--spill-dir DIR]   rows past the budget go to disk
    growmem policies [--copy DIR]               list the shipped presets (or copy them out to edit)
    growmem inspect DIR                         rows per layer, hot/cold, bytes, policy, step; checksums verified
    growmem export DIR --npz FILE               every layer's rows as plain numpy + a JSON description
    growmem continual ...                       growmem vs Avalanche's strategies on a continual stream
    growmem repro NAME --preset smoke|cpu|paper  one of the paper's experiments (--list lists them)

Every failure is one line on stderr naming the problem and the fix, with a non-zero exit code.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import List, Optional


from growmem.errors import RunError, UsageError  # noqa: F401  (the commands raise them; main() reports them)
from growmem.app.options import SEED_MAX, _finite, _int, _Parser, _size, _temperature, check_folders, claim_folders  # noqa: F401  (shared with the commands)


# ------------------------------------------------------------------------------------- sizes

from growmem.units import parse_size  # noqa: E402


def _size_text(text):
    """A positive size, kept as written (the run's configuration records it so)."""
    _size(text)
    return str(text)


# ------------------------------------------------------------------------------------- train

#: ``growmem train`` options that do not change the model or the data: they may differ on --resume
RUN_CONTROL = frozenset({"out", "steps", "eval_every", "test_size", "checkpoint_dir", "checkpoint_every", "keep",
                         "resume", "resume_step", "spill_dir", "coordinator", "process_id", "download",
                         "on_nonfinite"})


def _add_train(sub):
    p = sub.add_parser("train", help="train a growing model and write metrics.json + plot.png",
                       description="Train a growing weighted-softmax model on teacher-student regression "
                                   "(Sec. 5 of the paper; data generated on the fly, nothing to download), or a "
                                   "preset on MNIST.")
    p.add_argument("--out", type=Path, default=Path("runs/train"), help="output directory (default: runs/train)")
    p.add_argument("--steps", type=_int(1, "a positive integer"), default=300, help="training steps (default: 300)")
    p.add_argument("--batch-size", type=_int(1, "a positive integer"), default=None,
                   help="samples per step B (default: the preset's, else 64)")
    p.add_argument("--eval-every", type=_int(1, "a positive integer"), default=50,
                   help="evaluate the test loss every N steps")
    p.add_argument("--test-size", type=_int(1, "a positive integer"), default=2048,
                   help="held-out samples for the test loss")
    p.add_argument("--kernel", choices=["weighted_softmax", "rbf"], default="weighted_softmax")
    p.add_argument("--temperature", type=_temperature, default=1.0,
                   help="T (default: 1.0)")
    p.add_argument("--eta", type=_finite(0, what="a finite number >= 0"), default=30.0,
                   help="η: weight learning rate (RBF: value rate)")
    p.add_argument("--beta", type=_finite(what="a finite number"), default=0.3,
                   help="β: value learning rate (weighted softmax)")
    p.add_argument("--momentum", type=_finite(0, hi=1, hi_open=True, what="a number in [0, 1)"), default=0.6,
                   help="μ of the timestamp momentum (0 = off)")
    p.add_argument("--blocks", type=_int(0, "an integer >= 0"), default=0,
                   help="residual growing blocks L before the readout")
    p.add_argument("--seed", type=_int(0, f"an integer in [0, {SEED_MAX}]", SEED_MAX), default=0,
                   help="teacher / data seed")
    p.add_argument("--on-nonfinite", choices=["stop", "skip"], default="stop",
                   help="a step whose loss is NaN/inf: stop with an error before any checkpoint (default), or skip "
                        "on (its non-finite rows are dropped either way)")
    p.add_argument("--task", choices=["auto", "teacher-student", "mnist"], default="auto",
                   help="teacher-student regression (generated, the default without --policy) or MNIST "
                        "classification (the default with --policy: the presets carry classification settings)")
    p.add_argument("--data-dir", default=None,
                   help="folder with the MNIST IDX files (else $GROWMEM_DATA/mnist, then ~/.cache/growmem/mnist)")
    p.add_argument("--download", action="store_true", help="download MNIST into the cache if it is missing")
    p.add_argument("--policy", default=None, metavar="NAME|FILE",
                   help="a shipped preset (see `growmem policies`) or a preset TOML file: its layers, policy chain "
                        "and hybrid optimizer replace --kernel/--temperature/--eta/--beta/--momentum/--blocks")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="save Orbax checkpoints (step, params, optimizer and policy state, memories) here")
    g.add_argument("--checkpoint-every", type=_int(1, "a positive integer"), default=None,
                   help="steps between checkpoints (default: --eval-every); the last step is always saved")
    g.add_argument("--keep", type=_int(1, "an integer >= 1"), default=3, help="checkpoints to keep (default: 3)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir (the model configuration must match)")
    g.add_argument("--resume-step", type=_int(0, "an integer >= 0"), default=None, metavar="N",
                   help="with --resume: continue from step N instead of the latest (e.g. when the latest is "
                        "damaged); the checkpoints after N are removed")
    g = p.add_argument_group("memory larger than RAM")
    g.add_argument("--ram-budget", type=_size_text, default=None, metavar="SIZE",
                   help="keep at most SIZE (e.g. 512MB, 2GB) of rows in RAM; older rows spill to TensorStore tiers "
                        "on disk and training still reads them")
    g.add_argument("--spill-dir", type=Path, default=None,
                   help="where the spilled rows go (default: CHECKPOINT_DIR/cold, else OUT/cold)")
    g = p.add_argument_group("several devices and machines")
    g.add_argument("--shard", action="store_true",
                   help="split every memory's rows over all devices (with --ram-budget: per device)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="run as one of --num-processes processes (jax.distributed; implies --shard over every "
                        "process's devices); start the same command on every host with its --process-id")
    g.add_argument("--num-processes", type=int, default=1, help="processes of a distributed run")
    g.add_argument("--process-id", type=int, default=0, help="this process's index in a distributed run")
    p.set_defaults(func=cmd_train, check=check_train)


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
        from growmem.data.teacher_student import TeacherStudent
        from growmem.train import squared_error

        ts = TeacherStudent(seed=args.seed)
        xt, yt = ts.test_set(args.test_size)
        var = float(yt.var())
        return _Task(ts.d_out, "squared_error", ts.batch, (xt, yt),
                     lambda p, y: float(squared_error(p, y)), "mse", {"target_variance": var},
                     f"target variance {var:.4e}")
    from growmem.data import mnist

    try:
        x, y = mnist.load("train", args.data_dir, download=args.download)
        xt, yt = mnist.load("test", args.data_dir, limit=args.test_size, download=args.download)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise UsageError(f"--task mnist: {' '.join(str(e).split())}")
    # RMS-normalised images (‖x‖ = √d), the residual stream's scale in the paper's setting
    x, xt = (a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) for a in (x, xt))
    n = len(x)

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


def _distributed(args):
    """Join a jax.distributed run (--coordinator): before any JAX computation."""
    if args.coordinator is None:
        return
    import jax

    if not 0 <= args.process_id < args.num_processes:
        raise UsageError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}")
    # cross-process collectives between CPU devices (set before any backend starts; GPUs/TPUs
    # use their own collectives whatever this says)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                   initialization_timeout=300)
    except Exception as e:   # the coordinator is unreachable, a process is missing
        raise UsageError(f"--coordinator {args.coordinator}: cannot join the distributed run "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); start every process with the same "
                         f"--coordinator and --num-processes") from None


def _backend(args):
    """The memories' backend: --ram-budget / --spill-dir (a disk tier), --shard / --coordinator
    (rows split over devices), both (each device's share spills); None: in RAM."""
    tier = _tier(args)
    if args.shard or args.coordinator:
        from growmem.backends.sharded import Sharded, row_mesh

        return Sharded(row_mesh(), inner=tier)
    return tier


def _tier(args):
    if args.ram_budget is None:
        return None
    from growmem.backends.tiered import Tiered

    budget = parse_size(args.ram_budget)
    where = args.spill_dir or (Path(args.checkpoint_dir) / "cold" if args.checkpoint_dir is not None
                               else Path(args.out) / "cold")
    resuming = bool(args.resume and args.checkpoint_dir is not None and _has_checkpoint(args.checkpoint_dir))
    if resuming and not _spilled(args.checkpoint_dir):
        raise UsageError(f"--resume --ram-budget: the run in {args.checkpoint_dir} was checkpointed with its rows in "
                         f"RAM (no --ram-budget); resume it without --ram-budget (a run keeps the memory it started "
                         f"with), or start a new run with it")
    if resuming and not Path(where).exists():
        raise UsageError(f"--resume: the spilled rows of this run are not at {where}; pass the --spill-dir the run used")
    # --resume of a run stopped before its first checkpoint starts at step 0: the rows it spilled into its own
    # checkpoint folder are referred to by no checkpoint, and are replaced (a spill folder elsewhere may be
    # another run's: it is never overwritten)
    restart = bool(args.resume and args.checkpoint_dir is not None and not resuming
                   and Path(where).resolve().is_relative_to(Path(args.checkpoint_dir).resolve()))
    return Tiered(where, ram_budget_bytes=budget, resume=resuming, overwrite=restart)


def _newest_intact(directory, steps) -> Optional[int]:
    """The newest of ``steps`` whose checkpoint verifies, its arrays and the cold rows it refers to (an older
    checkpoint refers to the same cold chunks as the damaged one up to its own row count), or None."""
    from growmem.checkpoint import CheckpointError, inspect

    for s in sorted(steps, reverse=True):
        try:
            inspect(directory, s, verify=True)
        except CheckpointError:
            continue
        return s
    return None


def _spilled(directory) -> bool:
    """Does the latest checkpoint in ``directory`` refer to a cold tier (was the run started with
    --ram-budget)? True when that cannot be read: the resume itself then reports what is wrong."""
    from growmem.checkpoint.inspect import _tier_refs
    from growmem.checkpoint.manager import latest_meta

    try:
        meta = latest_meta(directory)
    except Exception:          # a damaged checkpoint is the resume's to report, with its own message
        return True
    if meta is None:
        return True
    return any(_tier_refs(m) for m in meta["memories"] + meta.get("stores", []))


def _has_checkpoint(directory) -> bool:
    d = Path(directory)
    return d.is_dir() and any(c.name.isdigit() for c in d.iterdir())


def check_train(args):
    """What ``growmem train`` can refuse before it imports or loads anything (no side effects):
    run by :func:`main` before the command (and before it re-executes itself)."""
    if args.resume_step is not None and not args.resume:
        raise UsageError("--resume-step needs --resume")
    check_folders("train", args.checkpoint_dir, args.resume, args.out)


class _Interrupt:
    """Ctrl-C during training: finish the current step, then stop (a second Ctrl-C aborts)."""

    def __init__(self):
        self.hit = False
        self._old = None

    def __enter__(self):
        if _main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def cmd_train(args) -> int:
    """``growmem train``: --out and --checkpoint-dir are claimed first (locked, the checkpoint
    folder marked as a train run's); a run that fails removes what it created and left empty.
    In a distributed run process 0 claims them (the one that writes the results and the marker)."""
    if args.coordinator is not None and args.process_id != 0:
        return _train(args)
    with claim_folders("train", args.checkpoint_dir, args.resume, Path(args.out)):
        return _train(args)


def _train(args) -> int:
    import jax

    from growmem.runtime import keep_freed_memory
    keep_freed_memory()     # no page faults for the large buffers XLA allocates every step

    from growmem import kernels, rules
    from growmem.layers import GrowingSpec, ResidualGrowingNet
    from growmem.reporting import pyplot, save_figure, write_json
    from growmem.train import NonFiniteLossError, Trainer, fit

    _distributed(args)
    preset = None
    if args.policy is not None:
        from growmem.config import ConfigError, load
        try:
            preset = load(args.policy)
        except ConfigError as e:
            raise UsageError(f"--policy: {e}")
    if preset is not None and not hasattr(preset, "readout"):
        raise UsageError(f"--policy {args.policy}: a target-memory preset ({type(preset).__name__}) has no "
                         "growing network to train; run it with `growmem continual --policy "
                         f"{args.policy}` or growmem.continual.GrowmemLearner")
    if args.batch_size is None:
        args.batch_size = preset.settings["batch_size"] if preset is not None else 64
    b = args.batch_size
    task_name = args.task if args.task != "auto" else ("mnist" if preset is not None else "teacher-student")
    task = _make_task(task_name, args)
    xt, yt = task.test
    backend = _backend(args)
    if preset is not None:
        spec = preset.readout
        trainer = preset.trainer(xt[:b], task.d_out, rng=jax.random.key(args.seed), loss=task.loss, backend=backend)
    else:
        kern = kernels.get(args.kernel)
        hyper = {k: v for k, v in (("eta", args.eta), ("beta", args.beta)) if k in rules.RULE_HYPER[kern.rules[0]]}
        d0 = {"init": "random", "init_rows": b} if kern.normalised else {}   # D0 of F.3 for the softmax
        spec = GrowingSpec.make(args.kernel, temperature=args.temperature, momentum=args.momentum, **hyper, **d0)
        model = ResidualGrowingNet(d_out=task.d_out, n_blocks=args.blocks, readout=spec)
        trainer = Trainer(model, loss=task.loss, sample_input=xt[:b], rng=jax.random.key(args.seed), backend=backend)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("func", "check")}
    run_config = {k: v for k, v in config.items() if k not in RUN_CONTROL}
    ckpt, start, extra = _checkpoints(args, trainer, run_config)
    tier = getattr(backend, "inner", backend)       # where a Sharded backend's shards keep rows, or the backend
    if getattr(tier, "hot_rows_per_layer", None) is not None:       # a RAM budget: a tier on disk
        print(f"rows past {args.ram_budget} spill to {tier.directory} "
              f"({tier.hot_rows_per_layer} hot rows per layer{' and device' if tier is not backend else ''})")
    if getattr(backend, "n_shards", 1) > 1:
        print(f"every memory's rows split over {backend.n_shards} devices ({jax.process_count()} processes)")

    def test_metric():
        return task.metric(trainer.predict(xt), yt)

    curve = extra["curve"] if extra else [[0, test_metric()]]
    train_curve = extra["train_curve"] if extra else []
    last_loss = {}
    dropped = []

    def on_step(step, m):
        last_loss["loss"] = m["loss"]
        dropped.append(m["dropped_rows"])

    def evaluate(step):
        train_curve.append([step * b, float(last_loss["loss"])])
        curve.append([step * b, test_metric()])
        return {task.metric_name: curve[-1][1], "rows": sum(trainer.rows_in_use().values())}

    policy_desc = {"preset": args.policy, "policy": repr(trainer.memories()[("readout",)].policy)} \
        if args.policy else None

    def checkpoint(step):
        ckpt.save(trainer, step, data_position={"step": step}, config=run_config, policy=policy_desc,
                  extra={"curve": curve, "train_curve": train_curve})

    try:
        with _Interrupt() as interrupt:
            out = fit(trainer, lambda step: task.batch(step, b), steps=args.steps, start=start,
                      checkpoint=checkpoint if ckpt is not None else None,
                      every=args.checkpoint_every or args.eval_every, on_step=on_step, evaluate=evaluate,
                      eval_every=args.eval_every, progress=True, desc="growmem train", stop=lambda: interrupt.hit,
                      on_nonfinite=args.on_nonfinite)
    except NonFiniteLossError as e:
        last = ckpt.latest_step() if ckpt is not None else None
        raise RunError(f"{e}; {'the last checkpoint is step ' + str(last) if last is not None else 'no checkpoint'}")
    finally:
        if ckpt is not None:
            ckpt.close()
    if out["stopped"] and out["stopped"].startswith("stopped"):
        how = (f"resume with the same command and --resume (checkpoint step {out['step']} in {args.checkpoint_dir})"
               if ckpt is not None else "no --checkpoint-dir was given, so nothing was saved")
        print(f"growmem train: interrupted at step {out['step']}; {how}", file=sys.stderr)
        return 130
    n_dropped = int(sum(int(d) for d in jax.device_get(dropped))) if dropped else 0
    seconds = out["seconds"]
    metrics = {"task": task_name, "config": config, "spec": repr(spec), "metric": task.metric_name,
               "test_curve": curve, "train_curve": train_curve,
               ("final_test_loss" if task.metric_name == "mse" else f"final_test_{task.metric_name}"): curve[-1][1],
               **task.info, "rows": trainer.rows_in_use(), "seconds": seconds,
               "steps_per_second": out["steps_per_second"], "policy": policy_desc,
               "dropped_nonfinite_rows": n_dropped, "nonfinite_loss_steps": out["nonfinite_steps"],
               "stopped": out["stopped"]}
    outdir = Path(args.out)
    if jax.process_index() != 0:   # one process of a distributed run writes the results
        return 0
    try:
        write_json(outdir / "metrics.json", metrics)
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
        save_figure(fig, outdir / "plot.png")
    except OSError as e:
        saved = f"; the checkpoints in {args.checkpoint_dir} are complete" if ckpt is not None else ""
        raise RunError(f"writing the results to {outdir} failed ({_reason(e)}){saved}") from None
    rate = f"{out['steps_per_second']:.1f} steps/s" if out["steps_per_second"] else "no steps run"
    print(f"final test {task.metric_name} {curve[-1][1]:.4g} ({task.describe}); rows {trainer.rows_in_use()}; {rate}")
    if n_dropped:
        print(f"{n_dropped} candidate rows were not finite and did not enter the memories")
    print(f"wrote {outdir / 'metrics.json'} and {outdir / 'plot.png'}")
    return 0


def _reason(e: OSError) -> str:
    return "the disk is full" if getattr(e, "errno", None) == 28 else (e.strerror or str(e))


def _checkpoints(args, trainer, config):
    """``(Checkpointer or None, start step, extra)``: opens --checkpoint-dir (claimed by
    :func:`cmd_train`), restores with --resume."""
    if args.checkpoint_dir is None:
        return None, 0, None
    from growmem.checkpoint import CheckpointError, Checkpointer, CorruptCheckpointError

    ckpt = None
    try:
        ckpt = Checkpointer(args.checkpoint_dir, keep=args.keep)
        steps = ckpt.all_steps()
        latest = steps[-1] if steps else None
        if not args.resume:   # claim_folders refused a folder that holds a run
            return ckpt, 0, None
        if latest is None:   # the run was stopped before its first checkpoint: its step 0 is the start
            print(f"no checkpoint in {args.checkpoint_dir} yet (the run stopped before its first): starting from "
                  f"step 0")
            return ckpt, 0, None
        step = latest if args.resume_step is None else args.resume_step
        if step not in steps:
            raise UsageError(f"--resume-step {step}: {args.checkpoint_dir} holds steps {steps}")
        if step > args.steps:
            raise UsageError(f"the checkpoint in {args.checkpoint_dir} is at step {step}, already past --steps "
                             f"{args.steps}: nothing to train; pass --steps N with N > {step} to train on (growmem "
                             f"inspect {args.checkpoint_dir} shows it)")
        try:
            r = ckpt.restore(trainer, step, config=config)
        except CorruptCheckpointError as e:
            older = [s for s in steps if s < step]
            intact = _newest_intact(args.checkpoint_dir, older)
            hint = (f"; the newest older checkpoint that verifies (its cold rows included) is step {intact}: resume "
                    f"from it with --resume --resume-step {intact}" if intact is not None else
                    f"; no older checkpoint verifies either ({len(older)} checked: they share the damaged rows): "
                    f"start again without --resume in another --checkpoint-dir" if older else
                    "; no older checkpoint is left: start again without --resume in another --checkpoint-dir")
            raise UsageError(f"{e}{hint}") from None
        newer = [s for s in steps if s > step]
        for s in newer:   # an abandoned continuation: the run goes on from `step` instead
            ckpt.delete(s)
        print(f"resumed from step {r.step} of {args.checkpoint_dir}"
              + (f" (removed the later checkpoints {newer})" if newer else "")
              + (f": the run had reached --steps {args.steps} (stopped before its results were written); writing "
                 f"them" if r.step == args.steps else ""))
        return ckpt, r.step, r.extra
    except (CheckpointError, UsageError) as e:
        if ckpt is not None:
            ckpt.close()
        raise UsageError(str(e)) from None
    except BaseException:
        if ckpt is not None:
            ckpt.close()
        raise


# ------------------------------------------------------------------------------------- policies, inspect, export

def _add_policies(sub):
    p = sub.add_parser("policies", help="list the preset TOML files (growth policies) with a one-line description",
                       description="List the shipped presets usable with `growmem train --policy NAME`.")
    p.add_argument("--dir", type=Path, default=None, help="list the presets in this folder instead")
    p.add_argument("--copy", type=Path, default=None, metavar="DIR",
                   help="copy the shipped presets into DIR (to edit them and pass --policy DIR/NAME.toml)")
    p.set_defaults(func=cmd_policies)


def cmd_policies(args) -> int:
    from growmem.config import PRESET_DIR, available

    if args.copy is not None:
        import shutil

        args.copy.mkdir(parents=True, exist_ok=True)
        for name, path, _ in available():
            target = args.copy / f"{name}.toml"
            if target.exists():
                raise UsageError(f"{target} exists; remove it or copy into another folder")
            shutil.copyfile(path, target)
        print(f"copied {len(available())} presets from {PRESET_DIR} to {args.copy}")
        return 0
    presets = available(args.dir)
    if not presets:
        raise UsageError(f"no presets found in {args.dir or PRESET_DIR}")
    width = max(len(name) for name, _, _ in presets)
    for name, _, desc in presets:
        print(f"{name:{width}s}  {desc}")
    return 0


def _add_storage(sub):
    p = sub.add_parser("inspect", help="summarise a checkpoint directory (checksums verified)",
                       description="Rows per layer, hot/cold split, bytes, policy, step, created-at and format "
                                   "version of a growmem checkpoint (the latest by default); every checksum is "
                                   "verified.")
    p.add_argument("dir", type=Path, help="checkpoint directory (as given to --checkpoint-dir)")
    p.add_argument("--step", type=int, default=None, help="a specific step (default: latest)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("export", help="write every layer's rows to a plain .npz",
                       description="Rows of every layer as numpy arrays (<layer>/w, /k, /v, /born) plus a JSON "
                                   "description of kernels and temperatures (__description__ in the npz, and "
                                   "FILE.json beside it).")
    p.add_argument("dir", type=Path, help="checkpoint directory")
    p.add_argument("--npz", type=Path, required=True, help="output file (written under exactly this name)")
    p.add_argument("--step", type=int, default=None, help="a specific step (default: latest)")
    p.set_defaults(func=cmd_export)


def cmd_inspect(args) -> int:
    import json

    from growmem.checkpoint import format_inspect, inspect

    info = inspect(args.dir, args.step)   # a CheckpointError (damaged, missing) is reported by main()
    print(json.dumps(info, indent=2) if args.json else format_inspect(info))
    return 0


def cmd_export(args) -> int:
    from growmem.checkpoint import export

    desc = export(args.dir, args.npz, args.step)   # a CheckpointError (damaged, disk full) is reported by main()
    rows = {k: v["rows"] for k, v in desc["layers"].items()}
    print(f"wrote {args.npz} (step {desc['step']}, rows {rows}) and {args.npz}.json")
    return 0


# ------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="growmem", description="Continual learning with growing memories.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_policies(sub)
    _add_storage(sub)
    from growmem.app.data import add_parser as add_data
    add_data(sub)
    from growmem.app.continual import add_parser as add_continual
    add_continual(sub)
    from growmem.app.repro import add_parser as add_repro
    add_repro(sub)
    return ap


def _one_line(text) -> str:
    return " ".join(str(text).split())


def main(argv: Optional[List[str]] = None) -> int:
    """The ``growmem`` command: 0 on success, 2 for a problem with the command or its inputs,
    1 for a run that failed on its way, 130 when interrupted — always one line on stderr."""
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except UsageError as e:
        print(_one_line(e), file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    from growmem.errors import GrowmemError

    # a failure is reported once, as one line: not also by the logs of the libraries underneath
    # (Orbax logs a failed save's traceback before raising it)
    import logging
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    who = f"growmem {args.command}"
    try:
        from growmem import environment
        environment.check()
        if getattr(args, "check", None) is not None:
            args.check(args)        # what the command can refuse before it imports or loads anything
        if argv is None and args.command in ("train", "repro"):
            # a training command line (not an in-process call), checked: huge-page backed malloc, set at exec
            from growmem.runtime import exec_with_huge_pages
            exec_with_huge_pages()
        return args.func(args)
    except UsageError as e:
        print(f"{who}: {_one_line(e)}", file=sys.stderr)
        return 2
    except GrowmemError as e:
        # RunError, CheckpointError, TierError, LockedError, DatasetError, ConfigError, ...
        print(f"{who}: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{who}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"{who}: {_reason(e)}" + (f" ({e.filename})" if getattr(e, "filename", None) else ""), file=sys.stderr)
        return 1


if __name__ == "__main__":      # python -m growmem.app.cli
    sys.exit(main())
