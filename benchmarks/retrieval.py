"""Retrieval speed against the bare matrix products, and train-step scaling in N.

Two measurements, both in one run:

1. **Retrieval vs bare products.** For every batch B, dimension d (= d_in = d_out) and
   row count N of the preset, time ``growmem.kernels.weighted_softmax`` and
   ``growmem.kernels.rbf`` (jitted, default chunk) over a memory built with
   ``growmem.memory.from_rows`` whose capacity is the one geometric growth reaches
   (256·2^k ≥ N) and whose ``size`` is N, against the bare jitted products of the same
   shapes, ``(q @ kᵀ) @ v`` on exactly N rows. Calls are interleaved (rotating order,
   the same machine load for all three; at least ``repeats`` rounds, more while the
   config has run less than ``min_time_s``). ``ratio`` is the median over rounds of
   ``t_bare / t_kernel`` timed in the same round (the ratio of the median times is kept
   too, as ``ratio_of_medians_*``); the goal is ``ratio ≥ 0.8`` (retrieval at most
   1.25× the products) for B ≥ 64.
2. **Train-step scaling.** ``growmem.Trainer.step`` time of a residual growing net
   (L=1 weighted-softmax block + weighted-softmax readout by default) with N rows
   preloaded into every memory, for several N (interleaved); the log-log slope of the
   median step time against N should be 1.0 ± 0.15.

Writes ``<out>/retrieval.json`` (``summary.min_ratio_batch_ge_64``,
``summary.step_time_exponent``, ...) and ``<out>/retrieval.png``.

    python benchmarks/retrieval.py --preset smoke      # seconds
    python benchmarks/retrieval.py --preset cpu        # the full grid, minutes
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
import growmem  # noqa: E402
from growmem import kernels, memory  # noqa: E402
from growmem.layers import GrowingSpec, ResidualGrowingNet  # noqa: E402

NAME = "retrieval"
GOAL_RATIO = 0.8        # bare / retrieval at B >= 64
GOAL_EXPONENT = (0.85, 1.15)

PRESETS = {
    "smoke": dict(batches=(16, 64), dims=(64,), sizes=(2000,), repeats=3, min_time_s=0.0, max_repeats=3,
                  step_sizes=(1000, 4000), step_dim=32, step_batch=16, step_blocks=0, step_classes=10,
                  step_repeats=3),
    "cpu": dict(batches=(16, 64, 256), dims=(3072, 784), sizes=(10_000, 50_000), repeats=7, min_time_s=20.0, max_repeats=31,
                step_sizes=(5_000, 10_000, 20_000, 40_000, 80_000), step_dim=784, step_batch=64, step_blocks=1,
                step_classes=10, step_repeats=7),
}
PRESETS["paper"] = dict(PRESETS["cpu"])  # the paper's shapes are the cpu grid; a GPU run may pass larger N

TEMPERATURE = 1.0


def geometric_capacity(n: int, growth: float = 2.0) -> int:
    """The capacity that ``backends.make_room`` reaches when rows arrive a batch at a time."""
    cap = memory.ROW_QUANTUM
    while cap < n:
        cap = memory.round_capacity(math.ceil(cap * growth))
    return cap


def _rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


def random_rows(rng, n, d_in, d_out):
    """Rows like those a weighted-softmax layer grows: RMS-normalised keys, w ≥ 0, small ṽ."""
    k = _rms(rng.standard_normal((n, d_in), np.float32)).astype(np.float32)
    w = rng.uniform(0.0, 1.0, n).astype(np.float32)
    v = (0.1 * rng.standard_normal((n, d_out), np.float32)).astype(np.float32)
    return w, k, v


# --------------------------------------------------------------------------- retrieval vs bare products

@jax.jit
def bare_products(q, k, v):
    """The speed limit: ``(q @ kᵀ) @ v`` on exactly N rows (no exp, no masking, no chunks)."""
    return (q @ k.T) @ v


@jax.jit
def ws_retrieval(q, mem):
    return kernels.weighted_softmax(q, mem.k, mem.v, mem.w, temperature=TEMPERATURE, size=mem.size)


@jax.jit
def rbf_retrieval(q, mem):
    return kernels.rbf(q, mem.k, mem.v, temperature=TEMPERATURE, size=mem.size)


def bench_retrieval(cfg, rng, bar):
    rows = []
    for d in cfg["dims"]:
        for n in cfg["sizes"]:
            w, k, v = random_rows(rng, n, d, d)
            cap = geometric_capacity(n)
            mem = memory.from_rows(w, k, v, capacity=cap)
            k_n, v_n = jnp.asarray(k), jnp.asarray(v)
            del w, k, v
            for b in cfg["batches"]:
                q = jnp.asarray(_rms(rng.standard_normal((b, d), np.float32)).astype(np.float32))
                fns = {"bare": lambda: bare_products(q, k_n, v_n),
                       "weighted_softmax": lambda: ws_retrieval(q, mem),
                       "rbf": lambda: rbf_retrieval(q, mem)}
                ts = _common.time_interleaved(fns, cfg["repeats"], warmup=1, min_time=cfg["min_time_s"],
                                              max_repeats=cfg["max_repeats"])
                med = {name: _common.median(t) for name, t in ts.items()}
                flops = 2 * 2 * b * d * n
                row = dict(B=b, d=d, N=n, capacity=cap, rounds=len(ts["bare"]),
                           t_bare_s=med["bare"], t_weighted_softmax_s=med["weighted_softmax"], t_rbf_s=med["rbf"],
                           # headline ratio: median over rounds of t_bare / t_kernel timed in the same round
                           ratio_weighted_softmax=_common.paired_ratio(ts, "bare", "weighted_softmax"),
                           ratio_rbf=_common.paired_ratio(ts, "bare", "rbf"),
                           ratio_of_medians_weighted_softmax=med["bare"] / med["weighted_softmax"],
                           ratio_of_medians_rbf=med["bare"] / med["rbf"],
                           bare_gflops=flops / med["bare"] / 1e9, times_s=ts)
                rows.append(row)
                bar.update(1)
                bar.write(f"  B={b:4d} d={d:5d} N={n:7d} cap={cap:7d}  bare {med['bare'] * 1e3:9.2f} ms "
                          f"({row['bare_gflops']:6.1f} GFLOP/s)  wsoftmax {med['weighted_softmax'] * 1e3:9.2f} ms "
                          f"ratio {row['ratio_weighted_softmax']:.2f}  rbf {med['rbf'] * 1e3:9.2f} ms "
                          f"ratio {row['ratio_rbf']:.2f}")
            del mem, k_n, v_n
    return rows


# --------------------------------------------------------------------------- train-step scaling

_from_rows = jax.jit(memory.from_rows, static_argnames=("capacity", "spec"))


def _preload(trainer, n, rng):
    """Replace every memory of the trainer with ``n`` random rows at the geometric capacity."""
    from flax.traverse_util import flatten_dict, unflatten_dict
    import flax
    mems = flatten_dict(flax.core.unfreeze(trainer.state.collections["memory"]))
    for path, mem in mems.items():
        if not isinstance(mem, memory.Memory):
            continue
        w, k, v = random_rows(rng, n, mem.d_in, mem.d_out)
        if mem.spec.kernel == "weighted_softmax":
            v = v * w[:, None]
        mems[path] = _from_rows(w, k, v, capacity=geometric_capacity(n), spec=mem.spec)
    collections = {**trainer.state.collections, "memory": unflatten_dict(mems)}
    trainer.state = trainer.state.replace(collections=collections)


def bench_train_step(cfg, rng, bar):
    d, b, sizes = cfg["step_dim"], cfg["step_batch"], cfg["step_sizes"]
    spec = GrowingSpec.make("weighted_softmax", temperature=TEMPERATURE, eta=1.0, beta=1.0)
    model = ResidualGrowingNet(d_out=cfg["step_classes"], n_blocks=cfg["step_blocks"], block=spec, readout=spec)
    x = jnp.asarray(rng.standard_normal((b, d), np.float32))
    y = jnp.asarray(rng.integers(0, cfg["step_classes"], b))
    variables = jax.jit(model.init)(jax.random.key(0), x)  # jitted: much faster than op by op
    # the timed steps restart from one preloaded state, so it must not be donated (consumed)
    tr = growmem.Trainer(model, loss="cross_entropy", variables=variables, donate=False)
    state0, states, after = tr.state, {}, {}
    for n in sizes:
        tr.state = state0
        _preload(tr, n, rng)
        states[n] = tr.state

    def step(n):
        tr.state = states[n]  # every timed step starts from the same N rows
        tr.step(x, y)
        after[n] = tr.state
        return tr.state

    fns = {n: (lambda n=n: step(n)) for n in sizes}
    ts = _common.time_interleaved(fns, cfg["step_repeats"], warmup=1, progress=lambda: bar.update(1))
    med = {n: _common.median(t) for n, t in ts.items()}
    for n in sizes:
        sizes_after = [int(m.size) for m in growmem.train.memories(after[n].collections).values()]
        assert all(s == n + b for s in sizes_after), f"step did not append B rows: {sizes_after}"
    exponent = _common.loglog_slope(list(med), list(med.values()))
    for n in sizes:
        bar.write(f"  train step  N={n:7d}  {med[n] * 1e3:9.2f} ms")
    bar.write(f"  train-step time ∝ N^{exponent:.3f}")
    return dict(model=f"ResidualGrowingNet(n_blocks={cfg['step_blocks']}, weighted_softmax)", d=d, B=b,
                sizes=list(sizes), capacities=[geometric_capacity(n) for n in sizes],
                t_step_s=[med[n] for n in sizes], times_s={str(n): ts[n] for n in sizes}, exponent=exponent)


# --------------------------------------------------------------------------- report

def plot(rows, step, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"B={r['B']}\nd={r['d']}\nN={r['N'] // 1000}k" for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [r["ratio_weighted_softmax"] for r in rows], 0.4, label="weighted softmax")
    ax1.bar(x + 0.2, [r["ratio_rbf"] for r in rows], 0.4, label="rbf")
    ax1.axhline(GOAL_RATIO, color="k", ls="--", lw=1, label=f"goal (B≥64): {GOAL_RATIO}")
    ax1.axhline(1.0, color="gray", ls=":", lw=1)
    ax1.set_xticks(x, labels, fontsize=6)
    ax1.set_ylabel("t(bare q@kᵀ, p@v) / t(retrieval)")
    ax1.set_title("retrieval speed relative to the bare products")
    ax1.legend(fontsize=8)
    n, t = np.asarray(step["sizes"], float), np.asarray(step["t_step_s"], float)
    ax2.loglog(n, t * 1e3, "o-", label="Trainer.step (median)")
    c = np.exp(np.mean(np.log(t) - step["exponent"] * np.log(n)))
    ax2.loglog(n, c * n ** step["exponent"] * 1e3, "--", label=f"fit ∝ N^{step['exponent']:.2f}")
    ax2.loglog(n, t[0] * (n / n[0]) * 1e3, ":", color="gray", label="∝ N")
    ax2.set_xlabel("rows N")
    ax2.set_ylabel("step time (ms)")
    ax2.set_title(f"{step['model']}, d={step['d']}, B={step['B']}", fontsize=9)
    ax2.legend(fontsize=8)
    return _common.save_figure(fig, NAME, out_dir)


def main(argv=None):
    p = _common.parser(__doc__.splitlines()[0], PRESETS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    cfg = PRESETS[args.preset]
    rng = np.random.default_rng(args.seed)
    n_ret = len(cfg["batches"]) * len(cfg["dims"]) * len(cfg["sizes"])
    t0 = time.perf_counter()
    with tqdm(total=n_ret + cfg["step_repeats"], desc=f"retrieval [{args.preset}]", file=sys.stderr) as bar:
        rows = bench_retrieval(cfg, rng, bar)
        step = bench_train_step(cfg, rng, bar)
    big = [r for r in rows if r["B"] >= 64]
    ratios = [r[f"ratio_{k}"] for r in big for k in ("weighted_softmax", "rbf")]
    summary = {
        "min_ratio_batch_ge_64": min(ratios),
        "min_ratio_batch_ge_64_weighted_softmax": min(r["ratio_weighted_softmax"] for r in big),
        "min_ratio_batch_ge_64_rbf": min(r["ratio_rbf"] for r in big),
        "min_ratio_all": min(min(r["ratio_weighted_softmax"], r["ratio_rbf"]) for r in rows),
        "step_time_exponent": step["exponent"],
        "goal_ratio": GOAL_RATIO,
        "goal_exponent": list(GOAL_EXPONENT),
        "ratio_goal_met": min(ratios) >= GOAL_RATIO,
        "exponent_goal_met": GOAL_EXPONENT[0] <= step["exponent"] <= GOAL_EXPONENT[1],
        "default_chunk": kernels.DEFAULT_CHUNK,
    }
    data = {"preset": args.preset, "config": cfg, "seed": args.seed, "wall_s": time.perf_counter() - t0,
            "retrieval": rows, "train_step": step}
    json_path = _common.write_results(NAME, summary, data, args.out)
    png_path = plot(rows, step, args.out)

    print(f"\nratio = t(bare products) / t(retrieval)   [preset {args.preset}]")
    print(f"{'B':>5} {'d':>5} {'N':>7} {'bare ms':>10} {'wsoftmax ms':>12} {'ratio':>6} {'rbf ms':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['B']:5d} {r['d']:5d} {r['N']:7d} {r['t_bare_s'] * 1e3:10.2f} {r['t_weighted_softmax_s'] * 1e3:12.2f} "
              f"{r['ratio_weighted_softmax']:6.2f} {r['t_rbf_s'] * 1e3:10.2f} {r['ratio_rbf']:6.2f}")
    print(f"min ratio at B >= 64: {summary['min_ratio_batch_ge_64']:.3f} (goal >= {GOAL_RATIO}: "
          f"{'met' if summary['ratio_goal_met'] else 'NOT met'})")
    print(f"train-step time exponent: {step['exponent']:.3f} (goal {GOAL_EXPONENT[0]}..{GOAL_EXPONENT[1]}: "
          f"{'met' if summary['exponent_goal_met'] else 'NOT met'})")
    print(f"wrote {json_path} and {png_path}")
    return summary


if __name__ == "__main__":
    main()
