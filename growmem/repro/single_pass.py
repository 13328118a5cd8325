"""``single-pass`` — Fig. 2/Right, App. G.2, Fig. 9: one pass over the training set.

Growing nets (the shipped presets ``weighted_softmax`` = GWS, Alg. 3; ``gauge``, Alg. 2;
``rbf``, Alg. 5; ``hybrid``, Alg. 4 — each L = 2 blocks + readout, B = 16, the App. G.2
hyperparameters) against the residual MLP of Eq. 12 trained with SGD, Adam, AdamW, RMSProp,
Muon, Mesa (App. E, Table 9) and Delta-rule GD (Eq. 122, Table 10), each swept over its
learning rates on the first seed (grids extended while the best sits at an end) and kept at its
best (App. F.1), and the classical baselines of App. F.10: kNN (the F.10.2 grid) and RBF kernel
ridge (F.10.1, median heuristic, exact solver). Every model runs on every seed (a seed: the
training subset and its order, the initialisation).

``summary.metrics["accuracy/<model>"]`` (mean ± std over seeds) and ``summary.rows.<model>`` (rows
stored after the pass, all layers; the training points a kNN / kernel machine keeps; 0 for an MLP);
``summary.claims.growing_beats_mlps`` (Fig. 2/Right: GWS and RBF each above every parametric MLP,
by a paired Student t-test at 95 %); on all of MNIST ``summary.bar`` compares GWS / gauge /
RBF with the public reference implementation's single pass on this machine (issue 12: 98.10 %,
98.30 %, 96.37 %, within ± 0.5 points).
"""
from __future__ import annotations

import jax
import numpy as np

from .. import classical
from . import core, runs
from .core import Context, Experiment

GROWING = ("weighted_softmax", "gauge", "rbf", "hybrid")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "muon", "mesa", "delta")
MLPS = tuple(f"mlp_{o}" for o in OPTIMIZERS)
CLASSICAL = ("knn", "kernel_ridge")
MODELS = GROWING + MLPS + CLASSICAL
#: Table 12's learning-rate grid (F.9)
LR_GRID = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]
#: the public reference implementation of the paper, one pass over all of MNIST, B = 16, L = 2 (issue 12)
REFERENCE_MNIST = {"weighted_softmax": 0.9810, "gauge": 0.9830, "rbf": 0.9637}
BAR_POINTS = 0.005
MNIST_TRAIN = 60_000

_SMOKE_GRIDS = {o: {"lr": [1e-2]} for o in OPTIMIZERS}
_SMOKE_GRIDS["adamw"] = {"lr": [1e-2], "wd": [1e-4]}
_SMOKE_GRIDS["mesa"] = {"lr": [1e-2], "lam": [0.1], "gamma": [0.99]}
_SMOKE_GRIDS["delta"] = {"lr": [1e-2], "lam": [1e-4]}
_LR = {"lr": 2}

