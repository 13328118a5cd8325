"""growmem against Avalanche's strategies on Split-MNIST and Permuted-MNIST (same data, same seeds).

For each stream, every method trains experience after experience and is evaluated on the whole
test stream after each one (Avalanche's accuracy matrix); memory is counted in bytes the same
way for every method (:mod:`growmem.continual.memory_bytes`). Methods: ``growmem`` (the
placeholder recipe, preset ``continual_growmem``: the weighted_softmax readout without blocks,
capped at the memory budget; swap it with ``--policy PRESET``), and Avalanche's ``naive``,
``ewc``, ``lwf``, ``gdumb``, ``replay_1000``, ``replay_4400``, ``cumulative``, ``joint`` with
``SimpleMLP`` (2 x 400, no dropout), SGD lr 0.01 momentum 0.9, batch 64, 2 epochs per
experience on Split-MNIST and 1 on Permuted-MNIST (see ``growmem/continual/baselines.py``).

The default memory budget is what Replay-4400 holds: 4400 MNIST images as float32 plus the
SimpleMLP's parameters (4400·784·4 + 478,410·4 = 15,712,840 B ≈ 15.7 MB); growmem's rows are
capped to fit it (``capacity`` policy, oldest rows evicted first).

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
#: 4400 float32 MNIST images + the SimpleMLP (784-400-400-10) parameters at float32
REPLAY_4400_BYTES = 4400 * 784 * 4 + (784 * 400 + 400 + 400 * 400 + 400 + 400 * 10 + 10) * 4

PRESETS = {
    # a slice of MNIST: ~200 training images per Split-MNIST experience, 3 permutations of 500
    "smoke": dict(seeds=[1], stream_options={"split_mnist": dict(train_limit=1000, test_limit=500),
                                             "permuted_mnist": dict(n_experiences=3, train_limit=500,
                                                                    test_limit=200)}),
    "cpu": dict(seeds=[1, 2, 3], stream_options={"split_mnist": {}, "permuted_mnist": {}}),
    "paper": dict(seeds=[1, 2, 3, 4, 5], stream_options={"split_mnist": {}, "permuted_mnist": {}}),
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


def plot(summary, path, budget):
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    streams = list(summary)
    fig, axes = plt.subplots(2, len(streams), figsize=(6 * len(streams), 7), squeeze=False)
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
    ap.add_argument("--policy", default=None, help="growmem preset (default: continual_growmem, the placeholder)")
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
    docs = {}
    for stream in streams:
        docs[stream] = run_continual(
            stream, methods, seeds, budget, False,
            None if args.checkpoint_dir is None else args.checkpoint_dir / stream, args.resume,
            growmem=args.policy, stream_options=cfg["stream_options"][stream], data_dir=args.data_dir,
            growmem_loop=args.loop, progress=not args.no_progress, threads=args.threads, verbose=True)
    summary = {s: stream_summary(d) for s, d in docs.items()}
    budget_bytes = next(iter(docs.values()))["budget_bytes"] if docs else None
    payload = {"benchmark": "continual", "preset": args.preset,
               "command": "python benchmarks/continual.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": {"streams": streams, "methods": methods, "seeds": seeds, "budget_bytes": budget_bytes,
                          "stream_options": {s: cfg["stream_options"][s] for s in streams},
                          "growmem_preset": args.policy or "continual_growmem", "loop": args.loop},
               "summary": summary, "seconds": time.perf_counter() - t0,
               "streams": {s: {k: d[k] for k in ("config", "stream", "runs", "summary")} for s, d in docs.items()}}
    path = write_json(args.out / "continual.json", payload)
    plot(summary, args.out / "continual.png", budget_bytes)

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
    print(f"wrote {path} and {args.out / 'continual.png'}")
    return payload


if __name__ == "__main__":
    main()
