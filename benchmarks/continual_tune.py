"""Choose every continual method's hyperparameters on a validation split (never the test split).

Each stream's validation split holds out 10 % of each class's training images (fixed by the seed,
``growmem.continual.streams.validation_indices``); the methods train on the other 90 % and are scored on
the held-out part after the last experience (the mean over experiences of the final accuracy: what the
benchmark reports). The tuning runs use seed 0, which the benchmark's seeds (1, 2, 3) do not, so the class
orders, permutations and rotations differ too. Every grid point runs once; the best point is ``chosen``
(a point over the memory budget is never chosen). Where the chosen value of a numeric setting is the
smallest or largest tried, the grid goes on past it (:data:`EXTEND_STEPS`), and ``on_edge`` gives the
reason for any chosen value still on an edge. ``benchmarks/continual.py`` then runs with the chosen
settings, and ``growmem/continual/baselines.py: TUNED`` holds the same values for the command line (a test
checks they agree).

    python benchmarks/continual_tune.py --preset smoke                    # seconds (run by the tests)
    python benchmarks/continual_tune.py --preset cpu --streams split_mnist --methods ewc,lwf --merge

Writes ``continual_tune.json`` (``streams.<stream>.<method>.{grid, results, chosen, metric}``; ``summary``:
the chosen value per stream and method) and ``continual_tune.png``. ``--merge`` adds to the file in
``--out``. A method without a grid is recorded with its preset or recipe and ``chosen: {}``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import flat_settings, newer_point  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STREAMS = ("split_mnist", "permuted_mnist", "rotated_mnist", "drifting_teacher")
BUDGET = "15.7MB"
SEED = 0


def _grid(**axes):
    """Every combination of the axes, as settings dicts."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def _over(**axes):
    """A grid of a growmem method's preset overrides (``{"overrides": {"section.key": v}}``)."""
    return [{"overrides": g} for g in _grid(**axes)]


#: the grid of each method (settings as run_continual's method_settings take them); the shared baseline
#: settings are growmem/continual/baselines.py's SETTINGS and RECIPES
GRIDS = {
    "target:dct": _over(**{"keys.n": [8, 10, 12], "keys.deskew": [True, False]}),
    "target:subspaces": _over(**{"keys.dim": [20, 30], "keys.rho": [0.5, 0.6]}),
    "net:replay_dct": _over(**{"model.n_blocks": [1, 0], "readout.temperature": [0.5, 1.0], "replay.samples": [16, 32, 64]}),
    "net:replay_proj": _over(**{"model.n_blocks": [0, 1], "readout.temperature": [0.5, 1.0], "replay.samples": [16, 32]}),
    "net:drift_discount": [g for g in _over(**{"policy.0.factor": [1.0, 0.3], "policy.0.gamma": [0.0, 0.003, 0.01],
                                               "policy.0.threshold": [0.1, 0.25, 0.5]})
                           if not (g["overrides"]["policy.0.factor"] == 1.0 and g["overrides"]["policy.0.gamma"] == 0)],
    "knn:dct": _over(k=[1, 3, 5, 10]), "knn:raw": _over(k=[1, 3, 5, 10]),
    "slda:dct": _over(shrinkage=[1e-4, 1e-2, 1e-1]), "slda:raw": _over(shrinkage=[1e-4, 1e-2, 1e-1]),
    "ewc": _grid(ewc_lambda=[1.0, 10.0, 100.0, 1000.0, 10000.0]),
    "lwf": _grid(lwf_alpha=[0.5, 1.0, 2.0], lwf_temperature=[1.0, 2.0]),
    "replay_bytes": _grid(epochs=[1, 3, 10, 20], lr=[0.01, 0.05]),
    "cumulative": _grid(epochs=[1, 3], lr=[0.01, 0.05]),
    "joint": _grid(epochs=[3, 10], lr=[0.01, 0.05], schedule=["cosine"]),
}
#: methods that take another method's chosen settings (same recipe family)
SHARED = {"replay_4400": "replay_bytes"}
#: methods run once as they are: their published recipe (gdumb), no hyperparameter (ncm), the lower bound
FIXED = ("gdumb", "ncm:dct", "ncm:raw", "naive")
METHODS = {
    "split_mnist": ("target:dct", "net:replay_dct", "knn:dct", "ncm:dct", "slda:dct", "knn:raw", "ncm:raw", "slda:raw", "replay_bytes",
                    "gdumb", "cumulative", "joint", "naive", "ewc", "lwf"),
    "permuted_mnist": ("target:subspaces", "net:replay_proj", "knn:raw", "ncm:raw", "slda:raw", "replay_bytes", "gdumb", "cumulative",
                       "joint", "naive", "ewc", "lwf"),
}
METHODS["rotated_mnist"] = METHODS["permuted_mnist"]
METHODS["drifting_teacher"] = ("net:drift_discount",)

