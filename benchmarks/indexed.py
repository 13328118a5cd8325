"""Indexed against exact retrieval: one layer step's time, error and recall as the rows grow.

For each row count N the preset names, a weighted-softmax memory of N rows (keys from a mixture of
Gaussian clusters in d dimensions, ṽ of d_out, w > 0) is indexed by :mod:`growmem.index` (k-means++ and
Lloyd's centroids on a sample, ``n_lists ≈ lists_per_sqrt_n · √N`` lists as long as the fullest nearest
assignment, an overflow list of ``overflow`` slots that every query reads), and a
layer step — the forward pass and the gradient with respect to the queries and T, as for every layer
whose rows are not trained — runs exact (:func:`growmem.kernels.reduce`, the native kernel where
available) and indexed at each ``nprobe`` — per query (each query gathers its own lists' rows) and shared
(the union of the batch's lists gathered once and reduced by the exact kernel: every query meets every
slot) — the calls interleaved (the same load for both). Reported
per N and nprobe: milliseconds (median), the speed-up (paired per round), the relative error of the
output and of ∂/∂q against the exact step on the same state at each temperature of the preset (the
smaller T, the sharper the kernel and the more of its weight the nearest lists hold; the step's time
does not depend on T), recall@10 of the probed lists against the exact top rows, the rows a query
reads, and the build time.

    python benchmarks/indexed.py --preset smoke   # seconds (tests/test_index.py)
    python benchmarks/indexed.py --preset cpu     # N = 10^4, 10^5, 10^6; d = 100, B = 16 (minutes)

Writes benchmarks/results/indexed.{json,png}; ``summary`` holds, at the largest N, each nprobe's
speed-up, errors and recall, and the load average around the run.

``--part training`` trains instead: the teacher-student growing weighted softmax (App. F.1.2, one row a
sample; the T, η, β, μ ``growmem repro teacher-student`` chose) on fresh teacher samples up to ``rows``
rows with its rows read through an :class:`~growmem.backends.indexed.Indexed` backend, and the same model,
seed and samples read exactly (the RAM backend) up to ``exact_rows``; at each checkpoint the test MSE over
the targets' variance and the seconds of training so far; after the indexed run, the share of the exact
kernel's weight its probe reads (:func:`growmem.index.weight_read` over test queries: how local the kernel is
at that T). Writes ``indexed_training.{json,png}``: ``summary`` holds, per seed, the indexed run's rows, wall
time and weight read, and both runs' test loss at the largest checkpoint the exact run reached.

    python benchmarks/indexed.py --part training --preset cpu --seeds 0   # 10^7 rows (an hour or more)
"""
from __future__ import annotations

import functools
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common  # noqa: E402
from growmem import index as ivf  # noqa: E402
from growmem import kernels  # noqa: E402

NAME = "indexed"
KERNEL = "weighted_softmax"
PRESETS = {
    "smoke": dict(sizes=(2_000, 6_000), d=16, d_out=4, batch=4, clusters=64, nprobe=(2, 8), lists_per_sqrt_n=2.0,
                  temperatures=(0.05, 0.5), repeats=2, queries=32, sample_per_list=64, overflow=256),
    # overflow: 128 slots (none is taken at these sizes; 1,024 were a sixth of what a query read at 10^6 rows,
    # nprobe 4)
    "cpu": dict(sizes=(10_000, 100_000, 1_000_000), d=100, d_out=10, batch=16, clusters=4096, nprobe=(1, 2, 4, 16),
                lists_per_sqrt_n=4.0, temperatures=(0.02, 0.1, 0.5), repeats=7, queries=256, sample_per_list=64,
                overflow=128),
}
PRESETS["paper"] = dict(PRESETS["cpu"], sizes=(10_000, 100_000, 1_000_000, 10_000_000))
#: per_query: each query gathers the rows of its own lists; shared: the batch reads the union of its lists once
MODES = ("per_query", "shared")

