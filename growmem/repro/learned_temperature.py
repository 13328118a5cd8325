"""``learned-temperature`` — beyond the paper: the temperature T of every layer learned during the
single pass, against the hand sweep of Fig. 3.

The paper sweeps T by hand (Fig. 3, Table 3). The Nadaraya–Watson section of ref. 004 learns the
bandwidth by gradient descent on the leave-one-out loss; the streaming form of that loss is the
prequential one — each batch predicted from the rows stored before it, then stored — which is
exactly the loss the growing net's training step already differentiates. :class:`~growmem.repro.
temperature.TemperedNet` makes ``log T_l`` of every layer a parameter trained by Adam on that
gradient (one scalar per layer, no extra pass). Its single pass is compared with the same net at
every T of the hand sweep (the GWS rule, η and β of the ``weighted_softmax`` preset, L = 2).

Every run repeats on every seed. ``summary.swept`` ({T: mean accuracy}), ``summary.learned_by_init``
({T₀: mean ± std accuracy, the learned temperatures per layer}) for every start, and their
``spread`` (the range of the learned runs' mean accuracies over the starts). The claim — a
learned T lands no more than 0.5 points below the best swept T (the one with the highest mean),
by a paired Student t-test at 95 % — is decided for every start T₀ (``claims.from_T0=…``),
and holds only if it holds from all of them (``claims.from_every_start``); the table names the
starts it holds from.
"""
from __future__ import annotations

import jax
import numpy as np
import optax

from ..train import Trainer
from . import core, runs, temperature as tm
from .core import Context, Experiment
from .depth_temperature import train_ws, ws_spec

TOLERANCE = 0.005

PRESETS = {
    "smoke": dict(dataset="synthetic", n_train=128, n_test=64, d=256, batch=16, epochs=1, seeds=[0, 1], n_blocks=2,
                  temperatures=[1.0, 6.0, 30.0], inits=[30.0, 1.0], lr=0.05, eta=None, beta=None, augment=False),
    # the depth-temperature data (Fashion-MNIST, 20,000 images, one pass) and its T grid at L = 2; 3 starts, 3 seeds
    "cpu": dict(dataset="fashion_mnist", n_train=20_000, n_test=10_000, batch=16, epochs=1, seeds=[0, 1, 2],
                n_blocks=2, temperatures=[1.0, 3.0, 6.0, 10.0, 30.0], inits=[1.0, 6.0, 30.0], lr=0.05,
                eta=None, beta=None, augment=False),
    # App. G.2's single pass on CIFAR-10 (non-augmented, B = 16, L = 2, d = 3072) against Table 3's T grid, 5 seeds
    "paper": dict(dataset="cifar10", n_train=None, n_test=None, batch=16, epochs=1, seeds=[0, 1, 2, 3, 4], n_blocks=2,
                  temperatures=[1.0, 3.0, 6.0, 10.0, 15.0, 30.0], inits=[1.0, 6.0, 30.0], lr=0.05,
                  eta=None, beta=None, augment=False),
}


