"""Spill throughput: retrieval over a TensorStore cold tier under a RAM budget.

One run builds a memory on the tiered backend (``growmem.store.Store`` on ``growmem.backends.tiered.Tiered``) whose
cold tier is several GB (cpu preset: 1M rows × d_in 1024, ≈ 4.2 GB) under a 1 GB
RAM budget, then measures, on the same files:

* the raw sequential read bandwidth of the cold tier's files (plain ``readinto``
  of every chunk file, 16 MiB buffer) — the ceiling the goal is stated against — and,
  with a cold cache, the disk's ``O_DIRECT`` bandwidth with 4 files in flight (what the
  tier's own reads use: no page cache, no copy), reported beside it;
* retrieval of a block of queries (256) over every row, cold chunks streamed with
  read-ahead and merged with the hot rows;
* the same retrieval compute on rows already in RAM (a child process, so its
  memory does not count in this process's peak RSS), as rows per second.

``read_bandwidth_fraction = (cold bytes / retrieval time) / raw read bandwidth``;
the goal is ≥ 0.6 at ≥ 256 queries. Both are measured with a cold page cache when
``/proc/sys/vm/drop_caches`` is writable (root) — the JSON says which — and again
with a warm one. Peak RSS (``VmHWM``) must stay within budget + 1 GB.

The tier is written under ``--workdir`` (default: a fresh directory in /tmp, never
inside the repository) and deleted at the end.

    python benchmarks/spill.py --preset smoke                    # seconds
    python benchmarks/spill.py --preset cpu --workdir /tmp        # ≈ 4.2 GB on disk, minutes
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
from _common import peak_rss_gb, raw_read, raw_read_direct, reset_peak_rss  # noqa: E402
import growmem as gm  # noqa: E402
from growmem.backends import tier_files  # noqa: E402
from growmem.backends.tiered import Tiered, row_bytes  # noqa: E402
from growmem.store import Store  # noqa: E402

NAME = "spill"
GOAL_FRACTION = 0.6
GB = 1 << 30

PRESETS = {
    "smoke": dict(rows=24_576, d_in=128, d_out=16, budget_gb=0.01, chunk_rows=1024, queries=256, append_rows=4096,
                  repeats=1, in_ram_rows=8192, sweep=(16,)),
    # 1.31M rows x (1024 + 16 + 2) x 4 B = 5.5 GB, of which >= 4.3 GB cold under the 1 GB budget
    "cpu": dict(rows=1_310_720, d_in=1024, d_out=16, budget_gb=1.0, chunk_rows=4096, queries=256,
                append_rows=16_384, repeats=2, in_ram_rows=131_072, sweep=(16,)),
    "paper": dict(rows=2_621_440, d_in=1024, d_out=16, budget_gb=1.0, chunk_rows=4096, queries=256,
                  append_rows=16_384, repeats=2, in_ram_rows=131_072, sweep=(16,)),
}


def cached_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


def drop_page_cache() -> bool:
    """Drop the page cache if we may (root); True if the write succeeded."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def cold_files(root: Path):
    """The chunk files of the cold tier, in row order per field."""
    out = []
    for field in ("w", "k", "v", "born"):
        files = [p for p in (root / "gen-0" / field / "c").rglob("*") if p.is_file()]
        files.sort(key=lambda p: tuple(int(x) for x in p.relative_to(root / "gen-0" / field / "c").parts))
        out += files
    return out




