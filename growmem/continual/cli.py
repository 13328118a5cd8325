"""``growmem continual``: growmem against Avalanche's strategies on a continual stream.

    growmem continual                                   # embedded drifting stream, growmem variants vs naive
                                                        # and replay_1000, a few minutes on a laptop CPU
    growmem continual --stream split_mnist --memory-budget 15.7MB \\
        --baselines naive,ewc,lwf,gdumb,replay_1000,replay_4400,cumulative,joint --seeds 1,2,3 --out runs/smnist
    growmem continual ... --checkpoint-dir runs/smnist/ckpt            # checkpoints as it goes
    growmem continual ... --checkpoint-dir runs/smnist/ckpt --resume   # continues a killed run exactly

Writes ``<out>/continual.json`` (every run, the accuracy matrices, the summary) and
``<out>/continual_accuracy_matrix.png``, ``<out>/continual_stream.png``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional


def _csv(text: str) -> List[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``continual`` on an ``argparse`` subparsers object (``growmem/cli.py``)."""
    from .errors import EXTRA_INSTALL

    p = subparsers.add_parser(
        "continual", help="growmem vs Avalanche's strategies on a continual-learning stream (needs the continual extra)",
        description="Train growmem and Avalanche baselines on one continual-learning stream with the same data and "
                    "seeds; report Avalanche's accuracy matrix, forgetting, BWT and every method's memory in bytes. "
                    f"Needs avalanche-lib: {EXTRA_INSTALL}.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stream", default="drifting_teacher",
                   help="drifting_teacher (embedded, default), split_mnist, permuted_mnist, rotated_mnist, "
                        "split_cifar10, split_cifar100")
    p.add_argument("--policy", default=None, metavar="PRESET[,PRESET...]",
                   help="growmem preset(s) (policies/NAME.toml or a path); several run side by side as "
                        "growmem:PRESET (default: target_dct on split_mnist, target_subspaces on "
                        "permuted_mnist and rotated_mnist, continual_growmem elsewhere; on drifting_teacher "
                        "also continual_decay and continual_window)")
    p.add_argument("--baselines", default=None, metavar="NAMES",
                   help="comma-separated Avalanche baselines: naive, ewc, lwf, gdumb, replay_N (replay_1000, "
                        "replay_4400, ...), cumulative, joint; 'none' for none (default: naive,replay_1000)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="cap growmem's memory at SIZE bytes (e.g. 15.7MB; 1 MB = 10^6 B, 1 MiB = 2^20 B); every "
                        "method's peak bytes are checked against it")
    p.add_argument("--online", action="store_true", help="a single pass over each experience for every method")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per experience for every method (default: growmem's preset; baselines 2 on "
                        "split_mnist, 1 elsewhere)")
    p.add_argument("--out", type=Path, default=Path("runs/continual"), help="output folder (default runs/continual)")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save checkpoints here as the run goes")
    p.add_argument("--resume", action="store_true", help="continue the run in --checkpoint-dir where it stopped")
    p.add_argument("--checkpoint-every", type=int, default=500, help="growmem batches between checkpoints")
    p.add_argument("--data-dir", default=None, help="folder with the dataset files (else $GROWMEM_DATA)")
    p.add_argument("--download", action="store_true",
                   help="let Avalanche download MNIST/CIFAR itself (needs a network)")
    p.add_argument("--n-experiences", type=int, default=None, help="experiences of the stream (default: its own)")
    p.add_argument("--train-limit", type=int, default=None,
                   help="MNIST family: use the first N training images; drifting_teacher: samples per experience")
    p.add_argument("--test-limit", type=int, default=None,
                   help="MNIST family: the first N test images; drifting_teacher: test samples per experience")
    p.add_argument("--task-labels", action="store_true", help="give each experience its task label "
                   "(task-incremental; growmem keeps a readout per task)")
    p.add_argument("--loop", choices=["fast", "template"], default="fast",
                   help="growmem's training loop: fast (native) or template (GrowmemStrategy in Avalanche's "
                        "SupervisedTemplate); both give the same metrics")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_continual)
    return p


def _methods(args) -> Optional[List[str]]:
    from .runner import DEFAULT_BASELINES, DRIFT_GROWMEM, GROWMEM

    presets = _csv(args.policy) if args.policy else None
    if presets is None:
        growmem = list(DRIFT_GROWMEM) if args.stream == "drifting_teacher" else [GROWMEM]
    elif len(presets) == 1:
        growmem = [GROWMEM]
    else:
        growmem = [f"{GROWMEM}:{p}" for p in presets]
    if args.baselines is None:
        base = list(DEFAULT_BASELINES)
    elif args.baselines.strip().lower() == "none":
        base = []
    else:
        base = _csv(args.baselines)
    return growmem + base


def cmd_continual(args) -> int:
    from .errors import (DatasetNotFoundError, InputShapeError, MissingExtraError, UnknownNameError,
                         require_avalanche)

    try:
        require_avalanche()
    except MissingExtraError as e:
        raise SystemExit(f"growmem continual: {e}") from None
    from growmem.config import ConfigError
    from growmem.checkpoint import CheckpointError

    from .runner import run_continual

    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        raise SystemExit(f"growmem continual: --seeds must be comma-separated integers, got {args.seeds!r}") from None
    presets = _csv(args.policy) if args.policy else []
    options = {k: v for k, v in (("n_experiences", args.n_experiences), ("train_limit", args.train_limit),
                                 ("test_limit", args.test_limit)) if v is not None}
    if args.task_labels:
        options["task_labels"] = True
    try:
        run_continual(args.stream, _methods(args), seeds, args.memory_budget, args.online,
                      args.checkpoint_dir, args.resume, growmem=presets[0] if len(presets) == 1 else None,
                      stream_options=options, data_dir=args.data_dir, download=args.download, epochs=args.epochs,
                      growmem_loop=args.loop, checkpoint_every=args.checkpoint_every, out=args.out,
                      progress=not args.no_progress, threads=args.threads)
    except (UnknownNameError, DatasetNotFoundError, InputShapeError, ConfigError, CheckpointError, ValueError) as e:
        raise SystemExit(f"growmem continual: {e}") from None
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="growmem")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    add_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "continual":
        argv = ["continual"] + argv
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
