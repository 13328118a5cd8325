"""``hybrid-capacity`` — Fig. 5, Table 4: accuracy against final capacity of the hybrid weighted
softmax (Alg. 4) over the growth threshold τ, one pass.

The ``hybrid`` preset (L = 3 blocks + readout, no nonlinearity, RMSNorm before every layer,
T = 5, η = 1, β = 30, stored rows trained by Adam 1e-3, B = 16) with the novelty threshold τ
(relative to ‖q‖ = √d: Table 4's τ ∈ [35, 60] at √3072 = 55.4 is 0.63–1.08 √d) and N = n + B
rows per layer at most, against full growth: the same layers under Alg. 3 (every sample a row
in every layer, no Adam). Capacity = rows stored after the pass summed over the 4 layers,
divided by 4N (F.4).

``summary.full_growth_accuracy``, ``summary.points`` = [{tau, capacity_fraction, accuracy}];
``summary.goal`` (issue 3/12): some τ keeps ≤ 20 % of full capacity within 2 points of full growth;
``claim_reproduced`` (Fig. 5: "retains high test accuracy, degrading gracefully"): the goal is met
and accuracy falls monotonically as capacity shrinks.
"""
from __future__ import annotations

import math

import jax
import optax

from .. import config, policies
from ..layers import ResidualGrowingNet
from ..train import Trainer
from . import core, runs
from .core import Context, Experiment, images_for

GOAL_CAPACITY, GOAL_POINTS = 0.20, 0.02

PRESETS = {
    "smoke": dict(dataset="synthetic", n_train=160, n_test=64, d=256, batch=16, seed=0, n_blocks=1,
                  taus=[0.6, 0.9], adam_lr=1e-3, augment=False),
    # all 60,000 MNIST images once; two τ at the knee found on 4,000-8,000 images (0.7-0.8 √d: growth is
    # sublinear, so the capacity fraction at a given τ falls with more data): the shipped preset's 0.72 and 0.8.
    # Each hybrid pass takes ~25 min on 2 cores (Adam over every stored row), so two points, not Table 4's six
    "cpu": dict(dataset="mnist", n_train=60_000, n_test=10_000, batch=16, seed=0, n_blocks=3,
                taus=[0.72, 0.8], adam_lr=1e-3, augment=False),
    # Fig. 5 / Table 4: CIFAR-10 one epoch, d = 3072, N = 50016, τ in {35, ..., 60} (absolute; / 55.4 here);
    # Table 4 also sweeps β in {10, 30, 60}, T in {1, 5, 10}, Adam α in {3e-4, 1e-3, 3e-3}
    "paper": dict(dataset="cifar10", n_train=None, n_test=None, batch=16, seed=0, n_blocks=3,
                  taus=[t / math.sqrt(3072) for t in (35, 40, 45, 50, 55, 60)], adam_lr=1e-3, augment=False),
}


def _trainer(cfg, data, tau):
    pre = config.load("hybrid")
    spec = pre.block
    b = cfg["batch"]
    net = ResidualGrowingNet(d_out=data.classes, n_blocks=cfg["n_blocks"], block=spec, readout=spec,
                             capacity=pre.capacity)
    policy = None   # full growth: Alg. 3, every sample a row in every layer
    if tau is not None:
        n_max = len(data.x) + b   # N: room for one row per sample (Table 4: 50016 = 50000 + 16)
        policy = policies.chain(policies.novelty(tau, relative=True), policies.capacity(n_max, "reject"),
                                policies.hybrid(optax.adam(cfg["adam_lr"])))
    return Trainer(net, sample_input=data.x[:b], rng=jax.random.key(cfg["seed"]), policy=policy)