PRESETS = {
    # generated data (no files), ten steps of six of the models (one of each kind of code), two seeds
    # growing_n_blocks: L of the growing nets (None: the shipped preset's, L = 2, the hybrid's 3); smoke
    # uses L = 1 and a one-block MLP: compiling the models is most of its time
    "smoke": dict(dataset="synthetic", n_train=160, n_test=64, d=256, batch=16, seeds=[0, 1],
                  models=["weighted_softmax", "rbf", "mlp_sgd", "mlp_mesa", "knn", "kernel_ridge"],
                  growing_n_blocks=1, mlp=dict(n_blocks=1, hidden=32), mlp_hidden={}, grids=_SMOKE_GRIDS,
                  extend={}, edge_reasons={},
                  knn=dict(ks=[5, 10]), kernel_ridge=dict(n_train=160, select_n=96, gamma_mult=[1.0],
                                                          lam=[0.1, 1.0]),
                  reference=REFERENCE_MNIST),
    # 20,000 MNIST training images once (a random subset per seed), the 10,000 test images, 3 seeds: one pass
    # over all 60,000 is ~1 h a seed here (every model), so the bar against the reference implementation —
    # defined on all of MNIST — is checked only with n_train = 60000 (an override)
    "cpu": dict(dataset="mnist", n_train=20_000, n_test=10_000, batch=16, seeds=[0, 1, 2], models=list(MODELS),
                growing_n_blocks=None,
                # the MLPs at the paper's width (hidden = d_e = 784) but Muon's and Mesa's: their 784x784
                # orthogonalisation and preconditioners cost ~0.7-1 s a step on this shared 2-core machine
                mlp=dict(n_blocks=2, hidden=None), mlp_hidden={"muon": 256, "mesa": 256},
                grids={"sgd": {"lr": LR_GRID}, "adam": {"lr": LR_GRID}, "rmsprop": {"lr": LR_GRID},
                       "adamw": {"lr": [3e-4, 1e-3, 3e-3], "wd": [1e-4, 1e-2]},
                       "muon": {"lr": [1e-3, 3e-3, 1e-2]},
                       "mesa": {"lr": [3e-4, 1e-3, 3e-3], "lam": [0.01, 0.1], "gamma": [0.99]},
                       "delta": {"lr": [1e-3, 3e-3, 1e-2], "lam": [1e-5, 1e-4, 3e-4]}},
                extend={o: _LR for o in OPTIMIZERS},
                edge_reasons={"adamw": {"wd": "Table 12's two weight decays"},
                              "mesa": {"lam": "two of Table 9's λ (each Mesa run is slow here)"},
                              "delta": {"lam": "Table 10's λ grid around the earlier choice"}},
                knn=dict(ks=list(classical.KNN_K_GRID)),
                # the exact solver on 20,000 images: a 1.6 GB Gram matrix (+ its factor); all 60,000 would need
                # 14.4 GB per copy on this 23 GB machine. λ and γ_mult chosen on the first 5,000, then refit.
                kernel_ridge=dict(n_train=20_000, select_n=5_000, gamma_mult=list(classical.KRR_GAMMA_MULT_GRID),
                                  lam=list(classical.KRR_LAMBDA_GRID)),
                reference=REFERENCE_MNIST),
    # Fig. 2/Right and App. G.2 as printed: non-augmented CIFAR-10, d = 3072, B = 16, L = 2, 5 seeds
    "paper": dict(dataset="cifar10", n_train=None, n_test=None, batch=16, seeds=[0, 1, 2, 3, 4], models=list(MODELS),
                  growing_n_blocks=None,
                  mlp=dict(n_blocks=2, hidden=None), mlp_hidden={},   # d_e = 3072 (Table 12; L in [2, 4])
                  grids={"sgd": {"lr": LR_GRID}, "adam": {"lr": LR_GRID}, "rmsprop": {"lr": LR_GRID},
                         "adamw": {"lr": LR_GRID, "wd": [1e-4, 1e-2]}, "muon": {"lr": LR_GRID},
                         "mesa": {"lr": LR_GRID, "lam": [0.001, 0.01, 0.1], "gamma": [0.9, 0.99, 1.0]},
                         "delta": {"lr": LR_GRID, "lam": [3e-7, 1e-6, 3e-6, 1e-5, 1e-4, 3e-4]}},
                  extend={}, edge_reasons={"*": "the paper's grid (Tables 9, 10, 12), not extended"},
                  knn=dict(ks=list(classical.KNN_K_GRID)),
                  kernel_ridge=dict(n_train=None, select_n=None, gamma_mult=list(classical.KRR_GAMMA_MULT_GRID),
                                    lam=list(classical.KRR_LAMBDA_GRID)),
                  reference=None,
                  # App. G.2 (mean ± std over seeds); the MLP, kNN and SVM points of Fig. 2/Right are only plotted
                  paper={"weighted_softmax": 0.594, "rbf": 0.588, "gauge": 0.584}),
}


def _growing(ctx, cfg, data, name, seed):
    pre, tr = runs.preset_trainer({**cfg, "seed": seed}, data, name)
    r = runs.run_growing(ctx, tr, data, batch=cfg["batch"], epochs=1, seed=seed, label=name)
    r["preset"] = {"name": name, "description": pre.description, "n_blocks": pre.n_blocks}
    return r


def _knn(ctx, cfg, data, xtr, xte):
    ctx.status("knn (F.10.2 grid)")
    preds = classical.knn_grid(xte, xtr, data.y, ks=cfg["knn"]["ks"], n_classes=data.classes)
    grid = {f"{m}/{w}/k={k}": float(np.mean(np.asarray(p) == data.yt)) for (m, w, k), p in preds.items()}
    best = max(grid, key=grid.get)
    return {"accuracy": grid[best], "best": best, "grid": grid, "rows": len(xtr)}