#: ``--part training``: the teacher-student GWS of ``growmem repro teacher-student`` (T, η, β, μ: its selection on
#: 64,000 samples, benchmarks/results/repro/teacher-student.json), rows read through ``n_lists`` lists, ``nprobe``
#: probed per query (the lists trained at ``train_at`` rows); the exact run up to ``exact_rows`` (its step reads
#: every row, a step's cost grows with the rows: hours a seed to 2 M rows here, so it stops well before the
#: indexed run)
TRAINING = {
    "smoke": dict(rows=4_096, exact_rows=2_048, batch=64, checkpoints=(1_024, 2_048, 4_096), n_lists=8, nprobe=2,
                  train_at=512, shared=False, test_size=256, seeds=(0,),
                  gws=dict(temperature=1.0, eta=10.0, beta=1.0, momentum=0.6)),
    "cpu": dict(rows=10_240_000, exact_rows=512_000, batch=64,
                checkpoints=(64_000, 128_000, 256_000, 512_000, 1_024_000, 2_048_000, 5_120_000, 10_240_000),
                n_lists=16_384, nprobe=2, train_at=65_536, shared=False, test_size=4096, seeds=(0, 1, 2),
                gws=dict(temperature=1.0, eta=10.0, beta=1.0, momentum=0.6)),
}
TRAINING["paper"] = dict(TRAINING["cpu"], rows=12_800_000, exact_rows=12_800_000,
                         checkpoints=(64_000, 256_000, 1_024_000, 4_096_000, 12_800_000), seeds=(0, 1, 2, 3, 4))


def rows(n: int, cfg: dict, seed: int = 0):
    """``(k, v, w, centres)``: keys from ``clusters`` Gaussian clusters (unit spread around centres of
    coordinates N(0, 9)), RMS-normalised as a layer's keys are; ṽ ~ N(0, 1); w ~ U(0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(cfg["clusters"], cfg["d"])).astype(np.float32) * 3.0
    k = _near(centres, n, rng)
    v = rng.normal(size=(n, cfg["d_out"])).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    return k, v, w, centres


def _near(centres, m: int, rng):
    """``m`` points of the clusters (unit spread), RMS-normalised as a layer's keys and queries are."""
    x = centres[rng.integers(0, len(centres), m)] + rng.normal(size=(m, centres.shape[1])).astype(np.float32)
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))


def queries(centres, m: int, cfg: dict, seed: int = 1):
    return _near(centres, m, np.random.default_rng(seed))