PRESETS = {
    "smoke": dict(stream_options={"split_mnist": dict(train_limit=1000), "permuted_mnist": dict(
        n_experiences=3, train_limit=500), "rotated_mnist": dict(n_experiences=3, train_limit=500),
        "drifting_teacher": dict(n_experiences=2, train_limit=200)}, grid_limit=2, epochs_cap=2),
    # the streams of benchmarks/continual.py's cpu preset: Permuted- and Rotated-MNIST as 10 experiences of the
    # same 6,000 training images (60,000 samples in all: every method's grid runs on the whole stream)
    "cpu": dict(stream_options={"split_mnist": {},
                                "permuted_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000},
                                "rotated_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000},
                                "drifting_teacher": {}},
                grid_limit=None, epochs_cap=None, method_options={}),
}


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _key(settings) -> str:
    return json.dumps(settings, sort_keys=True)


#: how far a grid goes past its ends: while the chosen point sits at the smallest or largest value tried of a
#: numeric setting, one more value beyond that end is tried (the chosen point with that setting moved; the
#: next value continues the geometric spacing of the two end values, rounded for integer settings), at most
#: EXTEND_STEPS times per end. A setting at a bound (0 or 1 for a count) or one the method refuses past its
#: end is not extended, and the JSON says why (``on_edge``)
EXTEND_STEPS = 2
#: ``{method: {setting: {value: reason}}}``: a chosen value on its grid's edge that is not extended past, and
#: why (the value too: one epoch is the low end, while a grid whose top epochs won goes on)
EDGE_REASONS = {m: {"epochs": {1: "one epoch per experience is the fewest an offline run takes"}}
                for m in ("replay_bytes", "replay_4400", "cumulative", "joint")}
#: ``{setting: reason}`` for every method
SETTING_REASONS = {"model.n_blocks": "a network has 0 or 1 residual block in the presets"}


def _with(settings: dict, key: str, value) -> dict:
    """``settings`` with ``key`` (a top-level setting or a preset override) set to ``value``."""
    if key in settings.get("overrides", {}):
        return {**settings, "overrides": {**settings["overrides"], key: value}}
    return {**settings, key: value}


def _beyond(end, neighbour):
    """The value past ``end`` continuing the geometric spacing from ``neighbour`` (an integer for integer
    settings), or None at a bound."""
    from growmem.repro.core import _next_value

    nxt = _next_value(end, neighbour, "log")
    if nxt is None or not isinstance(end, int):
        return nxt
    nxt = int(round(nxt))
    return None if nxt == end or nxt < 1 else nxt


def edges(method: str, results, chosen, extended=None) -> dict:
    """``{setting: {"value", "edge": "low" | "high", "values", "extended", "reason"}}`` for every numeric
    setting of the ``chosen`` point at an end of the values tried (a setting tried at one value is no edge);
    ``reason``: why the grid does not go further (None while it may)."""
    from growmem.repro.core import _numeric

    if chosen is None:
        return {}
    flats = [(flat_settings(r["settings"]), r.get("error")) for r in results]
    out = {}
    for key, v in flat_settings(chosen).items():
        tried = sorted({f[key] for f, err in flats if err is None and _numeric(f.get(key))})
        if not _numeric(v) or len(tried) < 2 or v not in (tried[0], tried[-1]):
            continue
        side = "low" if v == tried[0] else "high"
        end, nb = (tried[0], tried[1]) if side == "low" else (tried[-1], tried[-2])
        refused = [(f[key], err) for f, err in flats if err is not None and _numeric(f.get(key))
                   and (f[key] < v if side == "low" else f[key] > v)]
        n = (extended or {}).get((key, side), 0)
        why = (EDGE_REASONS.get(method, {}).get(key, {}).get(v) or SETTING_REASONS.get(key)
               or (f"{key} = {refused[0][0]} beyond it is refused: {refused[0][1]}" if refused else None)
               or (f"{end} is the bound of {key}" if _beyond(end, nb) is None else None)
               or (f"the extension limit ({EXTEND_STEPS} values beyond the grid) was reached"
                   if n >= EXTEND_STEPS else None))
        out[key] = {"value": v, "edge": side, "values": tried, "extended": n, "reason": why}
    return out