def _kernel_ridge(ctx, cfg, data, xtr, xte):
    """F.10.1: γ = γ_mult / median ‖x_i − x_j‖² (2048-image subsample), α = (K + λI)⁻¹ Y; γ_mult and
    λ chosen on the first ``select_n`` images (test accuracy, App. F.1), then refit on ``n_train``."""
    kr = cfg["kernel_ridge"]
    n = len(xtr) if kr["n_train"] is None else min(kr["n_train"], len(xtr))
    n_sel = n if kr["select_n"] is None else min(kr["select_n"], n)
    y1 = np.asarray(jax.nn.one_hot(data.y, data.classes))
    med = float(classical.median_heuristic(xtr[:n]))
    scores = {}
    for gm in kr["gamma_mult"]:
        for lam in kr["lam"]:
            ctx.status(f"kernel ridge gamma_mult={gm} lam={lam} (N={n_sel})")
            try:
                model = classical.fit_kernel_ridge(xtr[:n_sel], y1[:n_sel], gamma=gm / med, lam=lam,
                                                   max_exact=max(n, classical.MAX_EXACT))
            except FloatingPointError:   # a too small λ in float32: that setting is out
                scores[f"{gm}/{lam}"] = None
                continue
            pred = np.asarray(classical.kernel_ridge_predict(model, xte)).argmax(-1)
            scores[f"{gm}/{lam}"] = float(np.mean(pred == data.yt))
    ok = {k: v for k, v in scores.items() if v is not None}
    best = max(ok, key=ok.get)
    gm, lam = (float(v) for v in best.split("/"))
    if n_sel != n:
        ctx.status(f"kernel ridge refit on {n} images")
        model = classical.fit_kernel_ridge(xtr[:n], y1[:n], gamma=gm / med, lam=lam, max_exact=max(n, classical.MAX_EXACT))
        acc = float(np.mean(np.asarray(classical.kernel_ridge_predict(model, xte)).argmax(-1) == data.yt))
    else:
        acc = ok[best]
    return {"accuracy": acc, "rows": n, "gamma_mult": gm, "lam": lam, "median_sq_distance": med,
            "selection_n": n_sel, "selection_grid": scores}


def _mlp_cfg(cfg, opt):
    hidden = (cfg.get("mlp_hidden") or {}).get(opt)
    return {**cfg["mlp"], "hidden": hidden} if hidden is not None else cfg["mlp"]


def edge_reasons(cfg, opt):
    """``{axis: why not extended}`` for one optimizer's grid: ``edge_reasons["*"]`` for every axis, then
    ``edge_reasons[opt]``."""
    r = cfg.get("edge_reasons") or {}
    out = {axis: r["*"] for axis in cfg["grids"][opt]} if "*" in r else {}
    out.update(r.get(opt, {}))
    return out


def run(ctx: Context, cfg: dict) -> dict:
    seeds = core.seeds_of(cfg)
    data_of = core.SeededImages(cfg, ctx)
    first = data_of(seeds[0])
    b = cfg["batch"]
    models = [m for m in MODELS if m in cfg["models"]]
    steps = len(first.x) // b
    n_runs = len(seeds) * sum(1 for m in models if m in (GROWING + MLPS))
    n_runs += sum(len(core.grid(cfg["grids"][m[4:]])) - 1 for m in models if m in MLPS)   # (+ extensions)
    ctx.start(n_runs * steps)
    chosen, sweeps, edges, best = {}, {}, {}, {}
    for m in models:   # the MLPs' hyperparameters, chosen on the first seed
        if m in MLPS:
            opt = m[4:]
            sw = runs.mlp_sweep(ctx, first, opt, core.grid(cfg["grids"][opt]), mlp=_mlp_cfg(cfg, opt), batch=b,
                                seed=seeds[0], key=m, extend=(cfg.get("extend") or {}).get(opt),
                                reasons=edge_reasons(cfg, opt))
            chosen[m], edges[m], best[m] = sw["best"]["hyper"], sw["edges"], sw["best"]
            sweeps[m] = [{k: v for k, v in r.items() if k != "curve"} for r in sw["runs"]]
    results = {m: [] for m in models}
    for s in seeds:
        data = data_of(s)
        classical_in = None
        for m in models:
            if m in GROWING:
                r = ctx.cached(["growing", m, "seed", s], lambda m=m: _growing(ctx, cfg, data, m, s), steps)
            elif m in MLPS and s == seeds[0]:
                r = best[m]   # the chosen configuration's run of the sweep
            elif m in MLPS:
                opt = m[4:]
                r = ctx.cached([m, "seed", s, chosen[m]], lambda m=m, opt=opt: runs.run_mlp(
                    ctx, data, opt, chosen[m], mlp=_mlp_cfg(cfg, opt), batch=b, seed=s, label=m), steps)
            else:
                classical_in = classical_in or data.classical()
                fn = _knn if m == "knn" else _kernel_ridge
                r = ctx.cached([m, "seed", s], lambda fn=fn: fn(ctx, cfg, data, *classical_in))
            results[m].append(r)
    acc = {m: [r["accuracy"] for r in results[m]] for m in models}
    rows = {}
    for m in models:
        r = results[m][0].get("rows", 0)
        rows[m] = int(sum(r.values())) if isinstance(r, dict) else int(r or 0)
    metrics = {f"accuracy/{m}": core.metric(acc[m]) for m in models}
    growing_winners = [m for m in ("weighted_softmax", "rbf") if m in acc]
    mlps = [m for m in MLPS if m in acc]
    claims = {}
    if growing_winners and mlps:
        claims["growing_beats_mlps"] = core.ordering(
            acc, growing_winners, mlps, claim="in one pass GWS and RBF each beat every parametric MLP")
    ov = core.overall(claims)
    mean = {m: metrics[f"accuracy/{m}"]["mean"] for m in models}
    summary = {"seeds": seeds, "metrics": metrics, "claims": claims, "verdict": ov["verdict"],
               "n_needed": ov["n_needed"], "claim_reproduced": ov["verdict"] == core.REPRODUCED,
               "accuracy": mean, "rows": rows, "samples": steps * b, "dataset": first.name,
               "best_mlp": max(mlps, key=mean.get) if mlps else None,
               "chosen_hyperparameters": chosen, "grid_edges": edges}
    if cfg.get("reference") and first.name == "mnist" and len(first.x) == MNIST_TRAIN:
        summary["bar"] = {m: {"reference": ref, "measured": mean.get(m),
                              "check": core.within(acc.get(m), ref, BAR_POINTS, names=(m, "reference"))}
                          for m, ref in cfg["reference"].items() if m in acc}
    if cfg.get("paper"):
        summary["paper"] = cfg["paper"]
    strip = lambda r: {k: v for k, v in r.items() if k not in ("curve",)}
    return {"summary": summary, "normalisation": first.normalisation,
            "curves": {m: results[m][0].get("curve") for m in models},
            "results": {m: [strip(r) for r in results[m]] for m in models}, "sweeps": sweeps}


