"""``growmem data``: where the datasets are, fetch them, check them (thin over :mod:`growmem.data.datasets`).

    growmem data list [--dir DIR] [--json]        each dataset: where it is (or would go), its size
    growmem data download NAME [--dir DIR]        fetch NAME through its mirrors, checksummed and resumable
    growmem data verify [NAME ...] [--dir DIR]    check the files on this machine against their checksums
"""
from __future__ import annotations

import json
from pathlib import Path

from growmem.app.options import _finite
from growmem.data import datasets


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="list, download and verify the datasets (MNIST, Fashion-MNIST, CIFAR)",
                       description="Where each dataset is on this machine (or where a download would put it), "
                                   "fetch one through its mirrors (checksummed; a broken transfer resumes on the "
                                   "next call), or verify the files against their checksums.")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION")
    dirs = dict(type=Path, default=None, metavar="DIR",
                help="look in / download into DIR/NAME (default: $GROWMEM_DATA/NAME, else ~/.cache/growmem/NAME)")
    q = dsub.add_parser("list", help="each dataset, where it was found or where it would go, its size")
    q.add_argument("--dir", **dirs)
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.set_defaults(func=cmd_list)
    q = dsub.add_parser("download", help="fetch a dataset (checksummed, resumable)")
    q.add_argument("name", choices=datasets.names(), metavar="NAME", help=f"one of {', '.join(datasets.names())}")
    q.add_argument("--dir", **dirs)
    q.add_argument("--mirror", action="append", default=None, metavar="URL",
                   help="a base URL to fetch from instead of the dataset's mirrors (repeatable)")
    q.add_argument("--timeout", type=_finite(0, lo_open=True, what="a number of seconds > 0"),
                   default=datasets.TIMEOUT, metavar="SECONDS",
                   help=f"give up on a mirror that sends nothing for this long and try the next "
                        f"(default {datasets.TIMEOUT:g})")
    q.set_defaults(func=cmd_download)
    q = dsub.add_parser("verify", help="check the files on this machine against their checksums")
    q.add_argument("names", nargs="*", metavar="NAME", help="datasets to check (default: every one found)")
    q.add_argument("--dir", **dirs)
    q.set_defaults(func=cmd_verify)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p) -> int:
    from growmem.errors import UsageError
    raise UsageError(f"choose an action: list, download or verify (see `{p.prog} --help`)")


def cmd_list(args) -> int:
    rows = [datasets.status(n, args.dir) for n in datasets.names()]
    if args.json:
        print(json.dumps([{"name": r.name, "found": None if r.found is None else str(r.found),
                           "target": str(r.target), "bytes_on_disk": r.bytes_on_disk,
                           "download_bytes": r.download_bytes, "partial_bytes": r.partial_bytes,
                           "checksums": r.checksums} for r in rows], indent=2))
        return 0
    width = max(len(r.name) for r in rows)
    for r in rows:
        if r.found is not None:
            where = f"found in {r.found}  {_mb(r.bytes_on_disk)}"
        else:
            where = f"not here; would go to {r.target}  ({_mb(r.download_bytes)} to download" + \
                    (f", {_mb(r.partial_bytes)} of a broken transfer kept" if r.partial_bytes else "") + \
                    f": growmem data download {r.name})"
        note = "" if r.checksums == "pinned" else f"  [checksums from {r.checksums}]"
        print(f"{r.name:{width}s}  {where}{note}")
    return 0


def cmd_download(args) -> int:
    if args.dir is not None:
        from growmem.errors import UsageError
        clash = next((p for p in (args.dir, *args.dir.parents) if p.exists() and not p.is_dir()), None)
        if clash is not None:
            raise UsageError(f"--dir {args.dir}: {clash} is a file, not a folder; pass a folder (it is made if "
                             f"missing), e.g. --dir {clash.parent / 'data'}")
        args.dir.mkdir(parents=True, exist_ok=True)
    st = datasets.status(args.name, args.dir)
    if st.found is not None and all(bad is None for _, bad in datasets.verify(args.name, args.dir)):
        print(f"{args.name}: already in {st.found} (checksums verified); nothing downloaded")
        return 0
    folder = datasets.download(args.name, st.target, mirrors=args.mirror, resume=True, timeout=args.timeout)
    bad = [(p, why) for p, why in datasets.verify(args.name, args.dir) if why is not None]
    if bad:  # a damaged file found elsewhere first, say
        from growmem.errors import RunError
        raise RunError(f"{args.name}: {bad[0][0]}: {bad[0][1]}; delete it and run `growmem data download "
                       f"{args.name}` again")
    print(f"{args.name}: downloaded into {folder} (checksums verified)")
    return 0


def cmd_verify(args) -> int:
    names = args.names or [n for n in datasets.names() if datasets.status(n, args.dir).found is not None]
    unknown = [n for n in names if n not in datasets.names()]
    if unknown:
        from growmem.errors import UsageError
        raise UsageError(f"unknown dataset {unknown[0]!r}; choose from {', '.join(datasets.names())}")
    if not names:
        print("no dataset found on this machine (`growmem data list` says where they would go; "
              "`growmem data download NAME` fetches one)")
        return 0
    failed = 0
    for n in names:
        for path, why in datasets.verify(n, args.dir):
            print(f"{n}: {path}: {'ok' if why is None else why}")
            failed += why is not None
    if failed:
        from growmem.errors import RunError
        raise RunError(f"{failed} file(s) failed verification: delete them and run `growmem data download NAME`")
    return 0
