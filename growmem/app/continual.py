"""``growmem continual``: growmem against Avalanche's strategies on a continual stream.

    growmem continual                                   # embedded drifting stream, growmem variants vs naive
                                                        # and replay_1000, a few minutes on a laptop CPU
    growmem continual --stream split_mnist --memory-budget 15.7MB \\
        --baselines naive,ewc,lwf,gdumb,replay_1000,replay_4400,cumulative,joint --seeds 1,2,3 --out runs/smnist
    growmem continual ... --checkpoint-dir runs/smnist/ckpt            # checkpoints as it goes
    growmem continual ... --checkpoint-dir runs/smnist/ckpt --resume   # continues a killed run exactly

Writes ``<out>/continual.json`` (every run, the accuracy matrices, the summary) and
``<out>/continual_accuracy_matrix.png``, ``<out>/continual_stream.png``.

Every option is declared once, in :func:`add_parser`: its ``type`` checks its value (names, numbers,
sizes) and ``to`` names the :func:`growmem.continual.runner.run_continual` argument it becomes
(``stream_options.<key>`` for a stream option), so adding an option is one ``opt(...)`` line.
:func:`check_continual` checks what involves the folders (``--resume``, a ``--checkpoint-dir``
of another command, ``--out``). All of it runs before torch and Avalanche are
imported: a usage error is one line within the interpreter's start and JAX's import.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from growmem.errors import ConfigError
from growmem.app.options import SEED_MAX, _size


def _csv(text: str) -> List[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def _checked(parse):
    """An argparse ``type`` from ``parse(text)``: its ``ValueError`` (an unknown name, a bad
    number) becomes the option's one-line error, naming the valid values."""
    def check(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    check.__name__ = parse.__name__
    return check


def _distinct(names: List[str], what: str) -> List[str]:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{what} {', '.join(twice)} listed twice")
    return names


@_checked
def stream(text: str) -> str:
    from growmem.continual.errors import unknown
    from growmem.continual.stream_names import STREAMS

    if text not in STREAMS:
        raise unknown("stream", text, STREAMS)
    return text


@_checked
def presets(text: str) -> List[str]:
    from growmem.continual.methods import resolve

    names = _distinct(_csv(text), "preset")
    for p in names:
        resolve(f"growmem:{p}")   # an unknown preset names the valid ones
    return names


@_checked
def baselines(text: str) -> List[str]:
    from growmem.continual.methods import resolve

    if text.strip().lower() == "none":
        return []
    names = _distinct(_csv(text), "baseline")
    for b in names:
        resolve(b)
    return names


@_checked
def methods(text: str) -> List[str]:
    from growmem.continual.methods import resolve_all

    names = _csv(text)
    resolve_all(names)        # an unknown name lists the valid ones; a name given twice is refused
    return names


size = _size


@_checked
def seeds(text: str) -> List[int]:
    try:
        out = [int(s) for s in _csv(text)]
    except ValueError:
        raise ConfigError(f"must be comma-separated integers, got {text!r}") from None
    if not out:
        raise ConfigError("name at least one seed")
    bad = [v for v in out if not 0 <= v <= SEED_MAX]
    if bad:
        raise ConfigError(f"seeds must be integers in [0, {SEED_MAX}], got {bad[0]}")
    _distinct([str(s) for s in out], "seed")
    return out


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``continual`` on an ``argparse`` subparsers object (``growmem/app/cli.py``)."""
    from growmem.app.options import _int

    from growmem.continual.errors import EXTRA_INSTALL

    positive = _int(1, "a positive integer")
    p = subparsers.add_parser(
        "continual", help="growmem vs Avalanche's strategies on a continual-learning stream (needs the continual extra)",
        description="Train growmem and Avalanche baselines on one continual-learning stream with the same data and "
                    "seeds; report Avalanche's accuracy matrix, forgetting, BWT and every method's memory in bytes. "
                    f"Needs avalanche-lib: {EXTRA_INSTALL}.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    to: Dict[str, str] = {}

    def opt(*flags, to_=None, **kw):
        a = p.add_argument(*flags, **kw)
        if to_ is not None:
            to[a.dest] = to_
        return a

    opt("--stream", type=stream, default="drifting_teacher", to_="stream",
        help="drifting_teacher (embedded, default), split_mnist, permuted_mnist, rotated_mnist, "
             "split_cifar10, split_cifar100")
    opt("--policy", type=presets, default=None, metavar="PRESET[,PRESET...]",
        help="growmem preset(s) (policies/NAME.toml or a path); several run side by side as "
             "growmem:PRESET (default: target_dct on split_mnist, target_subspaces on "
             "permuted_mnist and rotated_mnist, continual_growmem elsewhere; on drifting_teacher "
             "also drift_discount, continual_decay and continual_window)")
    opt("--baselines", type=baselines, default=None, metavar="NAMES",
        help="comma-separated Avalanche baselines: naive, ewc, lwf, gdumb, replay_N (replay_1000, "
             "replay_4400, ...), cumulative, joint; 'none' for none (default: naive,replay_1000)")
    opt("--methods", type=methods, default=None, metavar="NAMES",
        help="comma-separated methods by the names of the API and the benchmarks, in place of --policy and "
             "--baselines: target:dct, net:replay_dct, knn:dct, er_balanced:raw, replay_1000, naive, ...")
    opt("--memory-budget", type=size, default=None, metavar="SIZE", to_="budget_bytes",
        help="cap growmem's memory at SIZE bytes (e.g. 15.7MB; 1 MB = 10^6 B, 1 MiB = 2^20 B); every "
             "method's peak bytes are checked against it")
    opt("--online", action="store_true", to_="online", help="a single pass over each experience for every method")
    opt("--seeds", type=seeds, default="0", to_="seeds", help="comma-separated seeds (default: 0)")
    opt("--epochs", type=positive, default=None, to_="epochs",
        help="epochs per experience for every method (default: growmem's preset; baselines 2 on "
             "split_mnist, 1 elsewhere)")
    opt("--out", type=Path, default=Path("runs/continual"), to_="out",
        help="output folder (default runs/continual); a second run writing into it at the same time is refused")
    opt("--checkpoint-dir", type=Path, default=None, to_="checkpoint_dir", help="save checkpoints here as the run goes")
    opt("--resume", action="store_true", to_="resume", help="continue the run in --checkpoint-dir where it stopped")
    opt("--checkpoint-every", type=positive, default=500, to_="checkpoint_every",
        help="growmem batches between checkpoints (default 500; growmem also saves after every experience)")
    opt("--data-dir", default=None, to_="data_dir", help="folder with the dataset files (else $GROWMEM_DATA)")
    opt("--download", action="store_true", to_="download",
        help="let Avalanche download MNIST/CIFAR itself (needs a network)")
    opt("--n-experiences", type=positive, default=None, to_="stream_options.n_experiences",
        help="experiences of the stream (default: its own)")
    opt("--train-limit", type=positive, default=None, to_="stream_options.train_limit",
        help="MNIST family: use the first N training images; drifting_teacher: samples per experience")
    opt("--test-limit", type=positive, default=None, to_="stream_options.test_limit",
        help="MNIST family: the first N test images; drifting_teacher: test samples per experience")
    opt("--task-labels", action="store_true", to_="stream_options.task_labels",
        help="give each experience its task label (task-incremental; growmem keeps a readout per task)")
    opt("--loop", choices=["fast", "template"], default="fast", to_="growmem_loop",
        help="growmem's training loop: fast (native) or template (GrowmemStrategy in Avalanche's "
             "SupervisedTemplate); both give the same metrics")
    opt("--threads", type=_int(0, "0 (PyTorch's own default) or a number of threads"), default=1, to_="threads",
        help="PyTorch threads for the Avalanche baselines (default 1: their MLPs are too small for more to pay; "
             "0: PyTorch's own default)")
    opt("--no-progress", dest="progress", action="store_false", to_="progress", help="no progress bars")
    p.set_defaults(func=cmd_continual, check=check_continual, runner_args=to)
    return p


def check_continual(args):
    """What needs the folders, before anything is imported or written (``growmem.app.options.check_folders``):
    a --checkpoint-dir another command wrote, or with --resume one that holds no run; --out."""
    from growmem.app.options import check_folders

    if args.methods is not None and (args.policy is not None or args.baselines is not None):
        from growmem.errors import UsageError
        raise UsageError("--methods names every method of the run: give it alone, without --policy or --baselines")
    check_folders("continual", args.checkpoint_dir, args.resume, args.out)
    from growmem.continual.stream_names import MNIST_FAMILY

    if args.stream in MNIST_FAMILY and not args.download:
        # before torch and Avalanche are imported (seconds): the files are found the way the stream finds them
        from growmem.data import datasets, mnist
        from growmem.errors import UsageError

        try:
            mnist.find(args.data_dir)          # what the stream reads (growmem.continual.streams.mnist_arrays)
        except datasets.DatasetError as e:
            raise UsageError(f"the MNIST streams need the MNIST files: {e} Or pass --download to let Avalanche "
                             f"download MNIST itself (needs a network)") from None


def _methods(args) -> List[str]:
    from growmem.continual.runner import DEFAULT_BASELINES, DRIFT_GROWMEM, GROWMEM

    if args.methods is not None:
        return list(args.methods)
    if not args.policy:
        growmem = list(DRIFT_GROWMEM) if args.stream == "drifting_teacher" else [GROWMEM]
    elif len(args.policy) == 1:
        growmem = [GROWMEM]
    else:
        growmem = [f"{GROWMEM}:{p}" for p in args.policy]
    return growmem + (list(DEFAULT_BASELINES) if args.baselines is None else list(args.baselines))


def runner_kwargs(args) -> dict:
    """The keyword arguments of ``run_continual`` the options give (``add_parser``'s ``to``)."""
    kw: dict = {"stream_options": {}}
    for dest, name in args.runner_args.items():
        value = getattr(args, dest)
        if name.startswith("stream_options."):
            if value is not None and value is not False:
                kw["stream_options"][name.split(".", 1)[1]] = value
        else:
            kw[name] = value
    kw["methods"] = _methods(args)
    kw["growmem"] = args.policy[0] if args.policy and len(args.policy) == 1 else None
    return kw


def cmd_continual(args) -> int:
    """Claims --out and --checkpoint-dir (``growmem.app.options.claim_folders``: a second run writing the
    same results at the same time is refused at once), then imports torch and Avalanche and runs."""
    from growmem.errors import UsageError
    from growmem.app.options import claim_folders

    from growmem.continual.errors import (DatasetNotFoundError, InputShapeError, MissingExtraError, UnknownNameError,
                         require_avalanche)

    with claim_folders("continual", args.checkpoint_dir, args.resume, args.out):
        import warnings
        # Avalanche imports qpsolvers (for GEM, which growmem continual never runs); a failure stays one line
        warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
        try:
            require_avalanche()
        except MissingExtraError as e:
            raise UsageError(str(e)) from None
        from growmem.config import ConfigError
        from growmem.errors import CheckpointError

        from growmem.continual.runner import run_continual

        try:
            run_continual(**runner_kwargs(args))
        except (UnknownNameError, DatasetNotFoundError, InputShapeError, ConfigError, CheckpointError) as e:
            raise UsageError(str(e)) from None     # a run that cannot work as asked; any other error is a bug
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m growmem.app.continual``: ``growmem continual`` alone; a failure is one line
    (``SystemExit`` with the message)."""
    from growmem.errors import UsageError
    from growmem.app.options import _Parser
    from growmem.errors import GrowmemError

    ap = _Parser(prog="growmem")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    add_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "continual":
        argv = ["continual"] + argv
    try:
        args = ap.parse_args(argv)
    except UsageError as e:
        raise SystemExit(str(e)) from None
    try:
        args.check(args)
        return args.func(args)
    except GrowmemError as e:
        raise SystemExit(f"growmem continual: {' '.join(str(e).split())}") from None


if __name__ == "__main__":
    sys.exit(main())