def _learned(ctx, cfg, data, init, seed):
    b = cfg["batch"]
    spec = ws_spec(cfg, init)
    net = tm.TemperedNet(d_out=data.classes, n_blocks=cfg["n_blocks"], spec=spec)
    tr = Trainer(net, tx=optax.adam(cfg["lr"]), sample_input=data.x[:b], rng=jax.random.key(seed))
    traj = []
    every = max(1, (cfg["epochs"] * (len(data.x) // b)) // 20)

    def after(step):
        if step % every == 0:
            traj.append([step * b, tm.temperatures(tr.state.params)])

    r = runs.run_growing(ctx, tr, data, batch=b, epochs=cfg["epochs"], seed=seed, label=f"learned T0={init}",
                         after_step=after, augment=cfg.get("augment", False))
    r["temperatures"] = tm.temperatures(tr.state.params)
    r["trajectory"] = traj
    return r


def run(ctx: Context, cfg: dict) -> dict:
    seeds = core.seeds_of(cfg)
    data_of = core.SeededImages(cfg, ctx)
    first = data_of(seeds[0])
    b = cfg["batch"]
    steps = cfg["epochs"] * (len(first.x) // b)
    inits = [float(t) for t in dict.fromkeys(cfg["inits"])]
    if len(inits) < 1:
        raise core.ReproError("learned-temperature needs at least one start temperature in 'inits'")
    ctx.start(steps * (len(cfg["temperatures"]) + len(inits)) * len(seeds))
    swept = {str(T): [] for T in cfg["temperatures"]}
    learned = {str(t): [] for t in inits}
    for s in seeds:
        data = data_of(s)
        for T in cfg["temperatures"]:
            r = ctx.cached(["swept", T, "seed", s], lambda T=T: train_ws(
                ctx, cfg, data, cfg["n_blocks"], T, label=f"T={T} seed={s}", seed=s)[0], steps)
            swept[str(T)].append(r)
        for t0 in inits:
            learned[str(t0)].append(ctx.cached(["learned", t0, "seed", s], lambda t0=t0: _learned(ctx, cfg, data, t0, s),
                                               steps))
    acc_swept = {T: [r["accuracy"] for r in rs] for T, rs in swept.items()}
    acc_learned = {t: [r["accuracy"] for r in rs] for t, rs in learned.items()}
    best_T = max(acc_swept, key=lambda T: float(np.mean(acc_swept[T])))
    per_start = {f"from_T0={t}": core.beats(acc_learned[t], acc_swept[best_T], margin=-TOLERANCE,
                                            names=(f"learned from T0={t}", f"swept T={best_T}"))
                 for t in acc_learned}
    every = core.combine(list(per_start.values()), claim="a learned T matches the best hand-swept T from every start",
                         rule=f"learned no more than {TOLERANCE:g} below the best swept T, by a paired t-test at 95 % "
                              "(paired by seed), from every start")
    claims = {"from_every_start": every}
    ov = core.overall(claims)
    metrics = {f"accuracy/swept/T={T}": core.metric(v) for T, v in acc_swept.items()}
    metrics.update({f"accuracy/learned/T0={t}": core.metric(v) for t, v in acc_learned.items()})
    means = [metrics[f"accuracy/learned/T0={t}"]["mean"] for t in acc_learned]
    summary = {"seeds": seeds, "metrics": metrics, "claims": claims, "verdict": ov["verdict"],
               "n_needed": ov["n_needed"], "claim_reproduced": ov["verdict"] == core.REPRODUCED,
               "by_start": {t: {"verdict": c["verdict"], "n_needed": c["n_needed"], "difference": c["difference"]}
                            for t, c in zip(acc_learned, per_start.values())},
               "best_swept_T": float(best_T), "swept": {T: float(np.mean(v)) for T, v in acc_swept.items()},
               "learned_by_init": {t: {"accuracy": metrics[f"accuracy/learned/T0={t}"],
                                       "temperatures": [r["temperatures"] for r in rs]} for t, rs in learned.items()},
               "spread": {"min": min(means), "max": max(means), "range": max(means) - min(means)},
               "inits": inits, "dataset": first.name, "samples": steps * b, "n_blocks": cfg["n_blocks"]}
    return {"summary": summary, "learned_runs": {t: rs[0] for t, rs in learned.items()},
            "per_start_claims": per_start}


def plot(doc, plt):
    s = doc["summary"]
    m = s["metrics"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ts = list(s["swept"])
    a1.errorbar([float(t) for t in ts], [100 * m[f"accuracy/swept/T={t}"]["mean"] for t in ts],
                yerr=[100 * m[f"accuracy/swept/T={t}"]["std"] for t in ts], fmt="o-", color="0.4", capsize=2,
                label="hand sweep (fixed T)")
    for i, (k, v) in enumerate(s["learned_by_init"].items()):
        mu, sd = 100 * v["accuracy"]["mean"], 100 * v["accuracy"]["std"]
        a1.axhspan(mu - sd, mu + sd, color=f"C{i}", alpha=0.15)
        a1.axhline(mu, ls="--", lw=1, color=f"C{i}", label=f"learned T, start {k}")
    a1.set_xscale("log")
    a1.set_xlabel("temperature T")
    a1.set_ylabel(f"test accuracy (%), mean ± std over {len(s['seeds'])} seeds")
    a1.set_title(f"learned vs swept T ({s['dataset']}, L = {s['n_blocks']})")
    a1.legend(fontsize=7)
    for k, r in doc["learned_runs"].items():
        traj = r.get("trajectory") or []
        if not traj:
            continue
        layers = list(traj[0][1])
        for i, layer in enumerate(layers):
            a2.plot([p[0] for p in traj], [p[1][layer] for p in traj], ["-", "--", ":", "-."][i % 4],
                    color=f"C{list(doc['learned_runs']).index(k)}", label=f"start {k}: {layer}")
    a2.set_yscale("log")
    a2.set_xlabel("training samples")
    a2.set_ylabel("T per layer (first seed)")
    a2.set_title("T learned on the prequential loss")
    a2.legend(fontsize=6)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    starts = "; ".join(f"start T₀={t}: {core.pm(v['accuracy'])} ({s['by_start'][t]['verdict']})"
                       for t, v in s["learned_by_init"].items())
    holds = [t for t, v in s["by_start"].items() if v["verdict"] == core.REPRODUCED]
    return [("(beyond the paper) T per layer learned on the prequential loss lands within 0.5 points of the best "
             "hand-swept T, from every start T₀",
             "the paper sweeps T by hand (Fig. 3); ref. 004 learns the bandwidth on the leave-one-out loss",
             f"{s['dataset']} one pass: best swept T={s['best_swept_T']:g} {_best_swept(s)}; {starts}; "
             f"spread of the starts {100 * s['spread']['range']:.2f} pts; holds from "
             f"{', '.join('T₀=' + t for t in holds) if holds else 'no start'}", s["claims"]["from_every_start"])]


def _best_swept(s):
    key = next(T for T in s["swept"] if float(T) == s["best_swept_T"])
    return core.pm(s["metrics"][f"accuracy/swept/T={key}"])


EXPERIMENT = Experiment(
    name="learned-temperature", paper="beyond the paper (Fig. 3's sweep; ref. 004)",
    what="T per layer learned by gradient descent on the prequential (leave-one-out) loss vs the hand sweep",
    claim="a T learned during the single pass matches the best hand-swept T",
    presets=PRESETS, run=run, plot=plot, table=table)