def _extended(entry) -> dict:
    """``{(setting, end): values added past the grid}`` an entry's ``on_edge`` records (a combined file keeps
    the count, so an edge whose extensions ran out keeps its reason)."""
    return {(k, e["edge"]): int(e.get("extended", 0)) for k, e in (entry.get("on_edge") or {}).items()}


def next_points(method: str, results, chosen, extended: dict) -> list:
    """The settings to try next: for each numeric setting of ``chosen`` at an end of its values with no
    reason to stop there, the value beyond it (``extended`` counts the values added per (setting, end))."""
    out = []
    for key, e in edges(method, results, chosen, extended).items():
        if e["reason"] is not None:
            continue
        vals = e["values"]
        nxt = _beyond(*((vals[0], vals[1]) if e["edge"] == "low" else (vals[-1], vals[-2])))
        extended[(key, e["edge"])] = extended.get((key, e["edge"]), 0) + 1
        out.append(_with(chosen, key, nxt))
    return out


def choose(results, budget):
    """The best grid point within the budget (highest validation accuracy; ties: the first listed); for a
    method no point of which fits (cumulative, joint: they keep every sample), the best point."""
    results = [r for r in results if r.get("error") is None]
    ok = [r for r in results if r["within_budget"] is not False] or list(results)
    if not ok:
        return None
    return max(ok, key=lambda r: r["accuracy"])["settings"]