IN_RAM_CHILD = r"""
import json, sys, time, numpy as np, jax, jax.numpy as jnp
from growmem import kernels
cfg = json.loads(sys.argv[1])
rs = np.random.default_rng(1)
n, d, e, b = cfg["in_ram_rows"], cfg["d_in"], cfg["d_out"], cfg["queries"]
k = jnp.asarray(rs.standard_normal((n, d), dtype=np.float32)); v = jnp.asarray(rs.standard_normal((n, e), dtype=np.float32))
w = jnp.asarray(rs.random(n, dtype=np.float32)); q = jnp.asarray(rs.standard_normal((b, d), dtype=np.float32))
f = jax.jit(lambda q, k, v, w: kernels.weighted_softmax(q, k, v, w, temperature=1.0, chunk=cfg["chunk_rows"]))
f(q, k, v, w).block_until_ready()
ts = []
for _ in range(3):
    t0 = time.perf_counter(); f(q, k, v, w).block_until_ready(); ts.append(time.perf_counter() - t0)
print(json.dumps({"rows": n, "seconds": sorted(ts)[1]}))
"""


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    p.add_argument("--workdir", type=Path, default=None, help="where to write the cold tier (default: /tmp)")
    p.add_argument("--keep", action="store_true", help="do not delete the cold tier afterwards")
    args = p.parse_args(argv)
    cfg = dict(PRESETS[args.preset])
    base = args.workdir or Path(tempfile.gettempdir())
    repo = Path(__file__).resolve().parent.parent
    work = Path(tempfile.mkdtemp(prefix="growmem-spill-", dir=base))
    if repo in work.resolve().parents:
        shutil.rmtree(work)
        raise SystemExit(f"--workdir must be outside the repository ({repo})")
    budget = int(cfg["budget_gb"] * GB)
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=1.0, chunk=cfg["chunk_rows"])
    n, d, e = cfg["rows"], cfg["d_in"], cfg["d_out"]
    rb = row_bytes(d, e)
    rs = np.random.default_rng(0)
    result = {"preset": args.preset, "config": cfg, "workdir": str(work), "row_bytes": rb}
    t_start = time.perf_counter()
    try:
        tier = Store.create(spec, d, e, name="memory",
                            backend=Tiered(work / "tier", ram_budget_bytes=budget, chunk_rows=cfg["chunk_rows"]))
        # ---- build: append in batches; the budget forces the oldest rows to disk
        t0 = time.perf_counter()
        with tqdm(total=n, desc=f"spill [{args.preset}] write", unit="row", unit_scale=True, file=sys.stderr) as bar:
            for lo in range(0, n, cfg["append_rows"]):
                m = min(cfg["append_rows"], n - lo)
                k = rs.standard_normal((m, d), dtype=np.float32)
                k *= 1.0 / np.sqrt(np.mean(k * k, axis=1, keepdims=True))  # RMS-normalised keys, like the layers
                tier.append(rs.random(m, dtype=np.float32), k, rs.standard_normal((m, e), dtype=np.float32),
                            born=lo // cfg["append_rows"] + 1)
                bar.update(m)
        t_write = time.perf_counter() - t0
        peak_build = peak_rss_gb()
        phase_peaks = reset_peak_rss()   # from here VmHWM measures the reads alone
        result["build"] = {"seconds": t_write, "peak_rss_gb": peak_build,
                           "rows_cold": tier.rows_cold, "rows_hot": tier.rows_hot,
                           "hot_capacity": tier.hot_capacity, "write_gb_per_s": tier.rows_cold * rb / GB / t_write}
        files = cold_files(work / "tier" / "memory")
        cold_bytes = sum(f.stat().st_size for f in files)
        result["cold_bytes"] = cold_bytes
        q = rs.standard_normal((cfg["queries"], d), dtype=np.float32)
        q *= 1.0 / np.sqrt(np.mean(q * q, axis=1, keepdims=True))
        jax.block_until_ready(tier.retrieve(q[:, :]))  # compile (one chunk shape) and warm the code paths
        regimes = {}
        raw_read(files)
        before = cached_gb()
        can_drop = drop_page_cache()
        after = cached_gb() if can_drop else before
        result["page_cache"] = {"drop_caches_writable": can_drop, "cached_gb_before_drop": before,
                                "cached_gb_after_drop": after,
                                "drop_effective": bool(can_drop and before - after > 0.5 * cold_bytes / GB)}
        plan = (["cold_cache"] if can_drop else []) + ["warm_cache"]
        with tqdm(total=len(plan) * cfg["repeats"] * 2, desc=f"spill [{args.preset}] read", file=sys.stderr) as bar:
            for regime in plan:
                raws, rets, directs = [], [], []
                for _ in range(cfg["repeats"]):
                    if regime == "cold_cache":
                        drop_page_cache()
                        nbytes, t_raw = raw_read_direct(files)
                        directs.append(nbytes / t_raw)
                        drop_page_cache()
                    else:
                        raw_read(files)  # make sure the files are cached
                    nbytes, t_raw = raw_read(files)
                    raws.append(nbytes / t_raw)
                    bar.update(1)
                    if regime == "cold_cache":
                        drop_page_cache()
                    t0 = time.perf_counter()
                    jax.block_until_ready(tier.retrieve(q))
                    rets.append(time.perf_counter() - t0)
                    bar.update(1)
                raw_bw = float(np.median(raws))
                t_ret = float(np.median(rets))
                achieved = cold_bytes / t_ret
                regimes[regime] = {"raw_read_gb_per_s": raw_bw / GB, "raw_read_all_gb_per_s": [r / GB for r in raws],
                                   "retrieval_s": t_ret, "retrieval_all_s": rets,
                                   "achieved_gb_per_s": achieved / GB, "fraction": achieved / raw_bw,
                                   "rows_per_s": tier.size / t_ret}
                if directs:
                    direct_bw = float(np.median(directs))
                    regimes[regime].update(raw_direct_read_gb_per_s=direct_bw / GB,
                                           raw_direct_read_all_gb_per_s=[r / GB for r in directs],
                                           fraction_of_direct=achieved / direct_bw)
        result["regimes"] = regimes
        # ---- the same cold retrieval with every chunk read through TensorStore (the read path before local reads)
        if can_drop:
            tier_files.LOCAL_READS = False
            try:
                drop_page_cache()
                t0 = time.perf_counter()
                jax.block_until_ready(tier.retrieve(q))
                t_ts = time.perf_counter() - t0
            finally:
                tier_files.LOCAL_READS = True
            cold = regimes["cold_cache"]
            result["tensorstore_reads"] = {
                "retrieval_s": t_ts, "achieved_gb_per_s": cold_bytes / t_ts / GB,
                "fraction": cold_bytes / t_ts / GB / cold["raw_read_gb_per_s"],
                "local_reads_speedup": t_ts / cold["retrieval_s"]}
        # ---- smaller query blocks: less compute per byte (is the streaming path I/O-bound then?)
        sweep = []
        for b in cfg.get("sweep", ()):
            qb = q[:b]
            jax.block_until_ready(tier.retrieve(qb))
            if can_drop:
                drop_page_cache()
            t0 = time.perf_counter()
            jax.block_until_ready(tier.retrieve(qb))
            t = time.perf_counter() - t0
            main = regimes["cold_cache" if can_drop else "warm_cache"]
            sweep.append({"queries": b, "retrieval_s": t, "achieved_gb_per_s": cold_bytes / t / GB,
                          "fraction": cold_bytes / t / GB / main["raw_read_gb_per_s"]})
        result["query_sweep"] = sweep
        # ---- the same compute on rows already in RAM (child process: its RSS does not count here)
        child = subprocess.run([sys.executable, "-c", IN_RAM_CHILD, json.dumps(cfg)], capture_output=True, text=True,
                               env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if child.returncode == 0:
            ir = json.loads(child.stdout.strip().splitlines()[-1])
            result["in_ram"] = {"rows": ir["rows"], "seconds": ir["seconds"], "rows_per_s": ir["rows"] / ir["seconds"]}
        else:
            result["in_ram"] = {"error": child.stderr[-2000:]}
        result["tier"] = {"rows_cold": tier.rows_cold, "rows_hot": tier.rows_hot, "bytes_cold": tier.rows_cold * rb,
                          "bytes_hot": tier.rows_hot * rb, "read_ahead": tier.backend.read_ahead}
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["deleted_workdir"] = not args.keep and not work.exists()
    peak = max(peak_rss_gb(), result.get("build", {}).get("peak_rss_gb", 0.0))
    peak_reads = peak_rss_gb() if phase_peaks else None
    main_regime = "cold_cache" if "cold_cache" in result["regimes"] else "warm_cache"
    r = result["regimes"][main_regime]
    summary = {
        "read_bandwidth_fraction": r["fraction"],
        "peak_rss_gb": peak,
        # VmHWM of the build (appends and spills) and, reset after it, of the reads alone
        "peak_rss_build_gb": result["build"]["peak_rss_gb"],
        "peak_rss_reads_gb": peak_reads,
        "ram_budget_gb": cfg["budget_gb"],
        "cold_gb": result["cold_bytes"] / GB,
        "regime": main_regime,
        "page_cache_dropped": result["page_cache"]["drop_effective"],
        "raw_read_gb_per_s": r["raw_read_gb_per_s"],
        # the stricter ceiling: the disk read with O_DIRECT, several files in flight (cold cache only)
        "raw_direct_read_gb_per_s": r.get("raw_direct_read_gb_per_s"),
        "fraction_of_direct_read": r.get("fraction_of_direct"),
        "local_reads": tier_files.LOCAL_READS,
        # the same retrieval reading every chunk through TensorStore, in the same run (cold cache only)
        "tensorstore_reads_fraction": result.get("tensorstore_reads", {}).get("fraction"),
        "local_reads_speedup": result.get("tensorstore_reads", {}).get("local_reads_speedup"),
        "achieved_gb_per_s": r["achieved_gb_per_s"],
        "queries": cfg["queries"],
        "warm_cache_fraction": result["regimes"]["warm_cache"]["fraction"],
        "goal_fraction": GOAL_FRACTION,
        "fraction_goal_met": r["fraction"] >= GOAL_FRACTION,
        "rss_goal_met": peak <= cfg["budget_gb"] + 1.0,
        "in_ram_rows_per_s": result["in_ram"].get("rows_per_s"),
        # the fraction an infinitely fast disk path could reach: in-RAM compute speed (bytes of rows/s) / raw read
        "in_ram_ceiling_fraction": (result["in_ram"]["rows_per_s"] * rb / GB / r["raw_read_gb_per_s"]
                                    if "rows_per_s" in result["in_ram"] else None),
        "fraction_by_queries": {str(x["queries"]): x["fraction"] for x in result["query_sweep"]},
        "tier_rows_per_s": r["rows_per_s"],
    }
    result["wall_s"] = time.perf_counter() - t_start
    json_path = _common.write_results(NAME, summary, result, args.out)
    png_path = plot(result, summary, args.out)
    print(f"\nspill [{args.preset}]: {summary['cold_gb']:.2f} GB cold, RAM budget {cfg['budget_gb']} GB, "
          f"{cfg['queries']} queries")
    for name, reg in result["regimes"].items():
        print(f"  {name:<11} raw read {reg['raw_read_gb_per_s']:.2f} GB/s   retrieval {reg['retrieval_s']:.2f} s = "
              f"{reg['achieved_gb_per_s']:.2f} GB/s   ratio achieved/raw = {reg['fraction']:.3f}")
        if "raw_direct_read_gb_per_s" in reg:
            print(f"  {'':<11} O_DIRECT read {reg['raw_direct_read_gb_per_s']:.2f} GB/s   ratio achieved/O_DIRECT = "
                  f"{reg['fraction_of_direct']:.3f}")
    if summary["in_ram_rows_per_s"]:
        print(f"  in-RAM compute {summary['in_ram_rows_per_s']:.3g} rows/s vs tier {summary['tier_rows_per_s']:.3g} "
              f"rows/s (ratio {summary['tier_rows_per_s'] / summary['in_ram_rows_per_s']:.3f}); the in-RAM compute "
              f"alone reaches {summary['in_ram_ceiling_fraction']:.3f} of the raw read bandwidth")
    if "tensorstore_reads" in result:
        ts_ = result["tensorstore_reads"]
        print(f"  through TensorStore: retrieval {ts_['retrieval_s']:.2f} s = {ts_['achieved_gb_per_s']:.2f} GB/s, ratio "
              f"achieved/raw = {ts_['fraction']:.3f}; local reads are {ts_['local_reads_speedup']:.2f}x faster")
    for x in result["query_sweep"]:
        print(f"  {x['queries']:>4} queries: retrieval {x['retrieval_s']:.2f} s = {x['achieved_gb_per_s']:.2f} GB/s, "
              f"ratio achieved/raw = {x['fraction']:.3f}")
    print(f"  read_bandwidth_fraction = {summary['read_bandwidth_fraction']:.3f} ({main_regime}; goal >= "
          f"{GOAL_FRACTION}: {'met' if summary['fraction_goal_met'] else 'NOT met'})")
    print(f"  peak RSS {peak:.2f} GB vs budget {cfg['budget_gb']} GB + 1 GB: "
          f"{'within' if summary['rss_goal_met'] else 'OVER'} (build {summary['peak_rss_build_gb']:.2f} GB, reads "
          f"{'n/a' if peak_reads is None else f'{peak_reads:.2f} GB'})")
    print(f"wrote {json_path} and {png_path}")
    return summary


def plot(result, summary, out_dir):
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = list(result["regimes"])
    x = np.arange(len(names))
    raw = [result["regimes"][n]["raw_read_gb_per_s"] for n in names]
    ach = [result["regimes"][n]["achieved_gb_per_s"] for n in names]
    direct = [result["regimes"][n].get("raw_direct_read_gb_per_s", 0.0) for n in names]
    a1.bar(x - 0.27, raw, 0.27, label="raw sequential read")
    if any(direct):
        a1.bar(x, direct, 0.27, label="O_DIRECT read, 4 in flight")
    a1.bar(x + 0.27, ach, 0.27, label=f"retrieval ({summary['queries']} queries)")
    for i, n in enumerate(names):
        a1.text(x[i] + 0.27, ach[i], f"{result['regimes'][n]['fraction']:.2f}", ha="center", va="bottom", fontsize=8)
    a1.set_xticks(x, names)
    a1.set_ylabel("GB/s")
    a1.set_title(f"{summary['cold_gb']:.2f} GB cold tier", fontsize=9)
    a1.legend(fontsize=8)
    a2.bar([0, 1, 2], [summary["ram_budget_gb"], summary["ram_budget_gb"] + 1.0, summary["peak_rss_gb"]],
           color=["C2", "C7", "C3"])
    a2.set_xticks([0, 1, 2], ["RAM budget", "budget + 1 GB", "peak RSS"])
    a2.set_ylabel("GB")
    a2.set_title("memory", fontsize=9)
    return _common.save_figure(fig, NAME, out_dir)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


if __name__ == "__main__":
    main()