def run(ctx: Context, cfg: dict) -> dict:
    data = images_for(cfg, ctx, seed=cfg["seed"])
    b = cfg["batch"]
    steps = len(data.x) // b
    ctx.start(steps * (1 + len(cfg["taus"])))
    full_rows = (cfg["n_blocks"] + 1) * (len(data.x) + b)

    def one(tau):
        r = runs.run_growing(ctx, _trainer(cfg, data, tau), data, batch=b, epochs=1, seed=cfg["seed"],
                             label="full growth" if tau is None else f"tau={tau:.3g}")
        r["capacity_fraction"] = r["total_rows"] / full_rows
        return r

    full = ctx.cached(["full"], lambda: one(None), steps)
    points, detail = [], []
    for tau in cfg["taus"]:
        r = ctx.cached(["tau", tau], lambda tau=tau: one(tau), steps)
        points.append({"tau": tau, "capacity_fraction": r["capacity_fraction"], "accuracy": r["accuracy"]})
        detail.append({"tau": tau, "tau_absolute": tau * math.sqrt(data.d), **r})
    ok = [p for p in points if p["capacity_fraction"] <= GOAL_CAPACITY
          and p["accuracy"] >= full["accuracy"] - GOAL_POINTS]
    by_cap = sorted(points, key=lambda p: p["capacity_fraction"])
    graceful = all(a["accuracy"] <= c["accuracy"] + 1e-9 for a, c in zip(by_cap, by_cap[1:]))
    summary = {"full_growth_accuracy": full["accuracy"], "points": points,
               "goal": {"met": bool(ok), "best": min(ok, key=lambda p: p["capacity_fraction"]) if ok else None,
                        "capacity_at_most": GOAL_CAPACITY, "points_lost_at_most": GOAL_POINTS},
               "full_growth_rows": full["total_rows"], "dataset": data.name, "samples": steps * b,
               "graceful": graceful, "claim_reproduced": bool(ok) and graceful}
    return {"summary": summary, "full_growth": full, "hybrid": detail}


def plot(doc, plt):
    s = doc["summary"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    pts = sorted(s["points"], key=lambda p: p["capacity_fraction"])
    ax.plot([p["capacity_fraction"] for p in pts], [100 * p["accuracy"] for p in pts], "o-",
            label="hybrid weighted softmax (Alg. 4)")
    for p in pts:
        ax.annotate(f"τ={p['tau']:.3g}√d", (p["capacity_fraction"], 100 * p["accuracy"]), textcoords="offset points",
                    xytext=(4, -10), fontsize=7)
    ax.plot([1.0], [100 * s["full_growth_accuracy"]], "*", ms=12, color="C3", label="full growth (Alg. 3)")
    ax.axhline(100 * (s["full_growth_accuracy"] - GOAL_POINTS), ls=":", color="0.5", lw=0.8,
               label="full growth − 2 points")
    ax.axvline(GOAL_CAPACITY, ls="--", color="0.5", lw=0.8, label="20 % capacity")
    ax.set_xscale("log")
    ax.set_xlabel("final capacity (rows / (layers · N))")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{s['dataset']}, one pass over {s['samples']} samples")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    pts = ", ".join(f"τ={p['tau']:.3g}√d: {100 * p['capacity_fraction']:.1f} % cap → {core.pct(p['accuracy'])}"
                    for p in sorted(s["points"], key=lambda p: p["capacity_fraction"]))
    return [("Hybrid growth: ≤ 20 % of full capacity within 2 points of full growth, degrading gracefully (Fig. 5)",
             "CIFAR-10, figure only (Table 4 settings)",
             f"{s['dataset']}: full growth {core.pct(s['full_growth_accuracy'])}; {pts} — "
             f"goal {'met' if s['goal']['met'] else 'NOT met'}, {'graceful' if s['graceful'] else 'not monotonic'}")]


EXPERIMENT = Experiment(
    name="hybrid-capacity", paper="Fig. 5, Table 4 (App. F.4)",
    what="hybrid weighted softmax: accuracy against final capacity over the growth threshold tau, one pass",
    claim="the hybrid keeps high accuracy at a fraction of full capacity, degrading gracefully",
    presets=PRESETS, run=run, plot=plot, table=table)
