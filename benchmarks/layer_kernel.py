"""One growing layer's forward + backward on the native CPU kernel and on the XLA path, against
the bare fp32 matmul rate and the read bandwidth measured in the same process.

The layer is a block of the single-pass network (``weighted_softmax``, d_in = d_out = 784, the
gradient with respect to the queries and T only, as for every non-hybrid layer): for each batch B,
row count N and row dtype (float32, bfloat16) the preset names, the jitted forward pass alone and
the forward + backward pass run on both paths (``GROWMEM_KERNELS=native`` and ``xla``), the calls
interleaved (the same machine load for both). Each is reported as

* milliseconds (median over rounds; the minimum beside it),
* GFLOP/s: the multiply-adds the pass must do (``2·B·(d_in + d_out)`` flops per row read, a row read
  once by the forward pass and once more by the backward pass), and their ratio to the fp32 matmul
  rate of a jitted 1024³ product (``matmul_rate`` of single_pass.py, XLA's threads),
* GB/s: the bytes of the rows read (k, ṽ at their stored width, w), and their ratio to the read
  bandwidth (``read_bandwidth``: the faster of a jitted and a numpy stream),
* ``ratio_to_roofline``: the time over the larger of the byte floor and the compute floor,
* ``speedup``: the median over rounds of ``t_xla / t_native`` in the same round.

    python benchmarks/layer_kernel.py --preset smoke   # seconds (tests/test_native_benchmarks.py)
    python benchmarks/layer_kernel.py --preset cpu     # B = 16, 32,768 and 60,016 rows (minutes)

Writes benchmarks/results/layer_kernel.{json,png}. ``summary``: per row dtype at the largest N and
B = 16 (the single pass's step), ``native_ms``, ``xla_ms``, ``speedup``, ``native_ratio_to_roofline``,
``native_matmul_fraction``, ``native_bandwidth_fraction``; ``bf16_over_fp32`` (native, forward +
backward); the rates the floors were taken at and the load average around the run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
from growmem import kernels, native  # noqa: E402
from single_pass import matmul_rate, read_bandwidth  # noqa: E402

NAME = "layer_kernel"
GB = 1e9
D = 784
TEMPERATURE = 1.0
PRESETS = {
    "smoke": dict(sizes=(3000,), batches=(16,), dtypes=("float32", "bfloat16"), repeats=3, bandwidth_mb=64,
                  matmul_n=256),
    "cpu": dict(sizes=(32_768, 60_016), batches=(16,), dtypes=("float32", "bfloat16"), repeats=9,
                bandwidth_mb=1024, matmul_n=1024),
    "paper": dict(sizes=(4_900, 32_768, 60_016), batches=(16, 256), dtypes=("float32", "bfloat16"), repeats=15,
                  bandwidth_mb=2048, matmul_n=1024),
}
PATHS = ("native", "xla")


def layer(b: int, n: int, dtype: str, seed: int = 0):
    """A block's rows as the single pass holds them: RMS-normalised keys and queries, ṽ of the
    gradient's scale, w ≥ 0 (App. G.2 settings)."""
    r = np.random.default_rng(seed)
    rms = lambda x: x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))
    q = jnp.asarray(rms(r.normal(size=(b, D))), jnp.float32)
    k = jnp.asarray(rms(r.normal(size=(n, D))), dtype)
    v = jnp.asarray(0.01 * r.normal(size=(n, D)), dtype)
    w = jnp.asarray(r.uniform(0.0, 0.05, n), jnp.float32)
    return q, k, v, w


def programs(q, k, v, w):
    """``{"fwd": (call, native), "fwd_bwd": ...}`` compiled now, under the path GROWMEM_KERNELS names
    (ahead of time: the path is chosen when a function is traced, and a compiled program keeps it);
    ``native``: whether the program calls the native kernel."""
    def forward(q, k, v, w):
        p = kernels.reduce("weighted_softmax", q, k, v, w, temperature=TEMPERATURE, row_grads=False)
        return kernels.WEIGHTED_SOFTMAX.finish(p)

    def loss(q, k, v, w):
        return jnp.sum(forward(q, k, v, w) ** 2)

    out = {}
    for name, fn in (("fwd", forward), ("fwd_bwd", jax.grad(loss))):
        compiled = jax.jit(fn).lower(q, k, v, w).compile()
        out[name] = ((lambda c=compiled: c(q, k, v, w)), native.FWD_TARGET in compiled.as_text())
    return out


