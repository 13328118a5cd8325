"""Checkpoint cost: Orbax save/restore time against plain numpy on the same bytes.

For several memory sizes, a ``TrainState`` holding one growing layer's memory
(N rows, d_in = 256, d_out = 16) is saved with
``growmem.checkpoint.Checkpointer`` (Orbax, atomic, with CRC32 of every
array) and restored into a template state; the baseline writes and reads the
same arrays (``w``, ``k``, ``v``, ``born`` of the rows in use) with ``np.save`` /
``np.load`` into a new folder per save, deleting the one from two saves before (the file
lifecycle of a manager keeping 2 checkpoints: new files meet the kernel's dirty-page write-back
throttling, files overwritten in place do not). Runs are interleaved (rotating order) and the
median is kept.

``save_ratio_vs_numpy = t_save / t_numpy_save`` (1.0 = as fast as numpy; lower is
better), ``restore_ratio_vs_numpy`` likewise, both at the largest size.

    python benchmarks/checkpoint.py --preset smoke
    python benchmarks/checkpoint.py --preset cpu
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
import growmem as gm  # noqa: E402
from growmem import memory as memlib  # noqa: E402
from growmem.checkpoint import Checkpointer  # noqa: E402
from growmem.train import TrainState  # noqa: E402

NAME = "checkpoint"
MB = 1 << 20

PRESETS = {
    "smoke": dict(sizes=(4096, 16384), d_in=64, d_out=16, repeats=2),
    "cpu": dict(sizes=(16_384, 65_536, 262_144, 524_288), d_in=256, d_out=16, repeats=5),
    "paper": dict(sizes=(65_536, 262_144, 1_048_576, 2_097_152), d_in=256, d_out=16, repeats=3),
}


def make_state(n, d, e, seed=0):
    rs = np.random.default_rng(seed)
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0)
    mem = memlib.from_rows(rs.random(n, dtype=np.float32), rs.standard_normal((n, d), dtype=np.float32),
                           rs.standard_normal((n, e), dtype=np.float32), np.arange(n) // 64, spec=spec)
    return TrainState(step=jnp.asarray(n // 64, jnp.int32), params={}, opt_state=None,
                      collections={"memory": {"readout": {"rows": mem}}})


def bench_size(n, cfg, work: Path, bar):
    state = make_state(n, cfg["d_in"], cfg["d_out"])
    template = make_state(0, cfg["d_in"], cfg["d_out"])
    mem = state.collections["memory"]["readout"]["rows"]
    arrays = {f: np.asarray(getattr(mem, f)[:n]) for f in ("w", "k", "v", "born")}
    nbytes = sum(a.nbytes for a in arrays.values())
    ck_dir, np_dir = work / f"ck{n}", work / f"np{n}"
    np_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(ck_dir, keep=2)
    step = [0]

    def save_orbax():
        step[0] += 1
        ckpt.save(state, step[0])

    def restore_orbax():
        r = ckpt.restore(template)
        jax.block_until_ready(r.state)

    np_step = [0]

    def save_numpy():
        # the same file lifecycle as a checkpoint manager keeping 2: a new folder per save, the one
        # from two saves before deleted (overwriting one file in place would free its dirty pages
        # and never meet the kernel's write-back throttling that new files meet)
        np_step[0] += 1
        d = np_dir / str(np_step[0])
        d.mkdir()
        for f, a in arrays.items():
            with open(d / f"{f}.npy", "wb") as fh:
                np.save(fh, a)
                fh.flush()
                os.fsync(fh.fileno())     # durable, as the checkpoint's arrays are
        shutil.rmtree(np_dir / str(np_step[0] - 2), ignore_errors=True)

    def restore_numpy():
        d = np_dir / str(np_step[0])
        out = {f: np.load(d / f"{f}.npy") for f in arrays}
        jax.block_until_ready({f: jnp.asarray(a) for f, a in out.items()})  # same end point: arrays on device

    times = _common.time_interleaved({"save_orbax": save_orbax, "save_numpy": save_numpy}, cfg["repeats"])
    times.update(_common.time_interleaved({"restore_orbax": restore_orbax, "restore_numpy": restore_numpy},
                                          cfg["repeats"]))
    # the restored state equals the saved one
    back = ckpt.restore(template).state.collections["memory"]["readout"]["rows"]
    assert all(np.array_equal(np.asarray(getattr(back, f)[:n]), arrays[f]) for f in arrays)
    disk = sum(p.stat().st_size for p in ck_dir.rglob("*") if p.is_file()) / max(1, len(ckpt.all_steps()))
    ckpt.close()
    shutil.rmtree(ck_dir, ignore_errors=True)
    shutil.rmtree(np_dir, ignore_errors=True)
    bar.update(1)
    med = {k: _common.median(v) for k, v in times.items()}
    return {"rows": n, "bytes": nbytes, "checkpoint_bytes_on_disk": disk, **{f"t_{k}_s": v for k, v in med.items()},
            "save_ratio_vs_numpy": med["save_orbax"] / med["save_numpy"],
            "restore_ratio_vs_numpy": med["restore_orbax"] / med["restore_numpy"],
            "save_mb_per_s": nbytes / MB / med["save_orbax"], "restore_mb_per_s": nbytes / MB / med["restore_orbax"],
            "all_times_s": times}


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    p.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: /tmp)")
    args = p.parse_args(argv)
    cfg = PRESETS[args.preset]
    work = Path(tempfile.mkdtemp(prefix="growmem-ckpt-bench-", dir=args.workdir))
    t0 = time.perf_counter()
    try:
        with tqdm(total=len(cfg["sizes"]), desc=f"checkpoint [{args.preset}]", file=sys.stderr) as bar:
            rows = [bench_size(n, cfg, work, bar) for n in cfg["sizes"]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    big = rows[-1]
    summary = {
        "save_ratio_vs_numpy": big["save_ratio_vs_numpy"],
        "restore_ratio_vs_numpy": big["restore_ratio_vs_numpy"],
        "at_rows": big["rows"],
        "at_mb": big["bytes"] / MB,
        "save_mb_per_s": big["save_mb_per_s"],
        "restore_mb_per_s": big["restore_mb_per_s"],
        "save_time_exponent": _common.loglog_slope([r["bytes"] for r in rows], [r["t_save_orbax_s"] for r in rows]),
        "restore_time_exponent": _common.loglog_slope([r["bytes"] for r in rows],
                                                      [r["t_restore_orbax_s"] for r in rows]),
    }
    data = {"preset": args.preset, "config": cfg, "wall_s": time.perf_counter() - t0, "sizes": rows}
    json_path = _common.write_results(NAME, summary, data, args.out)
    png_path = plot(rows, args.out)
    print(f"\ncheckpoint [{args.preset}]: ratio = t(growmem/Orbax) / t(np.save | np.load) on the same arrays")
    print(f"{'rows':>9} {'MB':>8} {'save s':>8} {'numpy s':>8} {'ratio':>6} {'restore s':>10} {'numpy s':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['rows']:9d} {r['bytes'] / MB:8.1f} {r['t_save_orbax_s']:8.3f} {r['t_save_numpy_s']:8.3f} "
              f"{r['save_ratio_vs_numpy']:6.2f} {r['t_restore_orbax_s']:10.3f} {r['t_restore_numpy_s']:8.3f} "
              f"{r['restore_ratio_vs_numpy']:6.2f}")
    print(f"save_ratio_vs_numpy = {summary['save_ratio_vs_numpy']:.2f}, restore_ratio_vs_numpy = "
          f"{summary['restore_ratio_vs_numpy']:.2f} (at {big['rows']} rows, {summary['at_mb']:.0f} MB)")
    print(f"wrote {json_path} and {png_path}")
    return summary


def plot(rows, out_dir):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = [r["bytes"] / MB for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("t_save_orbax_s", "save (growmem/Orbax)", "o-"), ("t_save_numpy_s", "np.save", "o--"),
                              ("t_restore_orbax_s", "restore (growmem/Orbax)", "s-"),
                              ("t_restore_numpy_s", "np.load", "s--")):
        ax.loglog(mb, [r[key] for r in rows], style, label=label)
    ax.set_xticks(mb, [f"{m:.0f}" for m in mb])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("memory size (MB)")
    ax.set_ylabel("seconds")
    ax.set_title("checkpoint cost vs memory size", fontsize=9)
    ax.legend(fontsize=8)
    return _common.save_figure(fig, NAME, out_dir)


if __name__ == "__main__":
    main()