def plot(doc, path):
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    streams = list(doc["streams"])
    fig, axes = plt.subplots(len(streams), 1, figsize=(12, 3.2 * len(streams)), squeeze=False)
    for ax, stream in zip(axes[:, 0], streams):
        labels, vals, colors = [], [], []
        for k, (m, r) in enumerate(doc["streams"][stream].items()):
            for res in r["results"]:
                refused = res["accuracy"] is None
                labels.append(f"{m} {json.dumps(res['settings'], sort_keys=True)[:40]}"
                              + (" (refused)" if refused else ""))
                vals.append(0.0 if refused else res["accuracy"])
                colors.append("C3" if res["settings"] == r["chosen"] else f"C{k % 10}")
        ax.barh(range(len(vals)), vals, color=colors)
        ax.set_yticks(range(len(vals)), labels, fontsize=5)
        ax.set_xlim(0, 1)
        ax.set_xlabel("validation accuracy (chosen: red)")
        ax.set_title(f"{stream} (validation split, seed {SEED})")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--methods", default=None, help="comma-separated methods (default: each stream's)")
    ap.add_argument("--memory-budget", default=BUDGET)
    ap.add_argument("--merge", action="store_true", help="add to the continual_tune.json already in --out")
    ap.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                    help="merge these tuning files (run apart, e.g. one per stream) into --out and stop")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from growmem.runtime import compilation_cache
    compilation_cache()     # seeds and methods after the first load the programs they share instead of compiling

    from growmem.continual.methods import preset_digest, resolve
    from growmem.errors import GrowmemError
    from growmem.continual.runner import run_continual
    from growmem.reporting import write_json
    from growmem.units import parse_size

    cfg = PRESETS[args.preset]
    budget = parse_size(args.memory_budget)
    path = args.out / "continual_tune.json"
    doc = json.loads(path.read_text()) if (args.merge and path.is_file()) else {"streams": {}, "invocations": []}
    if args.combine:
        for other in map(lambda p: json.loads(Path(p).read_text()), args.combine):
            for stream, ms in other["streams"].items():
                for m, entry in ms.items():
                    old = doc["streams"].setdefault(stream, {}).get(m)
                    extended = _extended(entry)
                    if old is not None:   # a later file extends a method's grid: keep every point
                        digest = preset_digest(resolve(m, stream))
                        points = {}
                        for r in old["results"] + entry["results"]:
                            k = (_key(r["settings"]), _key(r.get("stream_options", {})))
                            if k not in points or newer_point(r, points[k], digest):
                                points[k] = r
                        for k, n in _extended(old).items():
                            extended[k] = max(n, extended.get(k, 0))
                        entry = {**entry, "grid": old["grid"] + [g for g in entry["grid"] if _key(g) not in
                                                                 {_key(x) for x in old["grid"]}],
                                 "results": list(points.values())}
                    entry["chosen"] = choose(entry["results"], budget)
                    entry["on_edge"] = edges(m, entry["results"], entry["chosen"], extended)
                    doc["streams"][stream][m] = entry
            doc["invocations"] += other.get("invocations", [])
        for stream, ms in doc["streams"].items():      # a shared method follows its source's final choice
            for other, src in SHARED.items():
                if src in ms:
                    ms[other] = {**ms[src], "shared_with": src}
        doc.update(benchmark="continual_tune", preset=args.preset, seed=SEED, budget_bytes=budget,
                   summary={s: {m: r["chosen"] for m, r in ms.items()} for s, ms in doc["streams"].items()})
        out = write_json(path, doc)
        plot(doc, args.out / "continual_tune.png")
        print(f"wrote {out} and {args.out / 'continual_tune.png'} (combined {len(args.combine)} files)")
        return doc
    t0 = time.perf_counter()
    for stream in _csv(args.streams):
        if stream not in STREAMS:
            raise SystemExit(f"unknown stream {stream!r}; choose from {', '.join(STREAMS)}")
        methods = [m for m in (_csv(args.methods) if args.methods else METHODS[stream]) if m not in SHARED]
        for m in methods:
            grid = GRIDS.get(m, [{}]) if m not in FIXED else [{}]
            if cfg["grid_limit"]:
                grid = grid[:cfg["grid_limit"]]
            opts = {**cfg["stream_options"][stream], **cfg.get("method_options", {}).get(m, {})}
            results, extended = [], {}
            # --merge: a point this file already holds (same settings and stream options) is read back, so a
            # grid run again (extended past an edge) runs only its new points
            # and on the same version of a growmem method's preset file (preset_digest, as the frontier's tuner)
            digest = preset_digest(resolve(m, stream))
            tried = {(_key(r["settings"]), _key(r.get("stream_options", {}))): r for r in
                     doc["streams"].get(stream, {}).get(m, {}).get("results", [])
                     if r.get("error") is None and r.get("preset_digest") == digest}

            def run_point(settings, m=m, opts=opts, tried=tried, digest=digest):
                if (_key(settings), _key(opts)) in tried:
                    return tried[(_key(settings), _key(opts))]
                epochs = None
                if cfg["epochs_cap"] and resolve(m, stream).kind == "avalanche":
                    epochs = {m: min(cfg["epochs_cap"], int(settings.get("epochs", cfg["epochs_cap"])))}
                try:
                    run = run_continual(stream, [m], [SEED], budget, stream_options=opts, data_dir=args.data_dir,
                                        split="validation", method_settings={m: settings} if settings else None,
                                        epochs=epochs, progress=not args.no_progress, threads=args.threads,
                                        verbose=False)
                except GrowmemError as e:   # a value past the grid the method refuses: recorded, never chosen
                    print(f"{stream} {m} {_key(settings)}: refused: {e}", flush=True)
                    return {"settings": settings, "accuracy": None, "error": str(e), "stream_options": opts}
                s = run["runs"][0]["summary"]
                print(f"{stream} {m} {_key(settings)}: validation accuracy {s['acc_mean_over_experiences']:.4f}, "
                      f"{s['bytes_in_use_peak'] / 1e6:.2f} MB, {s['wall_seconds']:.0f} s", flush=True)
                return {"settings": settings, "accuracy": s["acc_mean_over_experiences"],
                        "bytes": s["bytes_in_use_peak"], "within_budget": s["within_budget"],
                        "wall_s": s["wall_seconds"], "stream_options": opts, "preset_digest": digest,
                        "ran_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

            points = list(grid)
            while points:
                results += [run_point(p) for p in points]
                points = [] if cfg["grid_limit"] else next_points(m, results, choose(results, budget), extended)
            chosen = choose(results, budget)
            entry = {"grid": grid, "results": results, "chosen": chosen,
                     "on_edge": edges(m, results, chosen, extended),
                     "metric": "acc_mean_over_experiences on the validation split",
                     "fixed": m in FIXED, "stream_options": opts}
            doc["streams"].setdefault(stream, {})[m] = entry
            for other, src in SHARED.items():
                if src == m:
                    doc["streams"][stream][other] = {**entry, "shared_with": m}
    doc["invocations"] = doc.get("invocations", []) + [{
        "command": "python benchmarks/continual_tune.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seconds": time.perf_counter() - t0, "load_average_after": list(os.getloadavg()),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S")}]
    doc.update(benchmark="continual_tune", preset=args.preset, seed=SEED, budget_bytes=budget,
               summary={s: {m: r["chosen"] for m, r in ms.items()} for s, ms in doc["streams"].items()})
    out = write_json(path, doc)
    plot(doc, args.out / "continual_tune.png")
    for stream, ms in doc["summary"].items():
        for m, chosen in ms.items():
            print(f"{stream} {m}: chosen {chosen}")
    print(f"wrote {out} and {args.out / 'continual_tune.png'}")
    return doc


if __name__ == "__main__":
    main()
