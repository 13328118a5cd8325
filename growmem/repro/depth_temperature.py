"""``depth-temperature`` — Fig. 3: the growing weighted softmax (GWS, Alg. 3) against depth L and
temperature T, and the post-training linearisation of its exp.

For every L (residual blocks before the readout) and T of the grid, one GWS net (the
``weighted_softmax`` preset's rule, η and β; RMSNorm before every layer) is trained; its test
accuracy is measured as trained and with every layer's ``exp(a)`` replaced by ``1 + a`` after
training (:func:`growmem.repro.temperature.forward`). ``summary.accuracy[L][T]``,
``summary.linearised_accuracy[L][T]``, ``summary.best_T_by_depth``; ``summary.score_bound`` is the
largest possible readout score ``√d / T`` at the best T (Fig. 3's caption: 5.54 for d = 3072, T = 10).

Every (L, T) runs on every seed; the best T of a depth is the one with the highest mean (an (L, T)
whose loss diverged on a seed is listed in ``summary.diverged`` and left out). Claims
(Fig. 3), each by a paired Student t-test at 95 %: accuracy improves with depth (every
deeper net, at its best T, above L = 0 at its best T); the dependence on T is not monotonic (the
best interior T of the deepest net above both ends of the grid); the linearised nets lose much
accuracy (more than 10 points at every depth's best T).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from .. import config
from ..layers import ResidualGrowingNet
from ..train import NonFiniteLossError, Trainer
from . import core, runs, temperature as tm
from .core import Context, Experiment

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


def train_ws(ctx, cfg, data, n_blocks, temperature, *, label, seed):
    b = cfg["batch"]
    spec = ws_spec(cfg, temperature)
    tr = Trainer(ResidualGrowingNet(d_out=data.classes, n_blocks=n_blocks, block=spec, readout=spec),
                 sample_input=data.x[:b], rng=jax.random.key(seed))
    r = runs.run_growing(ctx, tr, data, batch=b, epochs=cfg["epochs"], seed=seed, label=label,
                         augment=cfg.get("augment", False))
    return r, tr


PRESETS = {
    "smoke": dict(dataset="synthetic", n_train=128, n_test=64, d=256, batch=16, epochs=1, seeds=[0, 1],
                  depths=[0, 1], temperatures=[1.0, 6.0, 30.0], eta=None, beta=None, augment=False),
    # Fashion-MNIST (the harder stand-in for CIFAR-10), 20,000 training images (a random subset per seed), one
    # pass, 3 seeds: 45 nets of up to 3 layers. η, β fixed at App. G.2's (0.003, 3), not swept with T
    "cpu": dict(dataset="fashion_mnist", n_train=20_000, n_test=10_000, batch=16, epochs=1, seeds=[0, 1, 2],
                depths=[0, 1, 2], temperatures=[1.0, 3.0, 6.0, 10.0, 30.0], eta=None, beta=None, augment=False),
    # Fig. 3 / Table 3: CIFAR-10, d = 3072, 50 augmented epochs, B = 64, L in {0, 1, 2}, T in {1, 3, 10, 15, 30},
    # 5 seeds; Table 3 sweeps η in {0.3, 1, 1.5, 3} and β in {20, 30, 40, 60} too — set eta/beta to each point
    "paper": dict(dataset="cifar10", n_train=None, n_test=None, batch=64, epochs=50, seeds=[0, 1, 2, 3, 4],
                  depths=[0, 1, 2], temperatures=[1.0, 3.0, 10.0, 15.0, 30.0], eta=1.0, beta=30.0, augment=True,
                  paper={"best_T": 10.0, "score_bound": 5.54}),
}


def run(ctx: Context, cfg: dict) -> dict:
    seeds = core.seeds_of(cfg)
    data_of = core.SeededImages(cfg, ctx)
    first = data_of(seeds[0])
    b = cfg["batch"]
    steps = cfg["epochs"] * (len(first.x) // b)
    ctx.start(steps * len(cfg["depths"]) * len(cfg["temperatures"]) * len(seeds))
    acc, lin, detail = {}, {}, {}
    for s in seeds:
        data = data_of(s)
        for L in cfg["depths"]:
            for T in cfg["temperatures"]:
                def one(L=L, T=T):
                    try:
                        r, tr = train_ws(ctx, cfg, data, L, T, label=f"L={L} T={T} seed={s}", seed=s)
                    except NonFiniteLossError as e:   # that (L, T) is recorded as diverged, not compared
                        return {"diverged": str(e), "accuracy": None, "linearised_accuracy": None}
                    rows = tr.host_rows()
                    lin_logits = tm.forward(rows, data.xt, T, L, linearise=True)
                    with np.errstate(all="ignore"):
                        r["linearised_accuracy"] = float(np.mean(np.nan_to_num(lin_logits, nan=-np.inf).argmax(-1)
                                                                 == data.yt))
                    return r
                r = ctx.cached(["L", L, "T", T, "seed", s], one, steps)
                acc.setdefault(str(L), {}).setdefault(str(T), []).append(r["accuracy"])
                lin.setdefault(str(L), {}).setdefault(str(T), []).append(r["linearised_accuracy"])
                detail[f"L={L},T={T},seed={s}"] = {k: v for k, v in r.items() if k not in ("curve",)}
    diverged = sorted({k.rsplit(",seed=", 1)[0] for k, r in detail.items() if "diverged" in r})
    for L in list(acc):   # a (L, T) that diverged on any seed is left out of the comparisons
        for T in list(acc[L]):
            if any(v is None for v in acc[L][T]):
                del acc[L][T], lin[L][T]
        if not acc[L]:
            raise NonFiniteLossError(f"depth-temperature: every T diverged at L = {L}: {diverged}")
    mean = lambda v: float(np.mean(v))
    best_T = {L: max(a, key=lambda t: mean(a[t])) for L, a in acc.items()}
    best = {L: acc[L][best_T[L]] for L in acc}
    deepest, shallowest = str(max(cfg["depths"])), str(min(cfg["depths"]))
    grid_T = [str(t) for t in cfg["temperatures"] if str(t) in acc[deepest]]   # the T that finished
    claims = {}
    if len(best) > 1:
        claims["depth_helps"] = core.ordering(best, [L for L in best if L != shallowest], [shallowest],
                                              claim="every deeper net (at its best T) beats the shallowest")
    if len(grid_T) > 2:
        inner = grid_T[1:-1]
        t_in = max(inner, key=lambda t: mean(acc[deepest][t]))
        claims["temperature_non_monotonic"] = core.ordering(
            {t: acc[deepest][t] for t in grid_T}, [t_in], [grid_T[0], grid_T[-1]],
            claim="the deepest net's best interior T beats both ends of the T grid")
    claims["linearisation_severe"] = core.combine(
        [core.beats(acc[L][best_T[L]], lin[L][best_T[L]], margin=SEVERE_DROP, names=(f"L={L}", f"L={L} linearised"))
         for L in acc], claim="replacing exp by 1 + a after training costs more than 10 points at every depth",
        rule=f"trained above linearised by more than {SEVERE_DROP:g} at every depth's best T, by a paired t-test at 95 % "
             "errors (paired by seed)")
    ov = core.overall(claims)
    metrics = {f"accuracy/L={L}/T={T}": core.metric(v) for L, a in acc.items() for T, v in a.items()}
    metrics.update({f"linearised_accuracy/L={L}/T={T}": core.metric(v) for L, a in lin.items() for T, v in a.items()})
    drops = {L: core.metric([x - y for x, y in zip(acc[L][best_T[L]], lin[L][best_T[L]])]) for L in acc}
    summary = {"seeds": seeds, "metrics": metrics, "claims": claims, "verdict": ov["verdict"],
               "n_needed": ov["n_needed"], "claim_reproduced": ov["verdict"] == core.REPRODUCED,
               "accuracy": {L: {T: mean(v) for T, v in a.items()} for L, a in acc.items()},
               "linearised_accuracy": {L: {T: mean(v) for T, v in a.items()} for L, a in lin.items()},
               "best_T_by_depth": {L: float(t) for L, t in best_T.items()},
               "best_accuracy_by_depth": {L: core.metric(v) for L, v in best.items()},
               "linearisation_drop_at_best_T": drops,
               "diverged": diverged,
               "score_bound": float(np.sqrt(first.d) / float(best_T[deepest])), "dataset": first.name,
               "samples": steps * b}
    if cfg.get("paper"):
        summary["paper"] = cfg["paper"]
    return {"summary": summary, "runs": detail}


def plot(doc, plt):
    s = doc["summary"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    m = s["metrics"]
    for L, a in s["accuracy"].items():
        ts = list(a)
        a1.errorbar([float(t) for t in ts], [100 * m[f"accuracy/L={L}/T={t}"]["mean"] for t in ts],
                    yerr=[100 * m[f"accuracy/L={L}/T={t}"]["std"] for t in ts], fmt="o-", capsize=2, label=f"L = {L}")
    a1.set_xscale("log")
    a1.set_xlabel("temperature T")
    a1.set_ylabel(f"test accuracy (%), mean ± std over {len(s['seeds'])} seeds")
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
    a2.set_ylabel("test accuracy (%), mean over seeds")
    a2.set_title("linearised post-training (Fig. 3/Right)")
    a2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    c = s["claims"]
    best = s["best_accuracy_by_depth"]
    depth = ", ".join(f"L={L}: {core.pm(v)} (T={s['best_T_by_depth'][L]:g})" for L, v in best.items())
    drops = ", ".join(f"L={L}: −{core.pm(d, unit=' pts', digits=1)}" for L, d in s["linearisation_drop_at_best_T"].items())
    deepest = max(best)
    temps = ", ".join(f"T={t}: {core.pm(s['metrics'][f'accuracy/L={deepest}/T={t}'])}" for t in s["accuracy"][deepest])
    return [("GWS improves with depth (Fig. 3/Left)", "CIFAR-10: better with 1–2 blocks than 0, saturating at 2",
             f"{s['dataset']}: {depth}", c.get("depth_helps")),
            ("Non-monotonic in the temperature T (Fig. 3/Left)", "best T = 10 inside the grid {1, 3, 10, 15, 30}",
             f"L={deepest}: {temps}", c.get("temperature_non_monotonic")),
            ("Linearising exp after training costs a lot (Fig. 3/Right)", "severe drop (figure only)", drops,
             c["linearisation_severe"])]


EXPERIMENT = Experiment(
    name="depth-temperature", paper="Fig. 3",
    what="GWS against depth L and temperature T; exp linearised after training",
    claim="accuracy improves with depth, depends non-monotonically on T, and collapses when exp is linearised",
    presets=PRESETS, run=run, plot=plot, table=table)
