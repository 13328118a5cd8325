"""Why a growing network with a residual block forgets under a budget: the features under its readout move.

A growing network's readout stores rows whose keys ``k`` are the query ``q`` it saw: the residual
block's output for a training sample, RMS-normalised (Eq. 13). The block keeps learning after an
experience ends — it appends error-driven rows and, at its cap, evicts rows — so it maps the same input to
another ``q`` later, while the readout's rows of the earlier classes keep the keys of the features they
were stored under. This diagnostic measures how much of the forgetting that explains.

Split-MNIST, online (the frontier's protocol and settings, ``benchmarks/continual_frontier.py``), at a
memory budget; evaluated on the **validation** split carved from the training data (the test split is not
read). After every experience ``j`` (``run_continual``'s ``on_experience`` hook), for the held-out samples
of every experience ``e <= j``:

* ``acc_now`` — the network's accuracy (the readout over the block's current features ``q_j(x)``);
* ``acc_stale`` — the *current* readout over the features the same samples had when their experience
  ended, ``q_e(x)``: what the readout's rows would answer had the block not moved since;
* ``drift`` — the median relative move of the features, ``|q_j(x) − q_e(x)| / |q_e(x)|``;
* ``rows`` — the block's and the readout's rows in use, by the experience that appended them and by the
  experience whose classes they hold (self-replay appends rows of earlier classes again).

``acc_stale − acc_now`` on the earlier experiences, paired by seed (Student t-test at 95 %, else a tie), is
the accuracy the block's feature drift costs. The readout-only network (``net:readout_replay_dct``: the
fixed DCT keys are its features) is the control: its drift is 0 and its two accuracies are equal.

    python benchmarks/block_drift.py --preset smoke    # seconds (run by the tests)
    python benchmarks/block_drift.py --preset cpu      # ~25 min on 2 cores
    python benchmarks/block_drift.py --preset cpu --methods net:replay_dct --merge    # one method, merged

Writes ``block_drift.json`` (``summary.<method>.{acc_now_old, acc_stale_old, drift_old, stale_minus_now,
rows_block_by_experience}``) and ``block_drift.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import continual_frontier as cf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: held-out samples measured at once
CHUNK = 512
STREAM = "split_mnist"
#: the block nets the frontier runs, and the readout alone as the control
METHODS = ("net:replay_dct", "net:replay_dct_evict_smallest", "net:readout_replay_dct")
PRESETS = {
    "smoke": dict(seeds=[1], budget="0.2MB", options=dict(train_limit=300, test_limit=150),
                  methods=("net:replay_dct", "net:readout_replay_dct")),
    "cpu": dict(seeds=[1, 2, 3, 4, 5], budget="1MB", options={}, methods=METHODS),
}


class Probe:
    """The ``on_experience`` hook: the measurements of one (method, seed) run after each experience."""

    def __init__(self):
        self.records = []           # one per (method, seed, experience)
        self._stale = {}            # (method, seed, e) -> q_e(x) of experience e's held-out samples
        self._data = {}             # (seed, e) -> (x, y) of experience e's held-out samples
        self._clock = {}            # (method, seed) -> [each layer's memory clock t at each experience's end]
        self._measure = {}          # method -> its jitted measurement

    def __call__(self, info):
        from growmem import layers
        from growmem.continual.fast import materialize
        from growmem.policies import stored_labels
        from growmem.train import layer_key

        learner, stream, j = info["learner"], info["stream"], info["experience"]
        run = (info["method"], info["seed"])
        (net,) = learner.trainers.values()      # class-incremental: one model, no task labels
        tr = net.trainer
        mems = {layer_key(p): m for p, m in tr.memories().items()}
        self._clock.setdefault(run, []).append({k: int(m.t) for k, m in mems.items()})
        variables = {k: v for k, v in tr.variables.items() if k not in ("intermediates", "perturbations")}
        if info["method"] not in self._measure:
            import jax

            def measure(variables, readout, x, stale):
                """The readout's queries of ``x`` now, and its answers to them and to ``stale`` queries."""
                _, upd = tr.model.apply(variables, x, mutable=["intermediates"])
                q = upd["intermediates"]["readout"]["q"][0]
                return q, layers.retrieve(readout, q).argmax(-1), layers.retrieve(readout, stale).argmax(-1)

            self._measure[info["method"]] = jax.jit(measure)
        probes = []
        for e in range(j + 1):
            if (info["seed"], e) not in self._data:
                x, y, _ = materialize(stream.test_stream[e].dataset.eval())
                self._data[(info["seed"], e)] = (net.inputs(learner.as_inputs(x)), np.asarray(y))
            x, y = self._data[(info["seed"], e)]
            stale = self._stale.get(run + (e,), np.zeros((len(x), x.shape[1]), np.float32))
            q, now, then = [], [], []
            for lo in range(0, len(x), CHUNK):      # fixed-size chunks (the last padded): one compilation
                n = min(CHUNK, len(x) - lo)
                pad = lambda a: np.pad(a[lo:lo + n], [(0, CHUNK - n), (0, 0)])  # noqa: E731
                out = self._measure[info["method"]](variables, mems["readout"], pad(x), pad(stale))
                for acc, o in zip((q, now, then), out):
                    acc.append(np.asarray(o)[:n])
            q, now, then = (np.concatenate(a) for a in (q, now, then))
            if e == j:      # the features of its own time: its stale queries from now on
                self._stale[run + (e,)], stale, then = q, q, now
            move = np.linalg.norm(q - stale, axis=1) / np.maximum(np.linalg.norm(stale, axis=1), 1e-12)
            probes.append({"experience": e, "n": int(len(y)), "acc_now": float((now == y).mean()),
                           "acc_stale": float((then == y).mean()), "drift": float(np.median(move))})
        clocks = self._clock[run]
        rows, by_class = {}, {}
        for k, m in mems.items():
            born = m.rows()["born"]
            edges = [-np.inf] + [c[k] for c in clocks]
            rows[k] = [int(((born > lo) & (born <= hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])]
            labels = stored_labels((tr.state.policy_state or {}).get(k))
            if labels is not None:     # self-replay appends rows of earlier classes again: whose rows are kept
                labels = np.asarray(labels)[:len(born)]
                by_class[k] = [int(np.isin(labels, np.unique(self._data[(info["seed"], e)][1])).sum())
                               for e in range(j + 1)]
        self.records.append({"method": info["method"], "seed": info["seed"], "after": j, "probes": probes,
                             "rows_by_experience": rows, "rows_by_class_experience": by_class})


def summarize(records):
    """Per method, after the last experience: the earlier experiences' accuracies now and on stale features
    (mean over experiences, then mean ± std over seeds), their paired difference, the drift, the rows."""
    from growmem.reporting import compare, mean_std

    out = {}
    for method in dict.fromkeys(r["method"] for r in records):
        last = max(r["after"] for r in records if r["method"] == method)
        finals = sorted((r for r in records if r["method"] == method and r["after"] == last), key=lambda r: r["seed"])
        old = lambda r, key: float(np.mean([p[key] for p in r["probes"] if p["experience"] < last]))  # noqa: E731
        now = [old(r, "acc_now") for r in finals]
        stale = [old(r, "acc_stale") for r in finals]
        row = {"seeds": [r["seed"] for r in finals], "after_experience": last}
        for name, vals in (("acc_now_old", now), ("acc_stale_old", stale),
                           ("drift_old", [old(r, "drift") for r in finals]),
                           ("acc_now_last", [r["probes"][-1]["acc_now"] for r in finals])):
            m = mean_std(vals)
            row[f"{name}_mean"], row[f"{name}_std"] = m["mean"], m["std"]
        row["stale_minus_now"] = {"difference": float(np.mean(np.subtract(stale, now))),
                                  "verdict": compare(stale, now, paired=True)}
        for what in ("rows_by_experience", "rows_by_class_experience"):
            for layer in finals[0][what]:
                row[f"{what.replace('rows', 'rows_' + layer.split('/')[0], 1)}"] = np.mean(
                    [r[what][layer] for r in finals], axis=0).round(1).tolist()
        out[method] = row
    return out


def plot(payload, path):
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5))
    for i, method in enumerate(payload["summary"]):
        recs = [r for r in payload["records"] if r["method"] == method and r["after"] > 0]
        afters = sorted({r["after"] for r in recs})
        for key, style in (("acc_now", "-"), ("acc_stale", ":")):
            ys = [np.mean([np.mean([p[key] for p in r["probes"] if p["experience"] < j])
                           for r in recs if r["after"] == j]) for j in afters]
            a.plot([j + 1 for j in afters], ys, style, color=f"C{i}", marker="o",
                   label=f"{method}: {'current features' if key == 'acc_now' else 'features at their experience'}")
        ys = [np.mean([np.mean([p["drift"] for p in r["probes"] if p["experience"] < j])
                       for r in recs if r["after"] == j]) for j in afters]
        b.plot([j + 1 for j in afters], ys, color=f"C{i}", marker="o", label=method)
    for ax in (a, b):
        ax.set_xlabel("after experience")
        ax.xaxis.get_major_locator().set_params(integer=True)
    a.set_ylabel("accuracy on the earlier experiences")
    a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.15), ncol=2)
    b.set_ylabel("feature move: median |q_now − q_then| / |q_then|")
    b.legend(fontsize=7)
    fig.suptitle(f"{payload['config']['stream']}, online, {payload['config']['budget']}, validation split, "
                 f"mean over seeds", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    ap.add_argument("--tuned", type=Path, default=RESULTS / "continual_frontier_tune.json",
                    help="the frontier's tuning file: the settings chosen on validation at the budget")
    ap.add_argument("--methods", default=None, help="comma-separated subset of the preset's methods")
    ap.add_argument("--merge", action="store_true", help="add these runs to the block_drift.json in --out "
                                                         "(replacing the same method and seed)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from growmem.runtime import compilation_cache
    compilation_cache()     # seeds and methods after the first load the programs they share instead of compiling

    from growmem.reporting import write_json
    from growmem.units import byte_budget

    cfg = PRESETS[args.preset]
    methods = cfg["methods"] if args.methods is None else tuple(m.strip() for m in args.methods.split(",") if m.strip())
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"unknown method(s) {bad}: this diagnostic measures the growing networks {', '.join(METHODS)}")
    budget = byte_budget(cfg["budget"])
    tuned = cf.chosen_settings(args.tuned).get(STREAM, {}).get(str(budget), {})
    path = args.out / "block_drift.json"
    old = json.loads(path.read_text()) if args.merge and path.is_file() else {}
    t0 = time.perf_counter()
    probe, runs = Probe(), []
    for m in methods:
        for r in cf.run_one(STREAM, m, cfg["seeds"], budget, cfg["options"], data_dir=args.data_dir,
                            settings=tuned.get(m), split="validation", progress=not args.no_progress,
                            on_experience=probe):
            # the run's own evaluation (FastLoop.eval): the accuracies the probes' acc_now must equal
            runs.append({"method": m, "seed": r["seed"], "accuracy_matrix": r["accuracy_matrix"],
                         "bytes_peak": r["summary"]["bytes_in_use_peak"], "within_budget": r["summary"]["within_budget"]})
        print(f"{m}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    fresh = {(r["method"], r["seed"]) for r in runs}
    keep = lambda rs: [r for r in old.get(rs, []) if (r["method"], r["seed"]) not in fresh]  # noqa: E731
    records, runs = keep("records") + probe.records, keep("runs") + runs
    records.sort(key=lambda r: (METHODS.index(r["method"]), r["seed"], r["after"]))
    runs.sort(key=lambda r: (METHODS.index(r["method"]), r["seed"]))
    command = "python benchmarks/block_drift.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"benchmark": "block_drift", "preset": args.preset, "command": command,
               "commands": old.get("commands", []) + [command],
               "config": {"stream": STREAM, "budget": cfg["budget"], "budget_bytes": budget, "seeds": cfg["seeds"],
                          "stream_options": cfg["options"], "protocol": "online", "split": "validation",
                          "settings": {**old.get("config", {}).get("settings", {}), **{m: tuned.get(m) for m in methods}},
                          "tuned": str(args.tuned) if args.tuned.is_file() else None},
               "summary": summarize(records), "records": records, "runs": runs, "seconds": time.perf_counter() - t0,
               "load_average_after": list(os.getloadavg())}
    out = write_json(path, payload)
    plot(payload, args.out / "block_drift.png")
    for m, r in payload["summary"].items():
        verdict = r["stale_minus_now"]["verdict"]
        print(f"{m:32s} earlier experiences: now {r['acc_now_old_mean']:.3f}±{r['acc_now_old_std']:.3f}, on the "
              f"features of their time {r['acc_stale_old_mean']:.3f}±{r['acc_stale_old_std']:.3f} ({verdict}); "
              f"drift {r['drift_old_mean']:.3f}")
    print(f"wrote {out} and {args.out / 'block_drift.png'}")
    return payload


if __name__ == "__main__":
    main()
