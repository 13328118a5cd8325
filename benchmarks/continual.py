"""The continual benchmark: growmem's methods against order-free baselines and Avalanche's strategies, at
equal bytes, over seeds, with every hyperparameter chosen on a validation split.

Streams: Split-MNIST (class-incremental), Permuted-MNIST and Rotated-MNIST (domain-incremental), all of
MNIST. Every method trains experience after experience and is evaluated on the whole test stream after each
one (Avalanche's accuracy matrix). Methods are named by what they are (:mod:`growmem.continual.methods`):
``target:dct`` (a Nadaraya–Watson target memory on DCT keys), ``target:subspaces``, ``net:<preset>`` (a
growing network), the order-free baselines on the same keys and on raw pixels (``knn:``, ``ncm:``,
``slda:``), and Avalanche's strategies with their recipes (``growmem/continual/baselines.py``): ``naive``,
``ewc``, ``lwf``, ``gdumb`` (its authors' recipe; it retrains from scratch at every experience, so it is
trained and evaluated after the last one alone — the same final model, bit for bit — and has no forgetting
entry), ``replay_4400``, ``replay_bytes`` (as many samples as the
budget holds), ``cumulative``, ``joint``.

**Bytes.** One budget for every method (``--memory-budget``, default 15.7 MB): growmem's methods are
bounded by it, ``replay_bytes`` is sized by it, and every method's peak bytes in use are checked against
it. Stored samples are counted as a user stores them (``--replay-dtype uint8``: 784 pixel bytes and a
one-byte label per MNIST image; ``float32`` counts the loader's tensors).

**Hyperparameters** come from ``benchmarks/results/continual_tune.json`` (``benchmarks/continual_tune.py``
chose them on each stream's validation split: 10 % of each class's training images held out; the test
split is not read there). A method the tuning file does not name runs with its preset or recipe.

**Seeds.** The ``cpu`` preset runs 3 seeds of every method a claim compares; ``naive``, ``ewc`` and ``lwf``
run one seed (``seeds`` in the summary says so). A difference is called only by a paired Student t-test at 95 % of
the difference (:func:`growmem.reporting.compare`), else a tie.

    python benchmarks/continual.py --preset smoke                 # seconds (run by the tests, generated data)
    python benchmarks/continual.py --preset cpu --streams split_mnist --methods target:dct,knn:dct --merge
    python benchmarks/continual.py --preset cpu                   # everything (many hours on 2 cores)
    python benchmarks/continual.py --preset cpu --combine A/continual.json B/continual.json   # runs made apart

``--merge`` adds the runs of this invocation to the JSON already in ``--out`` (replacing runs of the same
stream, method and seed), so a ``cpu`` run can be split by stream, method or seed; ``invocations`` records
each call. Writes ``continual.json`` (``summary.<stream>.<method>.{accuracy_mean, accuracy_std, bytes,
seeds, wall_s, ...}``), ``continual.png`` (accuracy against bytes, with the budget sweep) and
``continual_stream.png`` (accuracy over the stream).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TUNED = RESULTS / "continual_tune.json"
STREAMS = ("split_mnist", "permuted_mnist", "rotated_mnist")
BUDGET = "15.7MB"
#: the methods each stream runs (and the growmem method the others are compared with, first)
METHODS = {
    "split_mnist": ("target:dct", "net:replay_dct", "knn:dct", "ncm:dct", "slda:dct", "knn:raw", "ncm:raw", "slda:raw",
                    "replay_bytes", "replay_4400", "gdumb", "cumulative", "joint", "naive", "ewc", "lwf"),
    "permuted_mnist": ("target:subspaces", "net:replay_proj", "knn:raw", "ncm:raw", "slda:raw", "replay_bytes", "replay_4400", "gdumb",
                       "cumulative", "joint", "naive", "ewc", "lwf"),
}
METHODS["rotated_mnist"] = METHODS["permuted_mnist"]
#: methods whose claims are not compared: one seed is enough (marked in the summary)
ONE_SEED = ("naive", "ewc", "lwf")
#: the methods of the accuracy-against-bytes sweep (first seed), and the budgets (bytes)
SWEEP = ("target:dct", "target:subspaces", "knn:dct", "knn:raw", "replay_bytes")

PRESETS = {
    # a slice of the data: ~200 training images per Split-MNIST experience, 3 permutations / rotations of 500
    "smoke": dict(seeds=[1], stream_options={"split_mnist": dict(train_limit=1000, test_limit=500),
                                             "permuted_mnist": dict(n_experiences=3, train_limit=500, test_limit=200),
                                             "rotated_mnist": dict(n_experiences=3, train_limit=500, test_limit=200)},
                  sweep=[5_000_000], iid=True, epochs_cap=2),
    # Permuted- and Rotated-MNIST as the frontier's cpu preset (benchmarks/continual_frontier.py) runs them: 10
    # experiences of the same 6,000 training images (60,000 samples in all, as Split-MNIST), 2,000 test images;
    # 10 x 60,000 does not fit the sessions of 2 cores; the paper preset runs the whole of MNIST in each
    "cpu": dict(seeds=[1, 2, 3],
                stream_options={"split_mnist": {},
                                "permuted_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000},
                                "rotated_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000}},
                sweep=[2_000_000, 5_000_000, 10_000_000], iid=True, epochs_cap=None),
    "paper": dict(seeds=[1, 2, 3, 4, 5], stream_options={s: {} for s in STREAMS},
                  sweep=[2_000_000, 5_000_000, 10_000_000], iid=True, epochs_cap=None),
}


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def tuned_settings(path, stream: str) -> dict:
    """``{method: settings}`` chosen for ``stream`` in the tuning file (``{}`` when it has none)."""
    if path is None or not Path(path).is_file():
        return {}
    doc = json.loads(Path(path).read_text())
    return {m: r["chosen"] for m, r in doc.get("streams", {}).get(stream, {}).items() if r.get("chosen") is not None}


def stream_summary(runs, reference: str) -> dict:
    """``{method: {accuracy_mean, accuracy_std, seeds, bytes, ..., vs_reference}}`` from the runs of one
    stream (mean ± sample std over seeds; ``vs_reference``: better / worse / tie / untested against the
    stream's growmem method, by a paired Student t-test at 95 %)."""
    from growmem.continual.report import aggregate, verdicts

    agg = aggregate(runs)
    calls = verdicts(agg, reference) if reference in agg and len(agg[reference]["seeds"]) > 1 else {}
    out = {}
    for m, a in agg.items():
        r = next(x for x in runs if x["method"] == m)
        g = lambda k, f="mean": a[k][f] if k in a else None  # noqa: E731
        out[m] = {"description": r.get("description"), "accuracy_mean": g("acc_mean_over_experiences"),
                  "accuracy_std": g("acc_mean_over_experiences", "std"),
                  "accuracy_values": g("acc_mean_over_experiences", "values"),
                  "acc_stream_weighted": g("acc_stream_weighted"), "forgetting": g("forgetting"), "bwt": g("bwt"),
                  "bytes": g("bytes_in_use_peak"), "bytes_allocated": g("bytes_allocated_peak"),
                  "wall_s": g("wall_seconds"), "seeds": len(a["seeds"]),
                  "within_budget": a.get("within_budget"), "vs_reference": calls.get(m)}
    return out


def _merge(old_runs, new_runs):
    key = lambda r: (r["stream"], r["method"], r.get("split", "test"), r["seed"])  # noqa: E731
    fresh = {key(r) for r in new_runs}
    return [r for r in old_runs if key(r) not in fresh] + list(new_runs)


def plot(payload, out: Path):
    """``continual.png``: accuracy against peak bytes per stream (every method; the sweep's methods as
    curves); ``continual_stream.png``: mean accuracy on the experiences seen after each experience."""
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    streams = list(payload["summary"])
    fig, axes = plt.subplots(1, len(streams), figsize=(6.5 * len(streams), 5), squeeze=False)
    for ax, stream in zip(axes[0], streams):
        rows = payload["summary"][stream]
        for k, (m, r) in enumerate(rows.items()):
            if r["accuracy_mean"] is None or not r["bytes"]:
                continue
            ax.errorbar(r["bytes"] / 1e6, r["accuracy_mean"], yerr=r["accuracy_std"] or 0, fmt="o", color=f"C{k % 10}",
                        label=f"{m} ({r['seeds']} seed{'s' if r['seeds'] > 1 else ''})", capsize=2)
        for m, pts in payload.get("sweep", {}).get(stream, {}).items():
            pts = sorted(pts, key=lambda p: p["bytes"])
            ax.plot([p["bytes"] / 1e6 for p in pts], [p["accuracy"] for p in pts], "--", lw=1, color="0.4")
            ax.annotate(m, (pts[0]["bytes"] / 1e6, pts[0]["accuracy"]), fontsize=6)
        if payload["config"].get("budget_bytes"):
            ax.axvline(payload["config"]["budget_bytes"] / 1e6, color="k", ls=":", lw=0.8, label="budget")
        ax.set_xscale("log")
        ax.set_xlabel("peak memory in use (MB)")
        ax.set_ylabel("final accuracy, mean over test experiences")
        ax.set_title(stream)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, out / "continual.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, len(streams), figsize=(6.5 * len(streams), 4.5), squeeze=False)
    for ax, stream in zip(axes[0], streams):
        for k, m in enumerate(payload["summary"][stream]):
            mats = [r["accuracy_matrix"] for r in payload["runs"] if r["stream"] == stream and r["method"] == m
                    and len(r["accuracy_matrix"]) > 1 and r["config"].get("evaluated") != "final"]
            if not mats:
                continue
            import numpy as np
            seen = np.mean([[np.mean([v for v in row[:i + 1] if v is not None]) for i, row in enumerate(a)]
                            for a in mats], axis=0)
            ax.plot(range(1, len(seen) + 1), seen, marker="o", ms=3, label=m, color=f"C{k % 10}")
        ax.set_xlabel("experiences trained")
        ax.set_ylabel("mean accuracy on the experiences seen")
        ax.set_ylim(0, 1)
        ax.set_title(stream)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, out / "continual_stream.png")
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for continual.json and the plots")
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    ap.add_argument("--streams", default=",".join(STREAMS), help="comma-separated subset of " + ", ".join(STREAMS))
    ap.add_argument("--methods", default=None, help="comma-separated methods (default: each stream's METHODS)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    ap.add_argument("--memory-budget", default=BUDGET, help=f"the budget of every method (default {BUDGET})")
    ap.add_argument("--replay-dtype", choices=["uint8", "float32"], default="uint8",
                    help="how stored samples are counted (default uint8: what a user stores)")
    ap.add_argument("--tuned", type=Path, default=TUNED, help="the tuning results (default %(default)s)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the accuracy-against-bytes sweep")
    ap.add_argument("--no-iid", action="store_true", help="skip the shuffled-stream runs of growmem's methods")
    ap.add_argument("--merge", action="store_true", help="add these runs to the JSON already in --out")
    ap.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                    help="merge these continual.json files (run apart, e.g. at once in two folders) into --out, "
                         "run nothing else, and summarise them together")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from growmem.runtime import compilation_cache
    compilation_cache()     # seeds and methods after the first load the programs they share instead of compiling

    from growmem.continual.methods import resolve
    from growmem.continual.runner import run_continual
    from growmem.reporting import write_json
    from growmem.units import parse_size

    cfg = PRESETS[args.preset]
    streams = _csv(args.streams)
    bad = [s for s in streams if s not in STREAMS]
    if bad:
        raise SystemExit(f"unknown stream(s) {bad}; choose from {', '.join(STREAMS)}")
    seeds = [int(s) for s in _csv(args.seeds)] if args.seeds else cfg["seeds"]
    budget = parse_size(args.memory_budget)
    t0 = time.perf_counter()
    new_runs, sweep_runs, iid_runs = [], [], []
    combined = {"runs": [], "sweep_runs": [], "iid_runs": [], "invocations": []}
    for other in map(lambda p: json.loads(Path(p).read_text()), args.combine or []):
        for k in ("runs", "sweep_runs", "iid_runs"):
            combined[k] = _merge(combined[k], other.get(k, []))
        combined["invocations"] += other.get("invocations", [])
    if args.combine:
        streams = []

    def run(stream, methods, run_seeds, run_budget, options, settings):
        epochs = None
        if cfg["epochs_cap"]:   # smoke: a recipe's 128 epochs would take minutes on a slice; cap them
            epochs = {m: cfg["epochs_cap"] for m in methods if resolve(m, stream).kind == "avalanche"}
        return run_continual(stream, methods, run_seeds, run_budget, stream_options=options, data_dir=args.data_dir,
                             method_settings={m: s for m, s in settings.items() if m in methods}, epochs=epochs,
                             replay_dtype=args.replay_dtype, progress=not args.no_progress, threads=args.threads,
                             verbose=True, final_only=True)["runs"]

    for stream in streams:
        known = {m for ms in METHODS.values() for m in ms}
        methods = [m for m in _csv(args.methods) if m in METHODS[stream] or m not in known] if args.methods \
            else list(METHODS[stream])
        settings = tuned_settings(args.tuned, stream)
        opts = cfg["stream_options"][stream]
        many = [m for m in methods if m not in ONE_SEED]
        few = [m for m in methods if m in ONE_SEED]
        if many:
            new_runs += run(stream, many, seeds, budget, opts, settings)
        if few:
            new_runs += run(stream, few, seeds[:1], budget, opts, settings)
        learners = [m for m in many if resolve(m, stream).kind == "learner"]
        if not args.no_sweep:
            for m in (m for m in methods if m in SWEEP):
                for b in cfg["sweep"]:
                    try:
                        sweep_runs += [{**r, "budget": b} for r in run(stream, [m], seeds[:1], b, opts, settings)]
                    except ValueError as e:     # e.g. replay's model alone is larger than the budget
                        print(f"{stream} {m} at {b / 1e6:.1f} MB: not run ({e})", file=sys.stderr)
        if cfg["iid"] and not args.no_iid and stream == "split_mnist" and learners:
            # the same methods on the shuffled stream (one experience of every class): what the order costs
            iid_runs += run(stream, learners, seeds, budget, {**opts, "n_experiences": 1}, settings)

    path = args.out / "continual.json"
    old = json.loads(path.read_text()) if (args.merge and path.is_file()) else {}
    if args.combine:
        old = {k: _merge(old.get(k, []), combined[k]) for k in ("runs", "sweep_runs", "iid_runs")} | \
            {"invocations": old.get("invocations", []) + combined["invocations"]}
    runs = _merge(old.get("runs", []), new_runs)
    sweep_all = _merge(old.get("sweep_runs", []), [dict(r, method=f"{r['method']}@{r['budget']}") for r in sweep_runs])
    iid_all = _merge(old.get("iid_runs", []), iid_runs)
    summary, sweep, iid = {}, {}, {}
    for stream in dict.fromkeys([r["stream"] for r in runs]):
        ref = METHODS.get(stream, ("",))[0]
        summary[stream] = stream_summary([r for r in runs if r["stream"] == stream], ref)
        for r in (r for r in sweep_all if r["stream"] == stream):
            name = r["method"].rsplit("@", 1)[0]
            sweep.setdefault(stream, {}).setdefault(name, []).append(
                {"budget": r["budget"], "accuracy": r["summary"]["acc_mean_over_experiences"],
                 "bytes": r["summary"]["bytes_in_use_peak"]})
        for name, row in summary[stream].items():   # the main budget is a point of the sweep too
            if name in sweep.get(stream, {}) and row["seeds"]:
                first = next(r for r in runs if r["stream"] == stream and r["method"] == name)
                sweep[stream][name].append({"budget": budget, "accuracy": first["summary"]["acc_mean_over_experiences"],
                                            "bytes": first["summary"]["bytes_in_use_peak"]})
        rows = stream_summary([r for r in iid_all if r["stream"] == stream], "") if iid_all else {}
        for m, row in rows.items():   # what the class-incremental order costs, on the whole test set (both)
            by_seed = lambda rs: {r["seed"]: r["summary"]["acc_stream_weighted"] for r in rs  # noqa: E731
                                  if r["stream"] == stream and r["method"] == m}
            shuffled, ordered = by_seed(iid_all), by_seed(runs)
            common = sorted(set(shuffled) & set(ordered))
            if common:
                from growmem.reporting import compare
                a, b = [shuffled[k] for k in common], [ordered[k] for k in common]
                row.update(order_cost=sum(x - y for x, y in zip(a, b)) / len(common), order_seeds=common,
                           shuffled_vs_ordered=compare(a, b, paired=True))
        iid[stream] = rows                  # every stream has its entries (empty when not run)
        sweep.setdefault(stream, {})
    invocation = {"command": "python benchmarks/continual.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "seconds": time.perf_counter() - t0, "load_average_after": list(os.getloadavg()),
                  "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "runs": sorted({f"{r['stream']}/{r['method']}/seed{r['seed']}" for r in new_runs})}
    payload = {"benchmark": "continual", "preset": args.preset,
               "config": {"budget_bytes": budget, "replay_dtype": args.replay_dtype, "seeds": seeds,
                          "stream_options": {s: cfg["stream_options"][s] for s in STREAMS},
                          "tuned": str(args.tuned) if args.tuned and Path(args.tuned).is_file() else None,
                          "one_seed": list(ONE_SEED), "methods": {s: list(m) for s, m in METHODS.items()}},
               "summary": summary, "iid": iid, "sweep": sweep,
               "invocations": old.get("invocations", []) + [invocation],
               "runs": runs, "sweep_runs": sweep_all, "iid_runs": iid_all}
    out = write_json(path, payload)
    plot(payload, args.out)

    print()
    for stream, rows in summary.items():
        print(f"{stream} (budget {budget / 1e6:.2f} MB; vs {METHODS.get(stream, ('',))[0]}, by a paired Student t-test at 95 %):")
        for m, r in sorted(rows.items(), key=lambda kv: -(kv[1]["accuracy_mean"] or 0)):
            acc = f"{r['accuracy_mean']:.4f}" + (f" ± {r['accuracy_std']:.4f}" if r["seeds"] > 1 else " (1 seed)")
            over = "" if r["within_budget"] is not False else " OVER BUDGET"
            print(f"  {m:18s} {acc:18s} {r['bytes'] / 1e6:9.2f} MB{over:12s} {r['wall_s']:8.0f} s  "
                  f"{r['vs_reference'] or ''}")
        for m, r in iid.get(stream, {}).items():
            if "order_cost" in r:
                print(f"  {m}: the class-incremental order costs {r['order_cost']:+.4f} of the shuffled stream's "
                      f"accuracy on the whole test set ({r['shuffled_vs_ordered']})")
    print(f"wrote {out}, {args.out / 'continual.png'} and {args.out / 'continual_stream.png'}")
    return payload


if __name__ == "__main__":
    main()
