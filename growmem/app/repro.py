"""``growmem repro``: the paper's experiments (registered by ``growmem/app/cli.py``).

    growmem repro --list                                   every experiment, one line each
    growmem repro NAME --preset smoke|cpu|paper [--out DIR] [--data-dir D] [--download] [--resume]
    growmem repro --table [--out DIR]                      README_TABLE.md from DIR's JSONs
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``repro`` on an ``argparse`` subparsers object (``growmem/app/cli.py``)."""
    from growmem.repro.core import DEFAULT_OUT, PRESETS

    p = subparsers.add_parser(
        "repro", help="run one of the paper's experiments (smoke | cpu | paper preset) and write NAME.json + NAME.png",
        description="Reproduce an experiment of the paper (Sec. 5, App. E-G). `growmem repro --list` lists them; "
                    "smoke runs in seconds on generated data, cpu on MNIST / Fashion-MNIST in minutes to an hour, "
                    "paper uses the paper's own settings (CIFAR, d = 3072) and needs a GPU.")
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="the experiment (see --list)")
    p.add_argument("--preset", default=None, metavar="|".join(PRESETS),
                   help="smoke (seconds), cpu (this machine, minutes to ~1 h) or paper (the paper's settings)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--data-dir", default=None,
                   help="folder holding the datasets (DIR/mnist, DIR/cifar10, ...; else $GROWMEM_DATA, then "
                        "~/.cache/growmem)")
    p.add_argument("--download", action="store_true", help="download a missing dataset into the cache first")
    p.add_argument("--resume", action="store_true",
                   help="reuse the runs a killed invocation of the same preset finished (OUT/NAME.partial.jsonl); "
                        "a long run (teacher-student, multi-epoch's growing nets) goes on from its last checkpoint "
                        "(OUT/NAME.units)")
    p.add_argument("--list", action="store_true", help="list the experiments, one line each")
    p.add_argument("--table", action="store_true",
                   help="write OUT/README_TABLE.md (claim | paper | measured | command) from the JSONs in OUT")
    p.set_defaults(func=cmd_repro)
    return p


def _fail(message: str, code: int = 2) -> int:
    """One line on stderr (``growmem repro: ...``): the last line a script sees names the problem."""
    print(f"growmem repro: {' '.join(str(message).split())}", file=sys.stderr)
    return code


def cmd_repro(args) -> int:
    # OpenBLAS threads spin on a busy machine: a 784x784 Cholesky (Mesa's exact inverse, kernel ridge) took
    # 0.4 s with its default threads under load and 5 ms with one; JAX's own matrix products are unaffected
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from growmem.repro import core, listing, names, run

    if not (args.list or args.table):
        from growmem.runtime import keep_freed_memory
        keep_freed_memory()     # no page faults for the large buffers XLA allocates every step
    if args.list:
        print(listing())
        return 0
    if args.table:
        from growmem.repro.table import write_table
        path, text = write_table(args.out)
        print(text)
        print(f"wrote {path}")
        return 0
    known = f"the experiments are {', '.join(names())} (`growmem repro --list` describes them)"
    if args.name is None:
        return _fail(f"name an experiment (growmem repro NAME --preset smoke|cpu|paper); {known}")
    if args.name not in names():
        return _fail(f"unknown experiment {args.name!r}; {known}")
    if args.preset is None:
        return _fail(f"{args.name} needs --preset, one of {', '.join(core.PRESETS)}")
    if args.preset not in core.PRESETS:
        return _fail(f"unknown preset {args.preset!r}; valid presets: {', '.join(core.PRESETS)}")
    from growmem.data import DatasetError
    from growmem.train import NonFiniteLossError

    extra = [a for a, on in (("--download", args.download), ("--resume", args.resume)) if on]
    try:
        doc = run(args.name, args.preset, out=args.out, data_dir=args.data_dir, download=args.download,
                  resume=args.resume, command=core.command_line(args.name, args.preset, extra))
    except (core.ReproError, DatasetError) as e:
        return _fail(str(e), 2)
    except NonFiniteLossError as e:
        return _fail(f"{args.name} --preset {args.preset}: {e}; nothing was written", 1)
    s = doc["summary"]
    print(f"{args.name} [{args.preset}] in {doc['seconds']:.0f} s over {len(s['seeds'])} seeds: "
          f"{core.verdict({'verdict': s['verdict'], 'n_needed': s.get('n_needed')})}")
    print(f"wrote {doc['paths']['json']} and {doc['paths']['png']}")
    return 0