def measure(b, n, dtype, cfg, rates) -> list:
    q, k, v, w = layer(b, n, dtype)
    fns, chosen, calls_native = {}, {}, {}
    for path in PATHS:
        os.environ["GROWMEM_KERNELS"] = path
        jax.clear_caches()
        chosen[path] = native.isa_for(q, k, v, w) or "xla"
        for name, (fn, uses) in programs(q, k, v, w).items():
            _common.block(fn())
            fns[f"{path}:{name}"] = fn
            calls_native[f"{path}:{name}"] = uses
    times = _common.time_interleaved(fns, cfg["repeats"])
    row_bytes = n * (jnp.dtype(dtype).itemsize * 2 * D + 4)
    out = []
    for name, passes in (("fwd", 1), ("fwd_bwd", 2)):
        flops, nbytes = passes * n * 2.0 * b * 2 * D, passes * row_bytes
        floor = max(nbytes / rates["bytes_per_s"], flops / rates["matmul_flops_per_s"])
        rec = {"batch": b, "rows": n, "dtype": dtype, "pass": name, "flops": flops, "bytes": nbytes,
               "floor_s": floor, "speedup": _common.paired_ratio(times, f"xla:{name}", f"native:{name}")}
        for path in PATHS:
            t = _common.median(times[f"{path}:{name}"])
            rec[path] = {"path": chosen[path], "calls_native": calls_native[f"{path}:{name}"], "ms": 1e3 * t, "min_ms": 1e3 * min(times[f"{path}:{name}"]),
                         "gflops_per_s": flops / t / GB, "gb_per_s": nbytes / t / GB,
                         "matmul_fraction": flops / t / rates["matmul_flops_per_s"],
                         "bandwidth_fraction": nbytes / t / rates["bytes_per_s"], "ratio_to_roofline": t / floor}
        out.append(rec)
    os.environ.pop("GROWMEM_KERNELS", None)
    jax.clear_caches()
    return out


def plot(records, summary, out):
    from growmem.reporting import pyplot

    plt = pyplot()
    fb = [r for r in records if r["pass"] == "fwd_bwd"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(fb)), 4.5))
    xs = np.arange(len(fb))
    for i, (path, color) in enumerate((("native", "C0"), ("xla", "C1"))):
        ax.bar(xs + (i - 0.5) * 0.38, [r[path]["ms"] for r in fb], 0.38, color=color, label=f"{path} (forward + backward)")
    ax.scatter(xs, [1e3 * r["floor_s"] for r in fb], color="k", marker="_", s=400, zorder=3,
               label="roofline floor (bytes at the read bandwidth, flops at the matmul rate)")
    ax.set_xticks(xs, [f"B={r['batch']}\n{r['rows']:,} rows\n{r['dtype']}" for r in fb], fontsize=8)
    ax.set_ylabel("ms per call (median)")
    ax.set_title(f"one layer (d = {D}), native vs XLA — matmul {summary['matmul_gflops_per_s']:.0f} GFLOP/s, "
                 f"read {summary['read_bandwidth_gb_per_s']:.1f} GB/s", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _common.save_figure(fig, NAME, out)


def main(argv=None):
    args = _common.parser(__doc__.splitlines()[0], PRESETS).parse_args(argv)
    cfg = PRESETS[args.preset]
    load_before = os.getloadavg()[0]
    rates = read_bandwidth(cfg["bandwidth_mb"])
    rates["matmul_flops_per_s"] = matmul_rate(cfg["matmul_n"])
    grid = [(b, n, dt) for dt in cfg["dtypes"] for n in cfg["sizes"] for b in cfg["batches"]]
    records = []
    for b, n, dt in tqdm(grid, desc=f"layer kernel [{args.preset}]", unit="config", dynamic_ncols=True):
        records.extend(measure(b, n, dt, cfg, rates))
    summary = {"matmul_gflops_per_s": rates["matmul_flops_per_s"] / GB, "read_bandwidth_gb_per_s": rates["bytes_per_s"] / GB,
               "native_isa": native.isas()[0] if native.available() else None,
               "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
    b0 = 16 if 16 in cfg["batches"] else cfg["batches"][0]
    n0 = max(cfg["sizes"])
    for dt in cfg["dtypes"]:
        r = next(r for r in records if (r["batch"], r["rows"], r["dtype"], r["pass"]) == (b0, n0, dt, "fwd_bwd"))
        summary[dt] = {"batch": b0, "rows": n0, "native_ms": r["native"]["ms"], "xla_ms": r["xla"]["ms"],
                       "speedup": r["speedup"], "native_path": r["native"]["path"],
                       "native_ratio_to_roofline": r["native"]["ratio_to_roofline"],
                       "xla_ratio_to_roofline": r["xla"]["ratio_to_roofline"],
                       "native_matmul_fraction": r["native"]["matmul_fraction"],
                       "native_bandwidth_fraction": r["native"]["bandwidth_fraction"]}
    if "float32" in summary and "bfloat16" in summary:
        summary["bf16_over_fp32"] = summary["bfloat16"]["native_ms"] / summary["float32"]["native_ms"]
    json_path = _common.write_results(NAME, summary, {"preset": args.preset, "config": cfg, "rates": rates,
                                                      "records": records}, args.out)
    png = plot(records, summary, args.out)
    for r in records:
        print(f"B={r['batch']} N={r['rows']} {r['dtype']} {r['pass']}: native {r['native']['ms']:.2f} ms "
              f"({r['native']['ratio_to_roofline']:.2f}x roofline), xla {r['xla']['ms']:.2f} ms "
              f"({r['xla']['ratio_to_roofline']:.2f}x), speedup {r['speedup']:.2f}")
    print(f"wrote {json_path} and {png}")


if __name__ == "__main__":
    main()
