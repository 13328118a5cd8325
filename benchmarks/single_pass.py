"""Single pass over MNIST: where the time of a growing network's step goes, against the bytes it
must read (the memory-bandwidth floor).

The ``weighted_softmax`` preset (L = 2 blocks + readout, d = 784, B = 16, App. G.2 settings)
trains one pass over the training images; every row of every layer is read by the forward pass
and — for the layers whose input depends on a layer below — once more by the backward pass. The
run reports:

* wall time, ms per step against the rows per layer, test accuracy;
* cores used ``(user + sys CPU seconds) / wall``, the system-time fraction and the minor page
  faults per step (``getrusage``: a step that allocates row-sized buffers shows here);
* a breakdown of sampled steps (blocked after each part): the forward + backward program, the
  update program (rule, policy, append) and the host's part (making room, feeding the batch);
* the floor: the bytes those reads take, summed over the pass, at the read bandwidth measured
  in the same process (the larger of a jitted and a numpy stream over 1 GiB); beside it the
  compute floor — the multiply-adds of the same reads (``2·B·(d_in + d_out)`` flops per row
  read) at the fp32 matmul rate measured in the same process — and the roofline floor, the
  larger of the two for each window of steps, summed: at B = 16 a step does 16 multiply-adds per
  4-byte weight, so on a 2-core CPU the compute floor is of the order of the byte floor;
* which kernel path ran (``kernels``: ``native:<instruction set>``, the fused CPU kernel of
  :mod:`growmem.native`, or ``xla``), and the same float32 pass on the XLA path (the ``xla`` run:
  ``GROWMEM_KERNELS=xla``), so both paths are reported by one run on the same machine;
* the same pass with rows stored in bfloat16 (``row_dtype``), the ``gauge`` preset, the
  ``hybrid`` preset (Alg. 4: per-step time, rows, accuracy) and a memory capped at its size
  (``capacity(N, evict_smallest)``) against an unbounded memory holding the same rows, the
  steps of the two interleaved;
* prediction throughput (test images per second) with the full memories.

    python benchmarks/single_pass.py --preset smoke   # seconds (tests/test_single_pass_benchmark.py)
    python benchmarks/single_pass.py --preset cpu     # all 60,000 images, 10,000 test (~1 h on 2 cores)
    python benchmarks/single_pass.py --preset paper   # the same, every run; for a bigger machine

Writes benchmarks/results/single_pass.{json,png}. ``summary``: ``wall_s``, ``accuracy``,
``floor_s``, ``ratio_to_floor``, ``ratio_to_roofline``, ``cores_used``, ``sys_fraction``,
``minor_faults_per_step``, ``kernels`` of the float32 run; ``xla.{wall_s, accuracy,
ratio_to_roofline, native_speedup}``; ``bf16.{wall_s, accuracy, wall_ratio_to_fp32}``,
``gauge.{wall_s, accuracy}``, ``hybrid.{ms_per_step, rows, accuracy}``, ``capped.{ms_per_step,
uncapped_ms_per_step_same_rows}``, ``predict``; every run records its ``kernels`` too.
Timings are ratios measured within one run on a shared machine: read the load average too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
from growmem import config, native  # noqa: E402
from growmem import memory as memlib  # noqa: E402
from growmem.data import mnist  # noqa: E402
from growmem.runtime import exec_with_huge_pages, keep_freed_memory  # noqa: E402
from growmem.train import set_memories  # noqa: E402

NAME = "single_pass"
GB = 1e9
#: the paper's public reference implementation on this machine class: a constant 371 ms/step
#: over its preallocated 60,016-row buffer, ~1,390 s per pass (issue 8; not re-run here)
REFERENCE_WALL_S = 1390.0
#: the hybrid reference (all 60,016 preallocated rows trained by Adam): 2.2–4.2 s/step
REFERENCE_HYBRID_S_PER_STEP = (2.2, 4.2)

PRESETS = {
    "smoke": dict(n_train=640, n_test=200, sample_every=8, cap=256, cap_window=8,
                  runs=("weighted_softmax", "xla", "bf16", "gauge", "hybrid", "capped", "indexed"), bandwidth_mb=64,
                  index=dict(n_lists=8, nprobe=2, train_at=128)),
    # indexed (issue 31): ~4 sqrt(N) lists at the pass's 60,000 rows, a thirtieth of them probed per query
    "cpu": dict(n_train=60_000, n_test=10_000, sample_every=75, cap=4900, cap_window=150,
                runs=("weighted_softmax", "xla", "bf16", "gauge", "hybrid", "capped"), bandwidth_mb=1024,
                index=dict(n_lists=1024, nprobe=32, train_at=16_384)),
    "paper": dict(n_train=60_000, n_test=10_000, sample_every=75, cap=4900, cap_window=300,
                  runs=("weighted_softmax", "xla", "bf16", "gauge", "hybrid", "capped"), bandwidth_mb=2048,
                  index=dict(n_lists=1024, nprobe=32, train_at=16_384)),
}
#: runs a preset may name beyond its default ones (``--runs indexed``)
EXTRA_RUNS = ("indexed",)


# ----------------------------------------------------------------------------- data and bandwidth

def load(cfg, data_dir=None):
    x, y = mnist.load("train", data_dir, limit=cfg["n_train"])
    xt, yt = mnist.load("test", data_dir, limit=cfg["n_test"])
    # RMS-normalised images (‖x‖ = √d), as `growmem train --task mnist`
    x, xt = (np.ascontiguousarray(a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)), np.float32) for a in (x, xt))
    order = np.random.default_rng(0).permutation(len(x))   # one shuffled pass
    return x[order], y[order], xt, yt


def read_bandwidth(mb: int) -> dict:
    """Bytes per second of streaming reads over ``mb`` MiB: a jitted reduction (XLA's threads)
    and numpy's, best of five each."""
    n = (mb << 20) // 4
    a = np.random.default_rng(0).random(n, dtype=np.float32)
    d = jax.device_put(a)
    f = jax.jit(lambda a: jnp.sum(a))
    f(d).block_until_ready()
    out = {}
    for name, fn in (("jax", lambda: f(d).block_until_ready()), ("numpy", lambda: a.sum())):
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = a.nbytes / min(ts)
    out["bytes_per_s"] = max(out["jax"], out["numpy"])
    return out


def matmul_rate(n: int = 1024) -> float:
    """FLOP/s of a jitted fp32 ``n × n × n`` matmul (XLA's threads), best of five: the rate the
    compute floor is taken at (dots at B = 16 reach less of it)."""
    rs = np.random.default_rng(0)
    a, b = (jax.device_put(rs.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        ts.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / min(ts)


def _reads(tr):
    """``(path, rows in use, memory, passes)`` for every layer: the passes that read its rows."""
    mems = tr.memories()
    first = ("block_0",) if ("block_0",) in mems else ("readout",)
    return [(path, int(m.size), m, 1 if path == first else 2) for path, m in mems.items()]


def step_flops(tr, batch: int) -> float:
    """Flops one step must do on those reads: a row read by a pass meets every query of the batch
    in a multiply-add per input and per output entry (``q·k`` and ``s·ṽ`` forward, ``g·ṽ`` and
    ``ds·k`` backward)."""
    return sum(n * 2.0 * batch * (m.d_in + m.d_out) * passes for _, n, m, passes in _reads(tr))


def step_bytes(tr) -> float:
    """Bytes one step must read now: every layer's rows in use (k, ṽ, w at their stored width)
    by the forward pass, and again by the backward pass for layers whose query depends on a
    layer below (all but the first layer of a network whose input is not differentiated)."""
    total = 0.0
    for _, n, m, passes in _reads(tr):
        total += n * (m.k.dtype.itemsize * (m.d_in + m.d_out) + m.w.dtype.itemsize) * passes
    return total


# ----------------------------------------------------------------------------- one pass

@contextlib.contextmanager
def kernels_path(path: str):
    """Run the block on ``path`` (``native`` or ``xla``: ``GROWMEM_KERNELS``, read when a function
    is traced, hence the cleared caches around it)."""
    old = os.environ.get("GROWMEM_KERNELS")
    os.environ["GROWMEM_KERNELS"] = path
    jax.clear_caches()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GROWMEM_KERNELS", None)
        else:
            os.environ["GROWMEM_KERNELS"] = old
        jax.clear_caches()


def kernels_used(tr) -> str:
    """The path the trainer's memories are reduced on now: ``native:<isa>`` or ``xla``."""
    m = next(iter(tr.memories().values()))
    q = jnp.zeros((1, m.d_in), jnp.float32)
    isa = native.isa_for(q, m.k, m.v, m.w)
    return f"native:{isa}" if isa else "xla"


def build(preset_name, d_out, sample, *, bf16=False, policy_extra=None, capacity=None, backend=None):
    pre = config.load(preset_name)
    if bf16:
        pre = dataclasses.replace(pre, block=dataclasses.replace(pre.block, row_dtype="bfloat16"),
                                  readout=dataclasses.replace(pre.readout, row_dtype="bfloat16"))
    if policy_extra is not None:
        pre = dataclasses.replace(pre, policy_entries=tuple(pre.policy_entries) + (policy_extra,))
    if capacity is not None:
        pre = dataclasses.replace(pre, capacity=capacity)
    return pre, pre.trainer(sample, d_out, backend=backend)


def accuracy(tr, xt, yt, batch=1000) -> float:
    pred = np.asarray(tr.predict(xt, batch_size=batch)).argmax(-1)
    return float((pred == yt).mean())


def floors(r, bw):
    """Add the byte, compute and roofline floors of run ``r`` at the rates ``bw`` measured."""
    r["floor_s"] = r["floor_bytes"] / bw["bytes_per_s"]
    r["compute_floor_s"] = r["floor_flops"] / bw["matmul_flops_per_s"]
    r["roofline_floor_s"] = sum(max(w["window_bytes"] / bw["bytes_per_s"], w["window_flops"] / bw["matmul_flops_per_s"])
                                for w in r["records"])
    return r


def single_pass(label, preset_name, data, cfg, *, bf16=False, policy_extra=None, bar=None, backend=None) -> dict:
    """Train one pass; the records of wall time against rows, the sampled breakdown and rusage."""
    x, y, xt, yt = data
    b = config.load(preset_name).settings["batch_size"]
    pre, tr = build(preset_name, 10, x[:b], bf16=bf16, policy_extra=policy_extra, backend=backend)
    used = kernels_used(tr)
    steps = len(x) // b
    compile_s = [0.0]

    def on_compile(event, duration, *a, **k):
        if event.endswith("backend_compile_duration"):
            compile_s[0] += duration

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    records, parts, floor_bytes, floor_flops = [], [], 0.0, 0.0
    prev_bytes, prev_flops = step_bytes(tr), step_flops(tr, b)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    t_prev, s_prev = t0, 0
    for i in range(steps):
        xb, yb = x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]
        sampled = (i + 1) % cfg["sample_every"] == 0 and i > 10
        if sampled:   # one step in parts, each blocked: host / forward+backward / update
            jax.block_until_ready(tr.state)
            ta = time.perf_counter()
            tr.check_batch(xb, yb)
            tr.ensure_capacity(b)
            xj, yj = tr._input(jnp.asarray(xb)), tr._input(jnp.asarray(yb))
            tb = time.perf_counter()
            grads = jax.block_until_ready(tr._grads(tr.state, xj, yj))
            tc = time.perf_counter()
            tr.state, _ = tr._apply(tr.state, grads, b)
            jax.block_until_ready(tr.state)
            td = time.perf_counter()
            for path in tr._bound:
                tr._bound[path] += b
            parts.append({"step": i + 1, "rows": int(sum(tr.rows_in_use().values()) / len(tr._bound)),
                          "host_ms": 1e3 * (tb - ta), "fwd_bwd_ms": 1e3 * (tc - tb), "update_ms": 1e3 * (td - tc)})
        else:
            tr.step(xb, yb)
        if (i + 1) % cfg["sample_every"] == 0 or i + 1 == steps:
            jax.block_until_ready(tr.state)
            now = time.perf_counter()
            rows = tr.rows_in_use()
            cur = step_bytes(tr)   # the floor: trapezoid over the steps of the window (no sync in between)
            cur_flops = step_flops(tr, b)
            floor_bytes += (i + 1 - s_prev) * (prev_bytes + cur) / 2
            floor_flops += (i + 1 - s_prev) * (prev_flops + cur_flops) / 2
            records.append({"step": i + 1, "seconds": now - t0, "rows_per_layer": max(rows.values()),
                            "ms_per_step_window": 1e3 * (now - t_prev) / (i + 1 - s_prev), "step_bytes": cur,
                            "step_flops": cur_flops, "window_steps": i + 1 - s_prev, "window_bytes": (i + 1 - s_prev) * (prev_bytes + cur) / 2,
                            "window_flops": (i + 1 - s_prev) * (prev_flops + cur_flops) / 2})
            prev_bytes, prev_flops = cur, cur_flops
            t_prev, s_prev = now, i + 1
        if bar is not None:
            bar.update(1)
    jax.block_until_ready(tr.state)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    acc = accuracy(tr, xt, yt)
    return {"label": label, "preset": preset_name, "bf16": bf16, "kernels": used, "steps": steps, "batch": b,
            "wall_s": wall,
            "compile_s": compile_s[0], "accuracy": acc, "rows": tr.rows_in_use(), "records": records,
            "parts": parts, "floor_bytes": floor_bytes, "floor_flops": floor_flops,
            "cores_used": (user + sys_) / wall,
            "sys_fraction": sys_ / max(user + sys_, 1e-9), "user_s": user, "sys_s": sys_,
            "minor_faults_per_step": (r1.ru_minflt - r0.ru_minflt) / steps,
            "ms_per_step": 1e3 * wall / steps, "trainer": tr}


def predict_throughput(tr, xt, repeats=3) -> dict:
    tr.predict(xt[:1000], batch_size=1000)   # compiled
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(tr.predict(xt, batch_size=1000))
        ts.append(time.perf_counter() - t0)
    t = float(np.median(ts))
    return {"images": len(xt), "seconds": t, "images_per_s": len(xt) / t,
            "rows_per_layer": max(tr.rows_in_use().values())}


def capped_vs_uncapped(data, cfg, bar=None) -> dict:
    """A memory at its cap (every step evicts) against an unbounded memory of the same rows: the
    capped pass, then both stepped in turn for a window (the unbounded one from the capped
    memory's rows, with room preallocated)."""
    x, y, xt, yt = data
    cap = cfg["cap"]
    cap_entry = ("capacity", (("max_rows", cap), ("on_full", "evict_smallest")))
    res = single_pass("capped", "weighted_softmax", data, cfg, policy_extra=cap_entry, bar=bar)
    capped = res.pop("trainer")
    b = res["batch"]
    w = cfg["cap_window"]
    _, free = build("weighted_softmax", 10, x[:b], capacity=memlib.round_capacity(cap + (w + 2) * b))
    rows = {p: m for p, m in capped.memories().items()}
    grown = {p: memlib.from_rows(*(m.rows()[f] for f in ("w", "k", "v", "born")), spec=m.spec,
                                 capacity=memlib.round_capacity(cap + (w + 2) * b)).replace(t=jnp.asarray(int(m.t)))
             for p, m in rows.items()}
    free.set_state(free.state.replace(collections=set_memories(free.state.collections, grown)))
    times = {"capped": [], "uncapped": []}
    for i in range(w):
        xb, yb = x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]
        for name, tr in ((("capped", capped), ("uncapped", free)) if i % 2 == 0 else
                         (("uncapped", free), ("capped", capped))):
            jax.block_until_ready(tr.state)
            t0 = time.perf_counter()
            tr.step(xb, yb)
            jax.block_until_ready(tr.state)
            times[name].append(time.perf_counter() - t0)
    keep = slice(2, None)   # after the first (compiling) steps
    res.update(window_steps=w, cap=cap, capped_ms_per_step=1e3 * float(np.median(times["capped"][keep])),
               uncapped_ms_per_step_same_rows=1e3 * float(np.median(times["uncapped"][keep])),
               uncapped_rows=[cap, cap + w * b])
    res["ratio"] = res["capped_ms_per_step"] / res["uncapped_ms_per_step_same_rows"]
    return res


# ----------------------------------------------------------------------------- main

def _report(bar, r):
    """One line per finished run (the JSON is written at the end)."""
    keys = [k for k in ("wall_s", "ms_per_step", "accuracy", "rows", "ratio") if isinstance(r.get(k), (int, float))]
    bar.write(f"{r.get('label', 'capped vs uncapped')}: " + ", ".join(f"{k} {r[k]:.4g}" for k in keys))


def plot(runs, summary, out):
    from growmem.reporting import pyplot

    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        rec = r["records"]
        a1.plot([p["rows_per_layer"] for p in rec], [p["ms_per_step_window"] for p in rec], marker=".",
                label=f"{r['label']} ({r['wall_s']:.0f} s, {100 * r['accuracy']:.2f}%)")
    a1.set_xlabel("rows per layer")
    a1.set_ylabel("ms per step (window mean)")
    a1.set_title("single pass over MNIST: step time against rows")
    a1.legend(fontsize=8)
    names = ["floor", "roofline", "weighted_softmax", "fp32 xla", "bf16", "gauge", "reference (reported)"]
    vals = [summary.get("floor_s"), summary.get("roofline_floor_s"), summary.get("wall_s"),
            summary.get("xla", {}).get("wall_s"), summary.get("bf16", {}).get("wall_s"),
            summary.get("gauge", {}).get("wall_s"), REFERENCE_WALL_S]
    colors = dict(zip(names, ["0.6", "0.4", "C0", "C4", "C1", "C2", "C3"]))
    shown = [(n, v) for n, v in zip(names, vals) if v]
    a2.bar([n for n, _ in shown], [v for _, v in shown], color=[colors[n] for n, _ in shown])
    a2.set_ylabel("seconds per pass")
    a2.set_title("wall time against the bandwidth floor")
    for tick in a2.get_xticklabels():
        tick.set_rotation(20)
    fig.tight_layout()
    return _common.save_figure(fig, NAME, out)


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    p.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (else $GROWMEM_DATA/mnist)")
    p.add_argument("--runs", default=None, help="comma-separated subset of the preset's runs")
    p.add_argument("--merge", action="store_true",
                   help="add these runs to an existing single_pass.json of the same preset in --out (the runs "
                        "of another invocation are kept, the ones named here replaced)")
    p.add_argument("--system-malloc", action="store_true",
                   help="leave glibc's malloc as it is (default: growmem.runtime.keep_freed_memory(), as "
                        "growmem train does: freed buffers stay in the process instead of being unmapped)")
    args = p.parse_args(argv)
    if argv is None and not args.system_malloc:
        exec_with_huge_pages()   # re-executes this command line with huge-page backed malloc (glibc)
    malloc = {"applied": False, "reason": "--system-malloc"} if args.system_malloc else keep_freed_memory()
    malloc["huge_pages"] = "glibc.malloc.hugetlb=1" in os.environ.get("GLIBC_TUNABLES", "")
    cfg = PRESETS[args.preset]
    wanted = tuple(args.runs.split(",")) if args.runs else cfg["runs"]
    unknown = sorted(set(wanted) - set(cfg["runs"]) - set(EXTRA_RUNS))
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; this preset's runs are {', '.join(cfg['runs'] + EXTRA_RUNS)}")
    data = load(cfg, args.data_dir)
    x = data[0]
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    bw = read_bandwidth(cfg["bandwidth_mb"])
    bw["matmul_flops_per_s"] = matmul_rate()
    runs, summary = [], {}
    steps16 = len(x) // 16
    total = sum(steps16 * (1 if r != "capped" else 1) for r in wanted)
    with tqdm(total=total, desc=f"single pass [{args.preset}]", unit="step", dynamic_ncols=True) as bar:
        def fp32_pass(label):   # the float32 pass, its prediction throughput and floors
            r = single_pass(label, "weighted_softmax", data, cfg, bar=bar)
            tr = r.pop("trainer")
            r["predict"] = predict_throughput(tr, data[2])
            del tr
            floors(r, bw)
            runs.append(r)
            _report(bar, r)
            return r

        if "weighted_softmax" in wanted:
            r = fp32_pass("weighted_softmax fp32")
            summary.update(wall_s=r["wall_s"], accuracy=r["accuracy"], floor_s=r["floor_s"],
                           ratio_to_floor=r["wall_s"] / r["floor_s"], compute_floor_s=r["compute_floor_s"],
                           roofline_floor_s=r["roofline_floor_s"],
                           ratio_to_roofline=r["wall_s"] / r["roofline_floor_s"], cores_used=r["cores_used"],
                           sys_fraction=r["sys_fraction"], minor_faults_per_step=r["minor_faults_per_step"],
                           compile_s=r["compile_s"], speedup_vs_reference=REFERENCE_WALL_S / r["wall_s"],
                           predict=r["predict"], kernels=r["kernels"])
        if "xla" in wanted:
            with kernels_path("xla"):
                r = fp32_pass("weighted_softmax fp32 xla")
            summary["xla"] = {"wall_s": r["wall_s"], "accuracy": r["accuracy"], "kernels": r["kernels"],
                              "ratio_to_roofline": r["wall_s"] / r["roofline_floor_s"], "predict": r["predict"],
                              "cores_used": r["cores_used"]}
            if "wall_s" in summary:
                summary["xla"]["native_speedup"] = r["wall_s"] / summary["wall_s"]
        if "bf16" in wanted:
            r = single_pass("weighted_softmax bf16 rows", "weighted_softmax", data, cfg, bf16=True, bar=bar)
            r.pop("trainer")
            runs.append(r)
            _report(bar, r)
            summary["bf16"] = {"wall_s": r["wall_s"], "accuracy": r["accuracy"], "floor_s": r["floor_bytes"] /
                               bw["bytes_per_s"], "kernels": r["kernels"]}
            if "wall_s" in summary:
                summary["bf16"]["wall_ratio_to_fp32"] = r["wall_s"] / summary["wall_s"]
        if "gauge" in wanted:
            r = single_pass("gauge", "gauge", data, cfg, bar=bar)
            r.pop("trainer")
            runs.append(r)
            _report(bar, r)
            summary["gauge"] = {"wall_s": r["wall_s"], "accuracy": r["accuracy"]}
        if "hybrid" in wanted:
            r = single_pass("hybrid", "hybrid", data, cfg, bar=bar)
            r.pop("trainer")
            runs.append(r)
            _report(bar, r)
            summary["hybrid"] = {"ms_per_step": r["ms_per_step"], "rows": r["rows"], "accuracy": r["accuracy"],
                                 "speedup_vs_reference_low": REFERENCE_HYBRID_S_PER_STEP[0] * 1e3 / r["ms_per_step"]}
        if "capped" in wanted:
            r = capped_vs_uncapped(data, cfg, bar=bar)
            runs.append(r)
            _report(bar, r)
            summary["capped"] = {"ms_per_step": r["capped_ms_per_step"],
                                 "uncapped_ms_per_step_same_rows": r["uncapped_ms_per_step_same_rows"],
                                 "ratio": r["ratio"], "cap": r["cap"], "accuracy": r["accuracy"]}
        if "indexed" in wanted:
            from growmem.backends.indexed import Indexed
            r = single_pass("weighted_softmax fp32 indexed", "weighted_softmax", data, cfg, bar=bar,
                            backend=Indexed(**cfg["index"]))
            tr = r.pop("trainer")
            # the rows each layer's index holds at the end (0 where it was never trained)
            r["indexed_rows"] = {"/".join(p): int(m.ext["ivf"].counts.sum()) if m.ext and "ivf" in m.ext else 0
                                 for p, m in tr.memories().items()}
            del tr
            runs.append(r)
            _report(bar, r)
            summary["indexed"] = {"wall_s": r["wall_s"], "accuracy": r["accuracy"], "index": cfg["index"],
                                  "kernels": r["kernels"], "indexed_rows": r["indexed_rows"], "rows": r["rows"]}
            if "wall_s" in summary:
                summary["indexed"].update(speedup_vs_exact=summary["wall_s"] / r["wall_s"],
                                          accuracy_minus_exact=r["accuracy"] - summary["accuracy"])
    load_after = os.getloadavg()[0]
    # how malloc ran (growmem.runtime): freed buffers kept in the process, huge-page backed memory
    flags = {"keep_freed_memory": malloc["applied"], "huge_pages": malloc["huge_pages"]}
    for r in runs:
        r.update(flags)
    for k in ("xla", "bf16", "gauge", "hybrid", "capped", "indexed"):
        if k in summary:
            summary[k].update(flags)
    if "weighted_softmax" in wanted:
        summary.update(flags)
    if "weighted_softmax" in wanted or "bf16" in wanted:
        # the bandwidth the floor was computed with, and the load around that run (a --merge of other
        # runs keeps these: they belong to the fp32 run)
        summary["read_bandwidth_gb_per_s"] = bw["bytes_per_s"] / GB
        summary["matmul_gflops_per_s"] = bw["matmul_flops_per_s"] / GB
        summary["load_average_before"] = load_before[0]
        summary["load_average_after"] = load_after
    summary["reference_wall_s_reported"] = REFERENCE_WALL_S
    data_out = {"preset": args.preset, "config": cfg, "bandwidth": bw, "wall_s": time.perf_counter() - t_start,
                "runs": runs, "invocations": [{"runs": list(wanted), "command": " ".join(sys.argv), "malloc": malloc,
                                               "load_average_before": load_before[0], "load_average_after": load_after,
                                               "read_bandwidth_gb_per_s": bw["bytes_per_s"] / GB}]}
    old_path = Path(args.out) / f"{NAME}.json"
    if args.merge and old_path.exists():
        import json
        old = json.loads(old_path.read_text())
        if old.get("preset") != args.preset:
            raise SystemExit(f"--merge: {old_path} holds the {old.get('preset')!r} preset, not {args.preset!r}")
        mine = {r.get("label", "capped") for r in runs}
        data_out["runs"] = [r for r in old.get("runs", []) if r.get("label", "capped") not in mine] + runs
        data_out["invocations"] = old.get("invocations", []) + data_out["invocations"]
        keep = {k: v for k, v in old["summary"].items() if k not in summary}
        summary = {**keep, **summary}
        runs = data_out["runs"]
    json_path = _common.write_results(NAME, summary, data_out, args.out)
    png = plot(runs, summary, args.out)
    if "wall_s" in summary:
        print(f"fp32: {summary['wall_s']:.1f} s, accuracy {summary['accuracy']:.4f}, floor {summary['floor_s']:.1f} s, "
              f"ratio to floor {summary['ratio_to_floor']:.2f} (compute floor {summary.get('compute_floor_s', 0):.1f} s, "
              f"roofline {summary.get('roofline_floor_s', 0):.1f} s: ratio {summary.get('ratio_to_roofline', 0):.2f}), "
              f"{summary['speedup_vs_reference']:.2f}x the reference, "
              f"cores {summary['cores_used']:.2f}, sys {summary['sys_fraction']:.3f}, "
              f"faults/step {summary['minor_faults_per_step']:.0f}, kernels {summary.get('kernels')}")
    if "xla" in summary and "wall_s" in summary:
        x = summary["xla"]
        print(f"fp32 on the XLA path: {x['wall_s']:.1f} s (native {x['native_speedup']:.2f}x faster), accuracy "
              f"{x['accuracy']:.4f}, ratio to roofline {x['ratio_to_roofline']:.2f}")
    if "bf16" in summary and "wall_s" in summary:
        print(f"bf16 rows: {summary['bf16']['wall_s']:.1f} s ({summary['bf16']['wall_ratio_to_fp32']:.2f}x fp32), "
              f"accuracy {summary['bf16']['accuracy']:.4f}")
    if "capped" in summary:
        c = summary["capped"]
        print(f"capped at {c['cap']}: {c['ms_per_step']:.1f} ms/step vs {c['uncapped_ms_per_step_same_rows']:.1f} "
              f"unbounded with the same rows: {c['ratio']:.2f}x")
    print(f"wrote {json_path} and {png}")


if __name__ == "__main__":
    main()