def shape(n: int, cfg: dict) -> dict:
    """The index's settings for ``n`` rows: ``lists_per_sqrt_n · √n`` lists, k-means on ``sample_per_list`` rows a
    list; the list capacity from the rows' nearest assignment (:func:`growmem.index.list_capacity_for`: every
    row in its nearest list); an overflow list of ``overflow`` slots that every query reads."""
    n_lists = max(1, min(n // 8, int(round(cfg["lists_per_sqrt_n"] * math.sqrt(n)))))
    return dict(n_lists=n_lists, overflow=cfg["overflow"], sample=cfg["sample_per_list"] * n_lists)


@functools.partial(jax.jit, static_argnums=(3,))
def _recall(index, q, k, nprobe):
    return ivf.recall(index, q, k, nprobe=nprobe)


def measure(n: int, cfg: dict, bar) -> dict:
    k, v, w, centres = rows(n, cfg)
    kj, vj, wj = map(jnp.asarray, (k, v, w))
    T = jnp.float32(cfg["temperatures"][0])
    sh = shape(n, cfg)
    t0 = time.perf_counter()
    index = jax.block_until_ready(ivf.build(KERNEL, k, key=jax.random.key(0), **sh))
    build_s = time.perf_counter() - t0

    # the rows and the index are arguments of every jitted function (a captured array would be compiled in
    # as a constant)
    rows_ = (kj, vj, wj)

    def exact_y(q, T, rows, index):
        k_, v_, w_ = rows
        return kernels.retrieve(KERNEL, q, k_, v_, w_, temperature=T, row_grads=False)

    def indexed_y(p, mode):
        def f(q, T, rows, index):
            k_, v_, w_ = jax.lax.stop_gradient(rows)
            return ivf.retrieve(KERNEL, index, q, k_, v_, w_, nprobe=p, temperature=T, shared=mode == "shared")
        return f

    def step(f):   # the layer's forward pass and its gradient with respect to q and T
        return jax.jit(jax.value_and_grad(lambda q, T, rows, index: jnp.sum(jnp.sin(f(q, T, rows, index))),
                                          argnums=(0, 1)))

    variants = {f"{mode} {p}": (mode, p) for mode in MODES for p in cfg["nprobe"]}
    steps = {"exact": step(exact_y), **{name: step(indexed_y(p, mode)) for name, (mode, p) in variants.items()}}
    qs = queries(centres, cfg["queries"], cfg)
    qb = jnp.asarray(qs[:cfg["batch"]])
    times = _common.time_interleaved({name: (lambda f=f: f(qb, T, rows_, index)) for name, f in steps.items()},
                                     cfg["repeats"])
    # errors over all the queries (in batches of B), against the exact step on the same state, at each T: the
    # sharper the kernel (the smaller T), the more of its weight the nearest lists hold
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    sh = {**sh, "list_capacity": index.list_capacity, "mean_list": n / index.n_lists}
    out = {"n": n, "build_s": build_s, **sh, "n_overflow": int(index.n_overflow),
           "exact_ms": 1e3 * _common.median(times["exact"]), "indexed": {}}
    # the outputs by one jitted function a variant (T is traced: one compilation for every T), ∂/∂q from the
    # timed steps themselves
    outputs = {name: jax.jit(f) for name, f in
               {"exact": exact_y, **{name: indexed_y(p, mode) for name, (mode, p) in variants.items()}}.items()}
    batches = [jnp.asarray(qs[i:i + cfg["batch"]]) for i in range(0, len(qs), cfg["batch"])]
    errors = {name: {} for name in variants}
    for t in cfg["temperatures"]:
        ys, gs = {}, {}
        for name, fy in outputs.items():
            ys[name] = np.concatenate([np.asarray(fy(qb_, jnp.float32(t), rows_, index)) for qb_ in batches])
            gs[name] = np.concatenate([np.asarray(steps[name](qb_, jnp.float32(t), rows_, index)[1][0])
                                       for qb_ in batches])
        for name in variants:
            errors[name][str(t)] = {"rel_error_y": rel(ys[name], ys["exact"]),
                                    "rel_error_grad_q": rel(gs[name], gs["exact"])}
    for name, (mode, p) in variants.items():
        rec = np.concatenate([np.asarray(_recall(index, qb_, kj, p)) for qb_ in batches])
        out["indexed"].setdefault(mode, {})[str(p)] = {
            "ms": 1e3 * _common.median(times[name]), "speedup": _common.paired_ratio(times, "exact", name),
            "errors_by_temperature": errors[name], "recall_at_10": float(rec.mean()),
            # row slots gathered for the batch (padding included) and the query-slot scores computed
            "slots_gathered": cfg["batch"] * p * sh["list_capacity"] + sh["overflow"] * (1 if mode == "shared"
                                                                                       else cfg["batch"]),
            "scores_per_batch": cfg["batch"] * (p * sh["list_capacity"] + sh["overflow"]) if mode == "per_query"
            else cfg["batch"] * (cfg["batch"] * p * sh["list_capacity"] + sh["overflow"])}
    bar.update(1)
    return out


def plot(results, cfg, out):
    from growmem.reporting import pyplot
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [r["n"] for r in results]
    a1.loglog(ns, [r["exact_ms"] for r in results], "o-", color="k", label="exact scan")
    for mode in MODES:
        for p in cfg["nprobe"]:
            a1.loglog(ns, [r["indexed"][mode][str(p)]["ms"] for r in results], "o-" if mode == "shared" else "s--",
                      label=f"{mode}, nprobe = {p}")
    a1.set_xlabel("rows N")
    a1.set_ylabel(f"step (forward + ∂/∂q), ms, B = {cfg['batch']}")
    a1.legend(fontsize=7)
    last = results[-1]
    ps = list(cfg["nprobe"])
    for mode in MODES:
        for t in cfg["temperatures"]:
            a2.semilogy(ps, [max(last["indexed"][mode][str(p)]["errors_by_temperature"][str(t)]["rel_error_y"], 1e-8)
                             for p in ps], "o-" if mode == "shared" else "s--", label=f"{mode}: error of y, T = {t}")
    a2.semilogy(ps, [max(1 - last["indexed"]["per_query"][str(p)]["recall_at_10"], 1e-8) for p in ps], "^-",
                color="k", label="1 − recall@10 (own lists)")
    a2.set_xscale("log", base=2)
    a2.set_xlabel(f"nprobe (of {last['n_lists']} lists), N = {last['n']:,}")
    a2.legend(fontsize=7)
    fig.tight_layout()
    return _common.save_figure(fig, NAME, out)


def train_run(cfg: dict, seed: int, *, indexed: bool, bar) -> dict:
    """One teacher-student GWS run of ``cfg`` (:data:`TRAINING`) to ``rows`` rows through the index, or exactly
    to ``exact_rows``: the test-loss curve and the seconds of training at each checkpoint."""
    from growmem.backends.indexed import Indexed
    from growmem.data.teacher_student import TeacherStudent
    from growmem.repro.teacher_student import run_growing_ws
    task = TeacherStudent(seed=seed)
    test = task.test_set(cfg["test_size"])
    var = float(np.var(np.asarray(test[1])))
    rows = cfg["rows"] if indexed else cfg["exact_rows"]
    b = cfg["batch"]
    backend = Indexed(cfg["n_lists"], cfg["nprobe"], train_at=cfg["train_at"], shared=cfg["shared"], seed=seed) \
        if indexed else None

    def weight_read(trainer):
        """The share of the exact kernel's weight (w e^s) the probe reads, over the test queries: how local the
        trained layer's kernel is at its T."""
        from growmem.layers import rms_norm
        (mem,) = trainer.memories().values()
        ix = None if mem.ext is None else mem.ext.get("ivf")
        if ix is None:
            return {}
        share = ivf.weight_read(KERNEL, ix, rms_norm(jnp.asarray(test[0][:256])), mem.k, mem.w,
                                nprobe=cfg["nprobe"], temperature=mem.spec.temperature, size=int(mem.size))
        return {"weight_read": float(jnp.mean(share))}

    r = run_growing_ws(task, steps=rows // b, batch=b, test=test, seed=seed, backend=backend,
                       eval_at=[c // b for c in cfg["checkpoints"] if c <= rows], progress=bar.update,
                       inspect=weight_read, **cfg["gws"])
    return {"seed": seed, "mode": "indexed" if indexed else "exact", "rows": int(sum(r["rows"].values())),
            "curve": [[n, mse / var] for n, mse in r["curve"]], "wall": r["wall"], "seconds": r["seconds"],
            **({"weight_read": r["weight_read"]} if "weight_read" in r else {})}


def training(args) -> dict:
    cfg = dict(TRAINING[args.preset])
    seeds = cfg["seeds"] if args.seeds is None else args.seeds
    for c in cfg["checkpoints"]:
        if c % cfg["batch"]:
            raise SystemExit(f"checkpoint {c} is not a whole number of batches of {cfg['batch']}")
    load_before = list(os.getloadavg())
    total = len(seeds) * (cfg["rows"] + cfg["exact_rows"]) // cfg["batch"]
    with tqdm(total=total, desc="indexed training", unit="step") as bar:
        runs = [train_run(cfg, s, indexed=ix, bar=bar) for s in seeds for ix in (True, False)]
    by_seed = {}
    for s in seeds:
        ix, ex = (next(r for r in runs if r["seed"] == s and r["mode"] == m) for m in ("indexed", "exact"))
        at = max(n for n, _ in ex["curve"])
        loss = lambda r: next(v for n, v in r["curve"] if n == at)  # noqa: E731
        by_seed[str(s)] = {"indexed_rows": ix["rows"], "indexed_seconds": ix["wall"][-1][1],
                           "weight_read": ix.get("weight_read"),
                           "final_relative_test_loss": ix["curve"][-1][1], "compared_at_rows": at,
                           "relative_test_loss_at_compared": {"indexed": loss(ix), "exact": loss(ex)},
                           "seconds_to_compared": {"indexed": next(t for n, t in ix["wall"] if n == at),
                                                   "exact": ex["wall"][-1][1]}}
    summary = {"rows": cfg["rows"], "by_seed": by_seed, "load_average_before": load_before,
               "load_average_after": list(os.getloadavg())}
    path = _common.write_results(f"{NAME}_training", summary,
                                 {"preset": args.preset, "config": {**cfg, "seeds": list(seeds)}, "runs": runs},
                                 args.out)
    png = plot_training(runs, args.out)
    for s, x in by_seed.items():
        c = x["relative_test_loss_at_compared"]
        print(f"seed {s}: indexed {x['indexed_rows']:,} rows in {x['indexed_seconds']:.0f} s (the probe reads "
              f"{x['weight_read']:.3f} of the exact kernel's weight), test loss / variance "
              f"{x['final_relative_test_loss']:.4f}; at {x['compared_at_rows']:,} rows indexed {c['indexed']:.4f} "
              f"against exact {c['exact']:.4f} ({x['seconds_to_compared']['indexed']:.0f} s against "
              f"{x['seconds_to_compared']['exact']:.0f} s of training)")
    print(f"wrote {path} and {png}")
    return summary


def plot_training(runs, out):
    from growmem.reporting import pyplot
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        style = "o-" if r["mode"] == "indexed" else "s--"
        a1.loglog(*zip(*[(n, v) for n, v in r["curve"] if n > 0]), style, label=f"{r['mode']}, seed {r['seed']}")
        n, t = zip(*r["wall"])
        a2.loglog(n, t, style, label=f"{r['mode']}, seed {r['seed']}")
    a1.set_xlabel("rows (samples seen)")
    a1.set_ylabel("test MSE / target variance")
    a2.set_xlabel("rows (samples seen)")
    a2.set_ylabel("seconds of training")
    for a in (a1, a2):
        a.legend(fontsize=7)
    fig.tight_layout()
    return _common.save_figure(fig, f"{NAME}_training", out)


def main(argv=None):
    ap = _common.parser(__doc__.splitlines()[0], PRESETS)
    ap.add_argument("--part", choices=("retrieval", "training"), default="retrieval",
                    help="retrieval: one layer step against N (indexed.json); training: a teacher-student run "
                         "to 10^7 rows through the index beside the exact run (indexed_training.json)")
    ap.add_argument("--seeds", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                    help="--part training: the seeds to run (default: the preset's)")
    args = ap.parse_args(argv)
    if args.part == "training":
        return training(args)
    cfg = PRESETS[args.preset]
    load_before = list(os.getloadavg())
    with tqdm(total=len(cfg["sizes"]), desc="indexed", unit="size") as bar:
        results = [measure(n, cfg, bar) for n in cfg["sizes"]]
    last = results[-1]
    summary = {"n": last["n"], "n_lists": last["n_lists"], "exact_ms": last["exact_ms"],
               "by_mode_and_nprobe": {mode: {p: {k: r[k] for k in ("speedup", "errors_by_temperature", "recall_at_10")}
                                             for p, r in by.items()} for mode, by in last["indexed"].items()},
               "load_average_before": load_before, "load_average_after": list(os.getloadavg())}
    path = _common.write_results(NAME, summary, {"preset": args.preset, "config": cfg, "results": results},
                                 args.out)
    png = plot(results, cfg, args.out)
    for r in results:
        for (mode, p), x in ((mp, x) for mode_, by in r["indexed"].items() for mp, x in
                             (((mode_, p_), x_) for p_, x_ in by.items())):
            errs = ", ".join(f"T = {t}: {e['rel_error_y']:.1e}" for t, e in x["errors_by_temperature"].items())
            print(f"N = {r['n']:>9,}  {mode:>9} nprobe = {p:>3}: {x['speedup']:5.2f}x the exact step "
                  f"({x['ms']:.1f} against {r['exact_ms']:.1f} ms), recall@10 {x['recall_at_10']:.3f}, "
                  f"error of y {errs}")
    print(f"wrote {path} and {png}")
    return summary


if __name__ == "__main__":
    main()
