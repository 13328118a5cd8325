"""Sharded scaling: retrieval time with 1, 2, 4 forced host devices on the same rows.

Each device count runs in its own process (``XLA_FLAGS=--xla_force_host_platform_
device_count=S`` must be set before JAX starts). The memory (N rows) is sharded
along rows with a ``growmem.store.Store`` on the ``Sharded`` backend and retrieved through
``shard_map`` + the log-sum-exp merge; the same process also times the unsharded
kernel on the same rows. On a machine with few cores the forced devices share
them, so no speedup is expected: the figure is the *overhead* of the sharded path.

``overhead_ratio = t(sharded, S = max) / t(unsharded)`` (1.0 = free).

    python benchmarks/sharded.py --preset smoke
    python benchmarks/sharded.py --preset cpu
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402

NAME = "sharded"

PRESETS = {
    "smoke": dict(devices=(1, 2, 4), rows=16_384, d_in=64, d_out=16, queries=64, repeats=3),
    "cpu": dict(devices=(1, 2, 4), rows=262_144, d_in=256, d_out=16, queries=256, repeats=7),
    "paper": dict(devices=(1, 2, 4), rows=1_048_576, d_in=256, d_out=16, queries=256, repeats=7),
}

CHILD = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1]); S = int(sys.argv[2])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={S}"
sys.path.insert(0, sys.argv[3])
import jax, jax.numpy as jnp, numpy as np
import _common
import growmem as gm
from growmem import memory as memlib
from growmem.layers import retrieve
from growmem.backends.sharded import Sharded, row_mesh
from growmem.store import Store
assert len(jax.devices()) == S
rs = np.random.default_rng(0)
n, d, e, b = cfg["rows"], cfg["d_in"], cfg["d_out"], cfg["queries"]
spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0)
mem = memlib.from_rows(rs.random(n, dtype=np.float32), rs.standard_normal((n, d), dtype=np.float32),
                       rs.standard_normal((n, e), dtype=np.float32), spec=spec)
sm = Store.from_memory(mem, Sharded(row_mesh(S)))
q = rs.standard_normal((b, d), dtype=np.float32)
qs = sm.backend.place(q)
unsharded = jax.jit(lambda m, q: retrieve(m, q))
ref = np.asarray(unsharded(mem, q)); out = np.asarray(sm.retrieve(qs))
err = float(np.abs(out - ref).max())
times = _common.time_interleaved({"sharded": lambda: sm.retrieve(qs), "unsharded": lambda: unsharded(mem, q)},
                                 cfg["repeats"])
print(json.dumps({"devices": S, "max_abs_err": err, "times": times,
                  "t_sharded_s": _common.median(times["sharded"]), "t_unsharded_s": _common.median(times["unsharded"])}))
"""


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    args = p.parse_args(argv)
    cfg = PRESETS[args.preset]
    here = str(Path(__file__).resolve().parent)
    t0 = time.perf_counter()
    rows = []
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    with tqdm(total=len(cfg["devices"]), desc=f"sharded [{args.preset}]", file=sys.stderr) as bar:
        for s in cfg["devices"]:
            r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), str(s), here], capture_output=True,
                               text=True, env=env)
            if r.returncode != 0:
                raise SystemExit(f"device count {s} failed:\n{r.stderr[-3000:]}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            bar.update(1)
    base = next(r for r in rows if r["devices"] == 1)
    for r in rows:
        r["ratio_vs_unsharded"] = r["t_sharded_s"] / r["t_unsharded_s"]
        r["ratio_vs_one_device"] = r["t_sharded_s"] / base["t_sharded_s"]
    top = rows[-1]
    summary = {
        "overhead_ratio": top["ratio_vs_unsharded"],
        "devices": top["devices"],
        "overhead_ratio_vs_one_device": top["ratio_vs_one_device"],
        "overhead_ratio_one_device_vs_unsharded": base["ratio_vs_unsharded"],
        "max_abs_err": max(r["max_abs_err"] for r in rows),
        "cpu_count": os.cpu_count(),
    }
    data = {"preset": args.preset, "config": cfg, "wall_s": time.perf_counter() - t0, "runs": rows}
    json_path = _common.write_results(NAME, summary, data, args.out)
    png_path = plot(rows, cfg, args.out)
    print(f"\nsharded [{args.preset}]: N={cfg['rows']} rows, d={cfg['d_in']}, B={cfg['queries']}, "
          f"{os.cpu_count()} CPU cores")
    print(f"{'devices':>8} {'sharded ms':>11} {'unsharded ms':>13} {'ratio':>6} {'vs 1 dev':>9} {'max err':>9}")
    for r in rows:
        print(f"{r['devices']:8d} {r['t_sharded_s'] * 1e3:11.2f} {r['t_unsharded_s'] * 1e3:13.2f} "
              f"{r['ratio_vs_unsharded']:6.2f} {r['ratio_vs_one_device']:9.2f} {r['max_abs_err']:9.2e}")
    print(f"overhead_ratio = t(sharded, {top['devices']} devices) / t(unsharded) = {summary['overhead_ratio']:.2f}")
    print(f"wrote {json_path} and {png_path}")
    return summary


def plot(rows, cfg, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    s = [r["devices"] for r in rows]
    ax.plot(s, [r["t_sharded_s"] * 1e3 for r in rows], "o-", label="sharded (shard_map + log-sum-exp merge)")
    ax.plot(s, [r["t_unsharded_s"] * 1e3 for r in rows], "s--", label="unsharded kernel")
    ax.set_xticks(s)
    ax.set_xlabel("forced host devices")
    ax.set_ylabel("retrieval ms (median)")
    ax.set_title(f"N={cfg['rows']}, d={cfg['d_in']}, B={cfg['queries']}, {os.cpu_count()} cores", fontsize=9)
    ax.legend(fontsize=8)
    return _common.save_figure(fig, NAME, out_dir)


if __name__ == "__main__":
    main()
