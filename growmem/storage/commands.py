"""The persistence parts of the ``growmem`` command.

* ``growmem train ... --checkpoint-dir DIR [--checkpoint-every N] [--keep K] [--resume]``
* ``growmem inspect DIR [--step S] [--json]``
* ``growmem export DIR --npz FILE [--step S]``

:func:`add_train_arguments` / :func:`TrainCheckpoints` are used by ``cmd_train`` in
:mod:`growmem.cli`; :func:`add_commands` registers ``inspect`` and ``export``.
"""
from __future__ import annotations

import json
from pathlib import Path


#: ``growmem train`` options that do not change the model or the data: they may differ on --resume
RUN_CONTROL = frozenset({"out", "steps", "eval_every", "test_size", "checkpoint_dir", "checkpoint_every", "keep",
                         "resume"})


def add_train_arguments(p):
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="save Orbax checkpoints (step, params, optimizer and policy state, memories, data position) "
                        "here")
    g.add_argument("--checkpoint-every", type=int, default=None,
                   help="steps between checkpoints (default: --eval-every); the last step is always saved")
    g.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default: 3)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir (the model configuration must match)")


class TrainCheckpoints:
    """Checkpointing for a training loop whose data order is a function of the step.

    >>> ck = TrainCheckpoints(args, trainer, config)    # restores when --resume
    >>> for step in range(ck.start + 1, steps + 1): ...; ck.after_step(step, extra)
    """

    def __init__(self, args, trainer, config: dict, *, every_default: int = 50):
        self.trainer, self.config = trainer, config
        self.ckpt = None
        self.start = 0
        self.extra = None
        self.every = args.checkpoint_every or every_default
        self.last = getattr(args, "steps", None)
        if args.resume and args.checkpoint_dir is None:
            raise SystemExit("growmem train: --resume needs --checkpoint-dir")
        if args.checkpoint_dir is None:
            return
        if self.every <= 0:
            raise SystemExit(f"growmem train: --checkpoint-every must be positive, got {self.every}")
        from .checkpoint import CheckpointError, Checkpointer

        try:
            self.ckpt = Checkpointer(args.checkpoint_dir, keep=args.keep)
            if args.resume:
                if self.ckpt.latest_step() is None:
                    print(f"no checkpoint in {args.checkpoint_dir}: starting from step 0")
                else:
                    r = self.ckpt.restore(trainer, config=config)
                    self.start = r.step
                    self.extra = r.extra
                    print(f"resumed from step {r.step} of {args.checkpoint_dir}")
            elif self.ckpt.latest_step() is not None:
                raise SystemExit(f"growmem train: {args.checkpoint_dir} already holds checkpoints (latest step "
                                 f"{self.ckpt.latest_step()}); pass --resume to continue, or another directory")
        except CheckpointError as e:
            raise SystemExit(f"growmem train: {e}") from None

    def after_step(self, step: int, extra=None, policy=None):
        if self.ckpt is not None and (step % self.every == 0 or step == self.last):
            self.ckpt.save(self.trainer, step, data_position={"step": step}, config=self.config, extra=extra,
                           policy=policy)

    def close(self):
        if self.ckpt is not None:
            self.ckpt.close()


def add_commands(sub):
    p = sub.add_parser("inspect", help="summarise a checkpoint directory",
                       description="Rows per layer, hot/cold split, bytes, policy, step, created-at and format "
                                   "version of a growmem checkpoint (the latest by default).")
    p.add_argument("dir", type=Path, help="checkpoint directory (as given to --checkpoint-dir)")
    p.add_argument("--step", type=int, default=None, help="a specific step (default: latest)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("export", help="write every layer's rows to a plain .npz",
                       description="Rows of every layer as numpy arrays (<layer>/w, /k, /v, /born) plus a JSON "
                                   "description of kernels and temperatures (__description__ in the npz, and "
                                   "FILE.json beside it).")
    p.add_argument("dir", type=Path, help="checkpoint directory")
    p.add_argument("--npz", type=Path, required=True, help="output .npz file")
    p.add_argument("--step", type=int, default=None, help="a specific step (default: latest)")
    p.set_defaults(func=cmd_export)


def cmd_inspect(args) -> int:
    from .checkpoint import CheckpointError, format_inspect, inspect

    try:
        info = inspect(args.dir, args.step)
    except CheckpointError as e:
        raise SystemExit(f"growmem inspect: {e}") from None
    print(json.dumps(info, indent=2) if args.json else format_inspect(info))
    return 0


def cmd_export(args) -> int:
    from .checkpoint import CheckpointError, export

    try:
        desc = export(args.dir, args.npz, args.step)
    except CheckpointError as e:
        raise SystemExit(f"growmem export: {e}") from None
    rows = {k: v["rows"] for k, v in desc["layers"].items()}
    print(f"wrote {args.npz} (step {desc['step']}, rows {rows}) and {args.npz}.json")
    return 0
