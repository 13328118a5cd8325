"""``depth-temperature`` — Fig. 3: the growing weighted softmax (GWS, Alg. 3) against depth L and
temperature T, and the post-training linearisation of its exp.

For every L (residual blocks before the readout) and T of the grid, one GWS net (the
``weighted_softmax`` preset's rule, η and β; RMSNorm before every layer) is trained; its test
accuracy is measured as trained and with every layer's ``exp(a)`` replaced by ``1 + a`` after
training (:func:`growmem.repro.temperature.forward`). ``summary.accuracy[L][T]``,
``summary.linearised_accuracy[L][T]``, ``summary.best_T_by_depth``; ``summary.score_bound`` is the
largest possible readout score ``√d / T`` at the best T (Fig. 3's caption: 5.54 for d = 3072, T = 10).

Claims (Fig. 3): accuracy improves with depth (the best L = 1 and L = 2 nets beat L = 0); the
dependence on T is not monotonic (the best T of the deepest net lies inside the grid); the
linearised nets lose much accuracy (more than 10 points). ``claim_reproduced``: all three.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from .. import config
from ..layers import ResidualGrowingNet
from ..train import Trainer
from . import core, runs, temperature as tm
from .core import Context, Experiment, images_for

#: a drop larger than this counts as "severe" (Fig. 3/Right)
SEVERE_DROP = 0.10


def ws_spec(cfg, temperature):
    """The GWS layer of the ``weighted_softmax`` preset (Alg. 3, F.3 D0) at temperature T, with
    the configuration's η and β when it sets them."""
    spec = config.load("weighted_softmax").block
    hyper = dict(spec.hyper)
    hyper.update({k: float(cfg[k]) for k in ("eta", "beta") if cfg.get(k) is not None})
    if "clip" in hyper:
        hyper["clip"] = float(cfg["batch"])   # the public reference clips <s, g> to [-B, B]
    return dataclasses.replace(spec, temperature=float(temperature), hyper=tuple(sorted(hyper.items())),
                               init_rows=cfg["batch"])


def train_ws(ctx, cfg, data, n_blocks, temperature, *, label):
    b = cfg["batch"]
    spec = ws_spec(cfg, temperature)
    tr = Trainer(ResidualGrowingNet(d_out=data.classes, n_blocks=n_blocks, block=spec, readout=spec),
                 sample_input=data.x[:b], rng=jax.random.key(cfg["seed"]))
    r = runs.run_growing(ctx, tr, data, batch=b, epochs=cfg["epochs"], seed=cfg["seed"], label=label,
                         augment=cfg.get("augment", False))
    return r, tr


PRESETS = {
    "smoke": dict(dataset="synthetic", n_train=128, n_test=64, d=256, batch=16, epochs=1, seed=0, depths=[0, 1],
                  temperatures=[1.0, 6.0, 30.0], eta=None, beta=None, augment=False),
    # Fashion-MNIST (the harder stand-in for CIFAR-10), 20,000 training images, one pass: 15 nets of up to
    # 3 layers in under an hour here. η, β fixed at App. G.2's (0.003, 3), not swept with T
    "cpu": dict(dataset="fashion_mnist", n_train=20_000, n_test=10_000, batch=16, epochs=1, seed=0,
                depths=[0, 1, 2], temperatures=[1.0, 3.0, 6.0, 10.0, 30.0], eta=None, beta=None, augment=False),
    # Fig. 3 / Table 3: CIFAR-10, d = 3072, 50 augmented epochs, B = 64, L in {0, 1, 2}, T in {1, 3, 10, 15, 30};
    # Table 3 sweeps η in {0.3, 1, 1.5, 3} and β in {20, 30, 40, 60} too — set eta/beta to each point of it
    "paper": dict(dataset="cifar10", n_train=None, n_test=None, batch=64, epochs=50, seed=0, depths=[0, 1, 2],
                  temperatures=[1.0, 3.0, 10.0, 15.0, 30.0], eta=1.0, beta=30.0, augment=True,
                  paper={"best_T": 10.0, "score_bound": 5.54}),
}


