"""The persistence parts of the ``growmem`` command.

* ``growmem train ... --checkpoint-dir DIR [--checkpoint-every N] [--keep K] [--resume]``
* ``growmem train ... --ram-budget SIZE [--spill-dir DIR]`` (rows past the budget spill to disk)
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
                         "resume", "spill_dir"})

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"512MB"``, ``"1.5GiB"``, ``"4096"`` -> bytes (binary units: 1 MB = 2^20 B)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 512MB, 1.5GB or 4096 (bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


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
    g = p.add_argument_group("memory larger than RAM")
    g.add_argument("--ram-budget", default=None, metavar="SIZE",
                   help="keep at most SIZE (e.g. 512MB, 2GB) of rows in RAM; older rows spill to TensorStore tiers "
                        "on disk and training still reads them")
    g.add_argument("--spill-dir", type=Path, default=None,
                   help="where the spilled rows go (default: CHECKPOINT_DIR/cold, else OUT/cold)")


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
        spill = getattr(args, "ram_budget", None) is not None
        if args.checkpoint_dir is None:
            if spill:
                self._enable_spill(args, trainer, resume=False)
            return
        if self.every <= 0:
            raise SystemExit(f"growmem train: --checkpoint-every must be positive, got {self.every}")
        from .checkpoint import CheckpointError, Checkpointer

        try:
            self.ckpt = Checkpointer(args.checkpoint_dir, keep=args.keep)
            if args.resume:
                if self.ckpt.latest_step() is None:
                    print(f"no checkpoint in {args.checkpoint_dir}: starting from step 0")
                    if spill:
                        self._enable_spill(args, trainer, resume=False)
                else:
                    if spill:  # reopen the tiers; the restore cuts them back to the checkpoint's rows
                        self._enable_spill(args, trainer, resume=True)
                    r = self.ckpt.restore(trainer, config=config)
                    self.start = r.step
                    self.extra = r.extra
                    print(f"resumed from step {r.step} of {args.checkpoint_dir}")
            elif self.ckpt.latest_step() is not None:
                raise SystemExit(f"growmem train: {args.checkpoint_dir} already holds checkpoints (latest step "
                                 f"{self.ckpt.latest_step()}); pass --resume to continue, or another directory")
            elif spill:
                self._enable_spill(args, trainer, resume=False)
        except CheckpointError as e:
            raise SystemExit(f"growmem train: {e}") from None

    @staticmethod
    def _enable_spill(args, trainer, resume: bool):
        from .tiered import TierError

        try:
            budget = parse_size(args.ram_budget)
        except ValueError as e:
            raise SystemExit(f"growmem train: --ram-budget: {e}") from None
        where = args.spill_dir or (Path(args.checkpoint_dir) / "cold" if args.checkpoint_dir is not None
                                   else Path(args.out) / "cold")
        if resume and not Path(where).exists():
            raise SystemExit(f"growmem train: --resume: the spilled rows of this run are not at {where}; pass the "
                             f"--spill-dir the run used")
        try:
            trainer.enable_spill(where, ram_budget_bytes=budget, resume=resume, overwrite=not resume)
        except (TierError, ValueError) as e:
            raise SystemExit(f"growmem train: --ram-budget: {e}") from None
        print(f"rows past {args.ram_budget} spill to {where} "
              f"({trainer.spill.hot_rows} hot rows per layer, chunks of {trainer.spill.chunk_rows})")

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