def plot(doc, plt):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    s = doc["summary"]
    acc = s["accuracy"]
    for m, c in doc["curves"].items():
        if c:
            style = "-" if m in GROWING else "--"
            a1.plot([x for x, _ in c], [100 * a for _, a in c], style, marker=".", label=m)
    for m in CLASSICAL:
        if m in acc:
            a1.axhline(100 * acc[m], ls=":", lw=1, color="k" if m == "knn" else "0.5", label=f"{m} (not single pass)")
    a1.set_xlabel("training samples seen")
    a1.set_ylabel("test accuracy (%) [curve: first seed, first 2000 test images]")
    a1.set_title("accuracy against samples (Fig. 9)")
    a1.legend(fontsize=7)
    names = list(acc)
    vals = [100 * s["metrics"][f"accuracy/{m}"]["mean"] for m in names]
    errs = [100 * s["metrics"][f"accuracy/{m}"]["std"] for m in names]
    colors = ["C0" if m in GROWING else ("C3" if m in CLASSICAL else "C7") for m in names]
    a2.bar(names, vals, yerr=errs, capsize=2, color=colors)
    lo = min(v for v in vals if v > 0) if any(vals) else 0
    a2.set_ylim(max(0, lo - 5), 100)
    for i, v in enumerate(vals):
        a2.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    a2.set_ylabel(f"final test accuracy (%), mean ± std over {len(s['seeds'])} seeds")
    a2.set_title(f"one pass, {s['samples']} samples ({s['dataset']})")
    for t in a2.get_xticklabels():
        t.set_rotation(60)
        t.set_fontsize(8)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    m = s["metrics"]
    best = s.get("best_mlp")
    acc = lambda k: core.pm(m[f"accuracy/{k}"]) if f"accuracy/{k}" in m else "n/a"
    growing = ", ".join(f"{g} {acc(g)}" for g in ("weighted_softmax", "rbf", "gauge", "hybrid") if f"accuracy/{g}" in m)
    rows = [("Single pass: growing GWS and RBF beat every parametric MLP (SGD/Adam/AdamW/RMSProp/Muon/Mesa/Delta)",
             "CIFAR-10: GWS 59.4 %, RBF 58.8 %, gauge 58.4 % (G.2); every MLP lower (Fig. 2/Right)",
             f"{s['dataset']}, {s['samples']} samples: {growing}; best MLP {best} {acc(best)}; "
             f"kNN {acc('knn')}, kernel ridge {acc('kernel_ridge')}", s["claims"].get("growing_beats_mlps"))]
    for g, b in (s.get("bar") or {}).items():
        rows.append((f"{g} one pass over MNIST, B = 16, L = 2, within ± 0.5 points of the reference implementation",
                     f"reference implementation on this machine: {core.pct(b['reference'])}", acc(g), b["check"]))
    return rows


EXPERIMENT = Experiment(
    name="single-pass", paper="Fig. 2/Right, App. G.2, Fig. 9",
    what="one pass: GWS, gauge, RBF, hybrid vs residual MLP (SGD/Adam/AdamW/RMSProp/Muon/Mesa/Delta), kNN, kernel ridge",
    claim="in one pass the growing GWS and RBF nets beat every parametric MLP, Muon and Mesa included",
    presets=PRESETS, run=run, plot=plot, table=table)
