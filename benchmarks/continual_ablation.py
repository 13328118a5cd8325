"""What makes the growing networks continual: each mechanism on and off, same seeds, same budget.

Split-MNIST (class-incremental, one pass): ``net:replay_dct`` with its tuned settings, then with one
mechanism changed at a time — the labels trick off (plain cross-entropy), self-replay off, self-replay and
class-balanced eviction off (the oldest rows leave), no residual block, raw pixels instead of DCT inputs,
the paper's readout temperature T = 6. The drifting stream: keeping every row (``net:continual_growmem``),
constant weight decay (``net:continual_decay``), a sliding window (``net:continual_window``), the drift
detector (``net:drift_discount``, tuned) — with the stream's gradual drift and without it (``drift = 0``).

Every variant runs the same seeds within the same budget; ``vs_full`` compares it with the full recipe
(or with keeping every row), paired by seed, by a paired Student t-test at 95 % (else a tie).

    python benchmarks/continual_ablation.py --preset smoke      # seconds (run by the tests)
    python benchmarks/continual_ablation.py --preset cpu        # ~2 h on 2 cores
    python benchmarks/continual_ablation.py --preset cpu --parts split_mnist --variants full --merge   # one rerun

Writes ``continual_ablation.json`` (``summary.<stream>.<variant>.{accuracy_mean, accuracy_std, acc_current_mean,
prequential_mean, bytes, wall_s, vs_full}``) and ``continual_ablation.png``.
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
BUDGET = "15.7MB"

#: (variant, method, preset overrides on top of the tuned ones)
SPLIT = [
    ("full", "net:replay_dct", {}),
    ("no labels trick (cross-entropy)", "net:replay_dct", {"train.loss": "cross_entropy"}),
    ("no self-replay", "net:replay_dct", {"replay.samples": 0}),
    ("no self-replay, oldest rows evicted", "net:replay_dct", {"replay.samples": 0, "policy.0.on_full": "evict_oldest"}),
    ("no residual block", "net:replay_dct", {"model.n_blocks": 0}),
    ("raw pixels (no DCT)", "net:replay_dct", {"inputs": {"kind": "identity", "normalise": True}}),
    ("readout T = 6 (the paper's)", "net:replay_dct", {"readout.temperature": 6.0}),
]
DRIFT = [
    ("keep every row", "net:continual_growmem", {}),
    ("weight decay (constant)", "net:continual_decay", {}),
    ("window of 2000 rows", "net:continual_window", {}),
    ("drift detector", "net:drift_discount", {}),
]
PRESETS = {
    "smoke": dict(seeds=[1, 2], split=dict(train_limit=600, test_limit=300), drift=dict(n_experiences=2, train_limit=160),
                  variants=2),
    "cpu": dict(seeds=[1, 2, 3], split=dict(train_limit=20000), drift={}, variants=None),
}


def _tuned(path, stream, method):
    if path is None or not Path(path).is_file():
        return {}
    return (json.loads(Path(path).read_text()).get("streams", {}).get(stream, {}).get(method, {}) or {}).get(
        "chosen") or {}


def summarize(runs, full: str):
    from growmem.reporting import compare, mean_std

    out = {}
    base = sorted((r for r in runs if r["variant"] == full), key=lambda r: r["seed"])
    for v in dict.fromkeys(r["variant"] for r in runs):
        rs = sorted((r for r in runs if r["variant"] == v), key=lambda r: r["seed"])
        row = {"method": rs[0]["method"], "overrides": rs[0]["overrides"], "seeds": [r["seed"] for r in rs]}
        for key, name in (("acc_mean_over_experiences", "accuracy"), ("acc_current_mean", "acc_current"),
                          ("prequential_acc_mean", "prequential"), ("bytes_in_use_peak", "bytes"),
                          ("wall_seconds", "wall_s")):
            vals = [r["summary"][key] for r in rs if r["summary"].get(key) is not None]
            if vals:
                m = mean_std(vals)
                row[f"{name}_mean"], row[f"{name}_std"] = m["mean"], m["std"]
        if v != full and [r["seed"] for r in base] == row["seeds"]:
            for key, name in (("acc_mean_over_experiences", "accuracy"), ("acc_current_mean", "acc_current"),
                              ("prequential_acc_mean", "prequential")):
                a = [r["summary"].get(key) for r in rs]
                b = [r["summary"].get(key) for r in base]
                if None not in a + b:
                    row[f"{name}_vs_full"] = compare(a, b, paired=True)
        row["within_budget"] = all(r["summary"]["within_budget"] is not False for r in rs)
        out[v] = row
    return out


def plot(payload, path):
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    panels = list(payload["summary"].items())
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, (name, rows) in zip(axes[0], panels):
        key = "acc_current" if name.startswith("drifting") else "accuracy"
        labels = list(rows)
        ax.barh(range(len(labels)), [rows[v].get(f"{key}_mean", 0) for v in labels],
                xerr=[rows[v].get(f"{key}_std", 0) for v in labels], color="C0")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("accuracy on the current teacher" if key == "acc_current" else "final accuracy (mean over experiences)")
        ax.set_title(name, fontsize=9)
        ax.invert_yaxis()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--tuned", type=Path, default=TUNED)
    ap.add_argument("--parts", default="split_mnist,drifting_teacher,drifting_teacher_no_drift")
    ap.add_argument("--variants", default=None,
                    help="comma-separated variant names to run (default: every variant of each part)")
    ap.add_argument("--merge", action="store_true",
                    help="add these runs to the continual_ablation.json in --out (replacing the same part, variant "
                         "and seed) and summarise all of them")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from growmem.runtime import compilation_cache
    compilation_cache()     # seeds and methods after the first load the programs they share instead of compiling

    from growmem.continual.runner import run_continual
    from growmem.reporting import write_json

    cfg = PRESETS[args.preset]
    parts = {"split_mnist": ("split_mnist", SPLIT, cfg["split"], BUDGET),
             "drifting_teacher": ("drifting_teacher", DRIFT, cfg["drift"], None),
             "drifting_teacher_no_drift": ("drifting_teacher", DRIFT, {**cfg["drift"], "drift": 0.0}, None)}
    t0 = time.perf_counter()
    path = args.out / "continual_ablation.json"
    old = json.loads(path.read_text()) if (args.merge and path.is_file()) else {}
    wanted = None if args.variants is None else {v.strip() for v in args.variants.split(",") if v.strip()}
    known = {v for _, vs, _, _ in parts.values() for v, _, _ in vs}
    if wanted is not None and not wanted <= known:
        raise SystemExit(f"unknown variant(s) {sorted(wanted - known)}; choose from {sorted(known)}")
    runs, summary = [], {}
    for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
        stream, variants, opts, budget = parts[part]
        chosen = variants[:cfg["variants"]] if cfg["variants"] else variants
        part_runs = []
        for variant, method, over in chosen:
            if wanted is not None and variant not in wanted:
                continue
            tuned = _tuned(args.tuned, stream, method).get("overrides", {})
            settings = {"overrides": {**tuned, **over}}
            doc = run_continual(stream, [method], cfg["seeds"], budget, stream_options=opts, data_dir=args.data_dir,
                                method_settings={method: settings}, progress=not args.no_progress, verbose=False)
            for r in doc["runs"]:
                part_runs.append({"part": part, "variant": variant, "method": method, "overrides": settings["overrides"],
                                  "seed": r["seed"], "summary": r["summary"]})
            print(f"{part}: {variant}: " + ", ".join(f"{r['summary']['acc_mean_over_experiences']:.4f}"
                                                     for r in doc["runs"]), flush=True)
        runs += part_runs
    key = lambda r: (r["part"], r["variant"], r["seed"])  # noqa: E731
    fresh = {key(r) for r in runs}
    runs = [r for r in old.get("runs", []) if key(r) not in fresh] + runs
    order = {p: [v for v, _, _ in vs] for p, (_, vs, _, _) in parts.items()}
    runs.sort(key=lambda r: (list(parts).index(r["part"]), order[r["part"]].index(r["variant"]), r["seed"]))
    for part in dict.fromkeys(r["part"] for r in runs):
        summary[part] = summarize([r for r in runs if r["part"] == part], order[part][0])
    command = "python benchmarks/continual_ablation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"benchmark": "continual_ablation", "preset": args.preset, "command": command,
               "commands": old.get("commands", [old["command"]] if "command" in old else []) + [command],
               "config": {"seeds": cfg["seeds"], "budget": BUDGET, "split_options": cfg["split"],
                          "drift_options": cfg["drift"], "tuned": str(args.tuned) if Path(args.tuned).is_file() else None},
               "summary": summary, "runs": runs, "seconds": time.perf_counter() - t0,
               "load_average_after": list(os.getloadavg())}
    out = write_json(path, payload)
    plot(payload, args.out / "continual_ablation.png")
    for part, rows in summary.items():
        print(f"{part}:")
        for v, r in rows.items():
            keys = ("acc_current", "prequential") if part.startswith("drifting") else ("accuracy",)
            vals = "  ".join(f"{k} {r[f'{k}_mean']:.4f}±{r[f'{k}_std']:.4f} {r.get(f'{k}_vs_full') or ''}"
                             for k in keys if f"{k}_mean" in r)
            print(f"  {v:40s} {vals}  {r['bytes_mean'] / 1e6:.2f} MB  {r['wall_s_mean']:.0f} s")
    print(f"wrote {out} and {args.out / 'continual_ablation.png'}")
    return payload


if __name__ == "__main__":
    main()