def run(ctx: Context, cfg: dict) -> dict:
    data = images_for(cfg, ctx, seed=cfg["seed"])
    b = cfg["batch"]
    steps = cfg["epochs"] * (len(data.x) // b)
    ctx.start(steps * len(cfg["depths"]) * len(cfg["temperatures"]))
    acc, lin, detail = {}, {}, {}
    for L in cfg["depths"]:
        for T in cfg["temperatures"]:
            def one(L=L, T=T):
                r, tr = train_ws(ctx, cfg, data, L, T, label=f"L={L} T={T}")
                rows = tr.host_rows()
                lin_logits = tm.forward(rows, data.xt, T, L, linearise=True)
                with np.errstate(all="ignore"):
                    r["linearised_accuracy"] = float(np.mean(np.nan_to_num(lin_logits, nan=-np.inf).argmax(-1)
                                                             == data.yt))
                return r
            r = ctx.cached(["L", L, "T", T], one, steps)
            acc.setdefault(str(L), {})[str(T)] = r["accuracy"]
            lin.setdefault(str(L), {})[str(T)] = r["linearised_accuracy"]
            detail[f"L={L},T={T}"] = {k: v for k, v in r.items() if k not in ("curve",)}
    best_T = {L: max(a, key=a.get) for L, a in acc.items()}
    best = {L: acc[L][best_T[L]] for L in acc}
    deepest = str(max(cfg["depths"]))
    shallowest = str(min(cfg["depths"]))
    grid_T = [str(t) for t in cfg["temperatures"]]
    depth_helps = all(best[L] > best[shallowest] for L in best if L != shallowest) if len(best) > 1 else None
    interior = best_T[deepest] not in (grid_T[0], grid_T[-1]) if len(grid_T) > 2 else None
    drops = {L: acc[L][best_T[L]] - lin[L][best_T[L]] for L in acc}
    severe = all(d > SEVERE_DROP for d in drops.values())
    summary = {"accuracy": acc, "linearised_accuracy": lin, "best_T_by_depth": {L: float(t) for L, t in best_T.items()},
               "best_accuracy_by_depth": best, "linearisation_drop_at_best_T": drops,
               "score_bound": float(np.sqrt(data.d) / float(best_T[deepest])), "dataset": data.name,
               "samples": steps * b,
               "claims": {"depth_helps": depth_helps, "temperature_non_monotonic": interior,
                          "linearisation_severe": severe},
               "claim_reproduced": bool(depth_helps and interior and severe)}
    if cfg.get("paper"):
        summary["paper"] = cfg["paper"]
    return {"summary": summary, "runs": detail}


def plot(doc, plt):
    s = doc["summary"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for L, a in s["accuracy"].items():
        ts = [float(t) for t in a]
        a1.plot(ts, [100 * v for v in a.values()], "o-", label=f"L = {L}")
    a1.set_xscale("log")
    a1.set_xlabel("temperature T")
    a1.set_ylabel("test accuracy (%)")
    a1.set_title(f"GWS: depth and temperature ({s['dataset']})")
    a1.legend()
    Ls = list(s["accuracy"])
    x = np.arange(len(Ls))
    best_T = s["best_T_by_depth"]
    key = {L: max(s["accuracy"][L], key=s["accuracy"][L].get) for L in Ls}
    trained = [100 * s["accuracy"][L][key[L]] for L in Ls]
    linear = [100 * s["linearised_accuracy"][L][key[L]] for L in Ls]
    a2.bar(x - 0.2, trained, 0.4, label="as trained (exp)")
    a2.bar(x + 0.2, linear, 0.4, label="exp(a) -> 1 + a after training")
    a2.set_xticks(x, [f"L = {L}\nT = {best_T[L]:g}" for L in Ls])
    a2.set_ylabel("test accuracy (%)")
    a2.set_title("linearised post-training (Fig. 3/Right)")
    a2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    c = s["claims"]
    best = s["best_accuracy_by_depth"]
    depth = ", ".join(f"L={L}: {core.pct(v)} (T={s['best_T_by_depth'][L]:g})" for L, v in best.items())
    drops = ", ".join(f"L={L}: −{100 * d:.1f} pts" for L, d in s["linearisation_drop_at_best_T"].items())
    yes = lambda b: "yes" if b else "no"
    return [("GWS improves with depth (Fig. 3/Left)", "CIFAR-10: better with 1–2 blocks than 0, saturating at 2",
             f"{s['dataset']}: {depth} — {yes(c['depth_helps'])}"),
            ("Non-monotonic in the temperature T (Fig. 3/Left)", "best T = 10 inside the grid {1, 3, 10, 15, 30}",
             f"best T of the deepest net = {s['best_T_by_depth'][max(best)]:g} — "
             f"{'inside the grid' if c['temperature_non_monotonic'] else 'at the edge of the grid'}"),
            ("Linearising exp after training costs a lot (Fig. 3/Right)", "severe drop (figure only)",
             f"{drops} — {'severe (> 10 pts)' if c['linearisation_severe'] else 'NOT severe'}")]


EXPERIMENT = Experiment(
    name="depth-temperature", paper="Fig. 3",
    what="GWS against depth L and temperature T; exp linearised after training",
    claim="accuracy improves with depth, depends non-monotonically on T, and collapses when exp is linearised",
    presets=PRESETS, run=run, plot=plot, table=table)
