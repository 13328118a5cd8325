"""growmem against Avalanche's strategies on Split-MNIST and Permuted-MNIST (same data, same seeds).

For each stream, every method trains experience after experience and is evaluated on the whole
test stream after each one (Avalanche's accuracy matrix); memory is counted in bytes the same
way for every method (:mod:`growmem.continual.memory_bytes`). Methods: ``growmem`` — a target
memory (:mod:`growmem.nadaraya`: Nadaraya–Watson rows whose values are the labels, T learned
online, single pass) with the preset made for the stream: ``target_dct`` (fixed DCT image keys) on
Split-MNIST, ``target_subspaces`` (PCA subspaces opened on novelty, redundant rows evicted) on
Permuted-MNIST; swap it with ``--policy PRESET`` — and Avalanche's ``naive``,
``ewc``, ``lwf``, ``gdumb``, ``replay_1000``, ``replay_4400``, ``cumulative``, ``joint`` with
``SimpleMLP`` (2 x 400, no dropout), SGD lr 0.01 momentum 0.9, batch 64, 2 epochs per
experience on Split-MNIST and 1 on Permuted-MNIST (see ``growmem/continual/baselines.py``).

The default memory budget is what Replay-4400 holds: 4400 MNIST images as float32 plus the
SimpleMLP's parameters (4400·784·4 + 478,410·4 = 15,712,840 B ≈ 15.7 MB); growmem is bounded by it.
Beside the main table the ``cpu`` preset measures ``growmem`` at smaller budgets (2, 5, 10 MB; the
first seed: accuracy against bytes, ``curve.<stream>``) and, on Split-MNIST, the same configuration
on the shuffled stream (one experience of all classes: ``summary.split_mnist.growmem_iid``) — the
"no forgetting" comparison.

    python benchmarks/continual.py --preset smoke   # seconds per method on a slice of MNIST (run by the tests)
    python benchmarks/continual.py --preset cpu     # full streams, 3 seeds (hours on 2 shared cores)
    python benchmarks/continual.py --preset paper   # full streams, 5 seeds

Writes ``benchmarks/results/continual.json`` (``summary.<stream>.<method>.{accuracy, bytes}``:
``accuracy`` = ``acc_mean_over_experiences`` — the mean over test experiences of the final
accuracies — averaged over seeds, with ``accuracy_std``; ``acc_stream_weighted`` is
Avalanche's sample-weighted stream accuracy; ``bytes`` = the peak bytes in use over the stream,
with ``bytes_std`` and ``bytes_allocated``) and ``continual.png``. Needs MNIST (``--data-dir`` or
``GROWMEM_DATA``) and the continual extra (``pip install 'growmem[continual]'``).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STREAMS = ("split_mnist", "permuted_mnist")
METHODS = ("growmem", "naive", "ewc", "lwf", "gdumb", "replay_1000", "replay_4400", "cumulative", "joint")
#: growmem's preset per stream (--policy overrides it for every stream)
GROWMEM_PRESETS = {"split_mnist": "target_dct", "permuted_mnist": "target_subspaces"}
#: 4400 float32 MNIST images + the SimpleMLP (784-400-400-10) parameters at float32
REPLAY_4400_BYTES = 4400 * 784 * 4 + (784 * 400 + 400 + 400 * 400 + 400 + 400 * 10 + 10) * 4

PRESETS = {
    # a slice of MNIST: ~200 training images per Split-MNIST experience, 3 permutations of 500
    "smoke": dict(seeds=[1], stream_options={"split_mnist": dict(train_limit=1000, test_limit=500),
                                             "permuted_mnist": dict(n_experiences=3, train_limit=500,
                                                                    test_limit=200)},
                  curve=[2_000_000], iid=True),
    "cpu": dict(seeds=[1, 2, 3], stream_options={"split_mnist": {}, "permuted_mnist": {}},
                curve=[2_000_000, 5_000_000, 10_000_000], iid=True),
    "paper": dict(seeds=[1, 2, 3, 4, 5], stream_options={"split_mnist": {}, "permuted_mnist": {}},
                  curve=[2_000_000, 5_000_000, 10_000_000], iid=True),
}


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def stream_summary(doc) -> dict:
    out = {}
    for method, agg in doc["summary"].items():
        g = lambda k, f="mean": agg[k][f] if k in agg else None  # noqa: E731
        out[method] = {"accuracy": g("acc_mean_over_experiences"), "accuracy_std": g("acc_mean_over_experiences", "std"),
                       "acc_stream_weighted": g("acc_stream_weighted"),
                       "acc_stream_weighted_std": g("acc_stream_weighted", "std"),
                       "forgetting": g("forgetting"), "bwt": g("bwt"),
                       "bytes": g("bytes_in_use_peak"), "bytes_std": g("bytes_in_use_peak", "std"),
                       "bytes_allocated": g("bytes_allocated_peak"), "train_seconds": g("train_seconds"),
                       "seeds": len(agg.get("seeds", [])), "within_budget": agg.get("within_budget")}
    return out


def plot(summary, path, budget, curve=None):
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    streams = list(summary)
    fig, axes = plt.subplots(3, len(streams), figsize=(6 * len(streams), 10.5), squeeze=False)
    for c, stream in enumerate(streams):
        methods = list(summary[stream])
        acc = [summary[stream][m]["accuracy"] or 0 for m in methods]
        err = [summary[stream][m]["accuracy_std"] or 0 for m in methods]
        byt = [summary[stream][m]["bytes"] or 0 for m in methods]
        colors = ["C3" if m.startswith("growmem") else "C0" for m in methods]
        ax = axes[0, c]
        ax.bar(methods, acc, yerr=err, color=colors)
        ax.set_ylim(0, 1)
        ax.set_ylabel("acc_mean_over_experiences")
        ax.set_title(stream)
        ax.tick_params(axis="x", rotation=45)
        ax = axes[1, c]
        ax.bar(methods, byt, color=colors)
        ax.set_yscale("log")
        ax.set_ylabel("peak bytes in use")
        if budget:
            ax.axhline(budget, color="k", ls="--", lw=0.8, label=f"budget {budget / 1e6:.1f} MB")
            ax.legend(fontsize=8)
        ax.tick_params(axis="x", rotation=45)
        ax = axes[2, c]                                   # accuracy against bytes
        pts = sorted((curve or {}).get(stream, []), key=lambda p: p["bytes"])
        if pts:
            ax.plot([p["bytes"] / 1e6 for p in pts], [p["accuracy"] for p in pts], "o-", color="C3",
                    label="growmem (budgets)")
        for m in ("replay_1000", "replay_4400", "gdumb", "joint"):
            r = summary[stream].get(m)
            if r and r["accuracy"] is not None and r["bytes"]:
                ax.plot(r["bytes"] / 1e6, r["accuracy"], "s", label=m)
        ax.set_xscale("log")
        ax.set_xlabel("peak memory (MB)")
        ax.set_ylabel("accuracy (mean over experiences)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for continual.json and continual.png")
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    ap.add_argument("--streams", default=",".join(STREAMS), help="comma-separated subset of " + ", ".join(STREAMS))
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    ap.add_argument("--policy", default=None, help="growmem preset for every stream (default: "
                    + ", ".join(f"{k}: {v}" for k, v in GROWMEM_PRESETS.items()) + ")")
    ap.add_argument("--no-extras", action="store_true", help="skip the budget curve and the shuffled-stream run")
    ap.add_argument("--curve-streams", default=None,
                    help="comma-separated streams that get the budget curve (default: every stream run)")
    ap.add_argument("--memory-budget", default=str(REPLAY_4400_BYTES),
                    help="growmem's memory budget in bytes or a size (default: Replay-4400's bytes, "
                         f"{REPLAY_4400_BYTES}); 'none' for no cap")
    ap.add_argument("--loop", choices=["fast", "template"], default="fast", help="growmem's training loop")
    ap.add_argument("--checkpoint-dir", type=Path, default=None, help="checkpoint every run here (per stream)")
    ap.add_argument("--resume", action="store_true", help="continue the runs in --checkpoint-dir")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    from growmem.continual.runner import run_continual
    from growmem.reporting import write_json

    cfg = PRESETS[args.preset]
    streams = _csv(args.streams)
    bad = [s for s in streams if s not in STREAMS]
    if bad:
        raise SystemExit(f"unknown stream(s) {bad}; choose from {', '.join(STREAMS)}")
    methods = _csv(args.methods)
    seeds = [int(s) for s in _csv(args.seeds)] if args.seeds else cfg["seeds"]
    budget = None if args.memory_budget.lower() == "none" else args.memory_budget
    if budget is not None and budget.isdigit():
        budget = int(budget)
    t0 = time.perf_counter()
    docs, extras, curve = {}, {}, {}
    presets = {s: args.policy or GROWMEM_PRESETS[s] for s in streams}

    def run(stream, meths, run_seeds, run_budget, options, tag):
        ck = None if args.checkpoint_dir is None else args.checkpoint_dir / f"{stream}{tag}"
        return run_continual(stream, meths, run_seeds, run_budget, False, ck, args.resume, growmem=presets[stream],
                             stream_options=options, data_dir=args.data_dir, growmem_loop=args.loop,
                             progress=not args.no_progress, threads=args.threads, verbose=True)

    for stream in streams:
        docs[stream] = run(stream, methods, seeds, budget, cfg["stream_options"][stream], "")
    summary = {s: stream_summary(d) for s, d in docs.items()}
    if "growmem" in methods and not args.no_extras:
        curve_streams = _csv(args.curve_streams) if args.curve_streams is not None else streams
        for stream in (s for s in streams if s in curve_streams):
            pts = []
            for b in cfg["curve"]:
                d = run(stream, ["growmem"], seeds[:1], b, cfg["stream_options"][stream], f"_budget{b}")
                r = stream_summary(d)["growmem"]
                extras[f"{stream}_budget{b}"] = {k: d[k] for k in ("config", "summary")}
                pts.append({"budget": b, "accuracy": r["accuracy"], "bytes": r["bytes"], "seeds": r["seeds"]})
            g = summary[stream]["growmem"]
            pts.append({"budget": docs[stream]["budget_bytes"], "accuracy": g["accuracy"], "bytes": g["bytes"],
                        "seeds": g["seeds"]})
            curve[stream] = pts
        if "split_mnist" in streams and cfg["iid"]:
            # the same configuration on the shuffled stream: one experience holding every class
            opts = {**cfg["stream_options"]["split_mnist"], "n_experiences": 1}
            d = run("split_mnist", ["growmem"], seeds, budget, opts, "_iid")
            extras["split_mnist_iid"] = {k: d[k] for k in ("config", "summary")}
            summary["split_mnist"]["growmem_iid"] = stream_summary(d)["growmem"]
    budget_bytes = next(iter(docs.values()))["budget_bytes"] if docs else None
    payload = {"benchmark": "continual", "preset": args.preset,
               "command": "python benchmarks/continual.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": {"streams": streams, "methods": methods, "seeds": seeds, "budget_bytes": budget_bytes,
                          "stream_options": {s: cfg["stream_options"][s] for s in streams},
                          "growmem_presets": presets, "loop": args.loop},
               "summary": summary, "curve": curve, "seconds": time.perf_counter() - t0,
               "extras": extras,
               "streams": {s: {k: d[k] for k in ("config", "stream", "runs", "summary")} for s, d in docs.items()}}
    path = write_json(args.out / "continual.json", payload)
    plot(summary, args.out / "continual.png", budget_bytes, curve)

    print()
    for stream, rows in summary.items():
        ref = rows.get("replay_4400")
        print(f"{stream}:")
        for m, r in rows.items():
            line = (f"  {m:12s} accuracy {r['accuracy']:.4f}" + (f"±{r['accuracy_std']:.4f}" if r["seeds"] > 1 else "")
                    + f"  stream-weighted {r['acc_stream_weighted']:.4f}  peak bytes {r['bytes'] / 1e6:9.3f} MB")
            if ref and m != "replay_4400" and ref["accuracy"] and ref["bytes"]:
                line += (f"  accuracy / replay_4400 {r['accuracy'] / ref['accuracy']:.3f}  "
                         f"bytes / replay_4400 {r['bytes'] / ref['bytes']:.3f}")
            print(line)
        for p in curve.get(stream, []):
            print(f"  growmem at budget {p['budget'] / 1e6:6.2f} MB: accuracy {p['accuracy']:.4f}, peak "
                  f"{p['bytes'] / 1e6:.3f} MB")
        iid = rows.get("growmem_iid")
        if iid and rows.get("growmem"):
            print(f"  no-forgetting gap (shuffled - class-incremental): "
                  f"{iid['accuracy'] - rows['growmem']['accuracy']:+.4f}")
    print(f"wrote {path} and {args.out / 'continual.png'}")
    return payload


if __name__ == "__main__":
    main()
