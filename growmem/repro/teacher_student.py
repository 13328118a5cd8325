"""``teacher-student`` — Fig. 1 (App. F.1.2, Tables 2, 6, 13): regression on a random residual ReLU
teacher, fresh samples every step.

Compares, at equal numbers of samples, the single-layer growing weighted softmax (Table 2 grid),
the parametric softmax (Table 6: fixed-size keys and values trained by Adam) and the reference MLP
student (Table 13). Each model's hyperparameters are chosen on the first seed by the lowest test
loss after ``select_steps`` steps (App. F.1; grids extended while the best sits at an end,
:func:`growmem.repro.core.sweep`); the chosen configuration then trains for ``steps`` steps on
every seed (a seed is a teacher, its test set, the sample stream and the initialisation). Every
model is evaluated at the same ``checkpoints`` (samples seen), so the JSON says where the ordering
turns, if it does.

The decision metric is the test MSE divided by the variance of that seed's test targets (teachers
differ in scale), paired by seed. Claims (Fig. 1): GWS below the parametric softmax; the reference
MLP lowest of all — decided at the last checkpoint by :func:`growmem.repro.core.ordering`.
``summary.by_checkpoint`` has both verdicts at every checkpoint; ``summary.ordering_turns`` the
first checkpoint from which a claimed ordering holds (in the means) at every later one.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import jax
import optax

from ..data.teacher_student import TeacherStudent
from ..layers import GrowingSpec, ParametricSoftmax, ResidualGrowingNet, TeacherMLP
from ..train import Trainer, squared_error
from . import core
from .core import UNIT_EVERY_S, Context, Experiment

# ------------------------------------------------------------------------------------------ the runs


def _loop(trainer: Trainer, task: TeacherStudent, *, steps: int, batch: int, eval_every: int,
          test, progress: Optional[Callable[[int], None]] = None, stream_seed: int = 1,
          eval_at: Optional[Sequence[int]] = None, unit: Optional[Path] = None,
          unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Train on fresh teacher samples with :func:`growmem.train.fit`; the test-MSE curve at every
    ``eval_every`` steps, or only at the steps ``eval_at`` when given (and at the end). ``unit``: a folder
    where the run checkpoints itself about every ``unit_every_s`` seconds and from which a rerun goes on
    (:class:`growmem.repro.core.UnitCheckpoint`; the batches are a function of the step, so it is exact)."""
    xt, yt = test
    at = None if eval_at is None else {int(s) for s in eval_at if 0 < s <= steps} | {steps}
    every = eval_every if at is None else math.gcd(*sorted(at))
    run = core.UnitCheckpoint(unit, trainer, every=every, min_seconds=unit_every_s,
                              key={"steps": steps, "batch": batch, "every": every, "stream_seed": stream_seed})
    rec = run.carry          # what the loop records, checkpointed with the trainer
    if not run.resumed:
        rec.update(first=float(squared_error(trainer.predict(xt), yt)), train_loss=[], wall=[], eval_s=0.0)
    elif progress:
        progress(run.start)

    def evaluate(step):
        if at is not None and step not in at:
            return {}
        t = run.seconds()
        rec["wall"].append([step * batch, t - rec["eval_s"]])   # seconds of training so far, evaluations left out
        mse = float(squared_error(trainer.predict(xt), yt))
        rec["eval_s"] += run.seconds() - t
        return {"mse": mse if math.isfinite(mse) else float("inf")}

    def on_step(step, m):
        if step % every == 0 or step == steps:
            rec["train_loss"].append([step * batch, float(m["loss"])])
        if progress:
            progress(1)

    out = run.fit(lambda step: task.batch(step, batch, stream_seed), steps=steps, on_step=on_step,
                  evaluate=evaluate, eval_every=every)   # a diverged run stops: it cannot recover
    curve = [[0, rec["first"]]] + [[e["step"] * batch, e["mse"]] for e in out["evals"] if "mse" in e]
    return {"curve": curve, "train_loss": rec["train_loss"], "final_test_loss": curve[-1][1],
            "seconds": out["seconds"], "rows": trainer.rows_in_use(), "wall": rec["wall"]}


def growing_ws_spec(*, temperature, eta, beta, momentum=0.0, batch=64, clip=None) -> GrowingSpec:
    """The paper's growing weighted softmax (Alg. 3, D0 of F.3 with B random rows)."""
    extra = {"clip": clip} if clip is not None else {}
    return GrowingSpec.make("weighted_softmax", temperature=temperature, eta=eta, beta=beta,
                            momentum=momentum, init="random", init_rows=batch, **extra)


def run_growing_ws(task: TeacherStudent, *, steps, batch, temperature, eta, beta, momentum=0.0,
                   eval_every=100, test=None, progress=None, seed=0, eval_at=None, backend=None,
                   inspect: Optional[Callable[[Trainer], Dict]] = None, unit: Optional[Path] = None,
                   unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Single growing weighted-softmax layer on RMSNorm(x) (Table 2). ``backend``: where its rows live and how
    a step reads them (default: RAM, the exact scan; e.g. :class:`growmem.backends.indexed.Indexed`).
    ``inspect(trainer)``: a dict merged into the result after training. ``unit``, ``unit_every_s``: the
    folder where the run checkpoints itself, and how often (:func:`_loop`)."""
    spec = growing_ws_spec(temperature=temperature, eta=eta, beta=beta, momentum=momentum, batch=batch)
    model = ResidualGrowingNet(d_out=task.d_out, n_blocks=0, readout=spec)
    test = test or task.test_set()
    trainer = Trainer(model, loss="squared_error", sample_input=test[0][:batch], rng=jax.random.key(seed),
                      backend=backend)
    out = _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress,
                eval_at=eval_at, unit=unit, unit_every_s=unit_every_s)
    return {**out, **(inspect(trainer) if inspect is not None else {})}


def run_parametric_softmax(task: TeacherStudent, *, steps, batch, width, temperature, lr, b1=0.85,
                           eval_every=100, test=None, progress=None, seed=0, eval_at=None, unit: Optional[Path] = None,
                           unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Fixed-size softmax keys/values trained by Adam (F.5, Table 6)."""
    model = ParametricSoftmax(width=width, d_out=task.d_out, temperature=temperature)
    test = test or task.test_set()
    trainer = Trainer(model, loss="squared_error", tx=optax.adam(lr, b1=b1), sample_input=test[0][:batch],
                      rng=jax.random.key(seed))
    return _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress,
                 eval_at=eval_at, unit=unit, unit_every_s=unit_every_s)


def run_reference_mlp(task: TeacherStudent, *, steps, batch, width, lr, momentum=0.0,
                      eval_every=100, test=None, progress=None, seed=0, eval_at=None, unit: Optional[Path] = None,
                      unit_every_s: float = UNIT_EVERY_S) -> Dict:
    """Over-parameterised student with the teacher's architecture, trained by SGD (Table 13)."""
    model = TeacherMLP(width=width, n_layers=task.n_layers, d_out=task.d_out, use_bias=True)
    test = test or task.test_set()
    tx = optax.sgd(lr, momentum=momentum or None)
    trainer = Trainer(model, loss="squared_error", tx=tx, sample_input=test[0][:batch], rng=jax.random.key(seed))
    return _loop(trainer, task, steps=steps, batch=batch, eval_every=eval_every, test=test, progress=progress,
                 eval_at=eval_at, unit=unit, unit_every_s=unit_every_s)


# ------------------------------------------------------------------------------------------ the experiment

MODELS = ("growing_weighted_softmax", "parametric_softmax", "reference_mlp")
GRID_KEYS = {"growing_weighted_softmax": "gws", "parametric_softmax": "psm", "reference_mlp": "mlp"}
#: the paper's widest parametric softmax (Table 6: hidden size 10,240,000)
PAPER_PSM_WIDTH = 10_240_000

PRESETS = {
    "smoke": dict(steps=24, batch=16, select_steps=12, eval_every=12, checkpoints=[192, 384], test_size=256,
                  seeds=[0, 1], psm_width=None,
                  gws=dict(beta=[0.3], eta=[30.0], temperature=[1.0], momentum=[0.6]),
                  psm=dict(lr=[0.003], temperature=[1.0]),
                  mlp=dict(width=[256], lr=[0.03, 0.1], momentum=[0.9]),
                  extend={"mlp": {"lr": 1}}, edge_reasons={}, unit_every_s=UNIT_EVERY_S),
    # 2,000,000 samples (31,250 steps of B = 64; the paper: 200,000 steps), 3 seeds. Hyperparameters chosen on
    # seed 0 after 1000 steps (64,000 samples), on grids around the earlier 64,000-sample sweep's choice
    # (benchmarks/results/teacher_student*.json), extended while the best sits at an end. The parametric softmax
    # is as wide as the database at the first checkpoint (64,064 rows), not at 2 M: a 2 M-wide one trained by
    # Adam costs about a second a step here (31,250 steps)
    "cpu": dict(steps=31_250, batch=64, select_steps=1000, eval_every=250,
                checkpoints=[64_000, 128_000, 256_000, 512_000, 1_024_000, 2_000_000], test_size=4096,
                seeds=[0, 1, 2], psm_width=64_064,
                gws=dict(beta=[0.3, 1.0, 3.0], eta=[3.0, 10.0, 30.0], temperature=[0.3, 1.0, 3.0], momentum=[0.6]),
                psm=dict(lr=[0.01, 0.03, 0.1], temperature=[0.3, 1.0, 3.0]),
                mlp=dict(width=[1024], lr=[0.03, 0.1, 0.3, 1.0], momentum=[0.0, 0.9]),
                extend={"gws": {"beta": 2, "eta": 2, "temperature": 2},
                        "psm": {"lr": 2, "temperature": 2},
                        "mlp": {"lr": 2, "momentum": {"steps": 2, "scale": "log1m"}}},
                edge_reasons={}, unit_every_s=UNIT_EVERY_S),
    # Tables 2, 6 and 13 as printed: 200,000 steps of B = 64, the full grids, a parametric softmax of 10,240,000
    # rows (Table 6), 5 seeds (App. F); selection on the full runs
    "paper": dict(steps=200_000, batch=64, select_steps=200_000, eval_every=2000,
                  checkpoints=[64_000, 256_000, 1_024_000, 4_096_000, 12_800_000], test_size=16384,
                  seeds=[0, 1, 2, 3, 4], psm_width=PAPER_PSM_WIDTH,
                  gws=dict(beta=[0.1, 0.3, 1.0], eta=[10.0, 30.0, 100.0], temperature=[0.1, 1.0, 3.0, 10.0],
                           momentum=[0.6, 0.9]),
                  psm=dict(lr=[0.0003, 0.001, 0.003, 0.01, 0.03],
                           temperature=[0.001, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0]),
                  mlp=dict(width=[256, 512, 1024, 4096, 8192], lr=[0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0],
                           momentum=[0.0, 0.9, 0.999]),
                  extend={}, edge_reasons={"*": "the paper's grid (Tables 2, 6, 13), not extended"},
                  unit_every_s=UNIT_EVERY_S),
}

_FNS = {"growing_weighted_softmax": run_growing_ws, "parametric_softmax": run_parametric_softmax,
        "reference_mlp": run_reference_mlp}


def _checkpoint_steps(cfg) -> list:
    b = cfg["batch"]
    bad = [c for c in cfg["checkpoints"] if c % b or c > cfg["steps"] * b]
    if bad:
        raise core.ReproError(f"teacher-student: checkpoints {bad} are not multiples of the batch ({b}) within "
                              f"the {cfg['steps'] * b} samples; fix 'checkpoints'")
    return sorted({c // b for c in cfg["checkpoints"]} | {cfg["steps"]})


def _reasons(cfg, model):
    """``{axis: why it is not extended}`` for ``model``: ``edge_reasons["*"]`` for every axis, then
    ``edge_reasons[<grid key>][axis]``."""
    r = cfg.get("edge_reasons") or {}
    out = {axis: r["*"] for axis in cfg[GRID_KEYS[model]]} if "*" in r else {}
    out.update(r.get(GRID_KEYS[model], {}))
    return out


def run(ctx: Context, cfg: dict) -> dict:
    seeds = core.seeds_of(cfg)
    steps, sel, batch = cfg["steps"], cfg["select_steps"], cfg["batch"]
    at = _checkpoint_steps(cfg)
    tasks = {s: TeacherStudent(seed=s) for s in seeds}
    tests = {s: tasks[s].test_set(cfg["test_size"]) for s in seeds}
    grids = {m: core.grid(cfg[GRID_KEYS[m]]) for m in MODELS}
    width = int(cfg.get("psm_width") or batch * (steps + 1))
    extra = {"growing_weighted_softmax": {}, "parametric_softmax": {"width": width}, "reference_mlp": {}}
    n_full = len(seeds) if sel != steps else len(seeds) - 1
    ctx.start(sum(len(g) * sel for g in grids.values()) + len(MODELS) * n_full * steps)

    def train(m, hp, seed, n_steps):
        return _FNS[m](tasks[seed], steps=n_steps, batch=batch, eval_every=cfg["eval_every"], test=tests[seed],
                       progress=ctx.update, seed=seed, eval_at=at if n_steps == steps else None,
                       unit=ctx.unit_dir(), unit_every_s=cfg["unit_every_s"], **hp, **extra[m])

    selection, by_seed = {}, {}
    for m in MODELS:
        ext = (cfg.get("extend") or {}).get(GRID_KEYS[m], {})
        sw = core.sweep(ctx, f"{m}/select", grids[m], lambda hp, m=m: train(m, hp, seeds[0], sel),
                        score="final_test_loss", higher=False, steps=sel, extend=ext, reasons=_reasons(cfg, m))
        hp = sw["best"]["hyper"]
        selection[m] = sw
        runs_ = []
        for s in seeds:
            if s == seeds[0] and sel == steps:
                runs_.append(sw["best"])
            else:
                runs_.append(ctx.cached([m, "full", s, hp], lambda m=m, hp=hp, s=s: {"hyper": hp, **train(m, hp, s, steps)},
                                        steps))
        by_seed[m] = runs_
    var = [float(tests[s][1].var()) for s in seeds]
    samples_at = [st * batch for st in at]

    def loss_at(m, n, relative=True):
        out = []
        for r, v in zip(by_seed[m], var):
            c = {int(x): y for x, y in r["curve"]}
            out.append(c[n] / v if relative else c[n])
        return out

    checkpoints = []
    for n in samples_at:
        vals = {m: loss_at(m, n) for m in MODELS}
        checkpoints.append({
            "samples": n, "relative_test_loss": {m: core.metric(v) for m, v in vals.items()},
            "claims": {"gws_below_parametric": core.ordering(vals, ["growing_weighted_softmax"], ["parametric_softmax"],
                                                             higher=False),
                       "mlp_lowest": core.ordering(vals, ["reference_mlp"],
                                                   ["growing_weighted_softmax", "parametric_softmax"], higher=False)}})
    last = checkpoints[-1]
    claims = {k: {**c, "claim": text} for (k, c), text in zip(last["claims"].items(), (
        "the growing weighted softmax reaches a lower test loss than the parametric softmax",
        "the reference MLP student reaches the lowest test loss"))}

    def turns(winners, losers):
        means = [{m: c["relative_test_loss"][m]["mean"] for m in MODELS} for c in checkpoints]
        holds = [max(mm[w] for w in winners) < min(mm[l] for l in losers) for mm in means]
        for i in range(len(holds)):
            if all(holds[i:]):
                return samples_at[i]
        return None

    final = samples_at[-1]
    metrics = {f"relative_test_loss/{m}": core.metric(loss_at(m, final)) for m in MODELS}
    metrics.update({f"test_loss/{m}": core.metric(loss_at(m, final, relative=False)) for m in MODELS})
    ov = core.overall(claims)
    summary = {"seeds": seeds, "metrics": metrics, "claims": claims, "verdict": ov["verdict"],
               "n_needed": ov["n_needed"], "claim_reproduced": ov["verdict"] == core.REPRODUCED,
               "samples": final, "final_test_loss": {m: metrics[f"test_loss/{m}"]["mean"] for m in MODELS},
               "target_variance": core.metric(var),
               "chosen_hyperparameters": {m: {**selection[m]["best"]["hyper"], **extra[m]} for m in MODELS},
               "selected_on": {"seed": seeds[0], "samples": sel * batch},
               "grid_edges": {m: selection[m]["edges"] for m in MODELS}, "psm_width": width,
               "by_checkpoint": [{"samples": c["samples"],
                                  "relative_test_loss": c["relative_test_loss"],
                                  "verdicts": {k: v["verdict"] for k, v in c["claims"].items()}}
                                 for c in checkpoints],
               "ordering_turns": {"gws_below_parametric": turns(["growing_weighted_softmax"], ["parametric_softmax"]),
                                  "mlp_lowest": turns(["reference_mlp"],
                                                      ["growing_weighted_softmax", "parametric_softmax"])}}
    strip = lambda r: {k: v for k, v in r.items() if k not in ("curve", "train_loss")}
    return {"summary": summary,
            "curves": {m: [r["curve"] for r in by_seed[m]] for m in MODELS},
            "checkpoints": checkpoints,
            "runs": {m: [strip(r) for r in selection[m]["runs"]] for m in MODELS},
            "full_runs": {m: [strip(r) for r in by_seed[m]] for m in MODELS}}


def plot(doc, plt):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4))
    colors = {"growing_weighted_softmax": "tab:blue", "parametric_softmax": "tab:red", "reference_mlp": "tab:gray"}
    s = doc["summary"]
    var = s["target_variance"]["values"]
    for m, curves in doc["curves"].items():
        for i, c in enumerate(curves):
            pts = [(x, y / var[i]) for x, y in c if x > 0 and y is not None]
            if pts:
                a1.loglog(*zip(*pts), color=colors.get(m), alpha=0.8, lw=1,
                          label=f"{m} {s['chosen_hyperparameters'][m]}" if i == 0 else None)
    a1.axhline(1.0, ls=":", color="k", lw=0.8, label="predict 0")
    a1.set_xlabel("training samples")
    a1.set_ylabel("test MSE / target variance (one line per seed)")
    a1.legend(fontsize=6)
    xs = [c["samples"] for c in s["by_checkpoint"]]
    for m in doc["curves"]:
        mu = [c["relative_test_loss"][m]["mean"] for c in s["by_checkpoint"]]
        sd = [c["relative_test_loss"][m]["std"] for c in s["by_checkpoint"]]
        a2.errorbar(xs, mu, yerr=sd, marker="o", capsize=3, color=colors.get(m), label=m)
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("training samples (checkpoints)")
    a2.set_ylabel(f"test MSE / target variance, mean ± std over {len(s['seeds'])} seeds")
    a2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def table(doc):
    s = doc["summary"]
    m = s["metrics"]
    rel = lambda k: core.pm(m[f"relative_test_loss/{k}"], scale=1.0, digits=4, unit="")
    turn = s["ordering_turns"]["gws_below_parametric"]
    return [("Teacher-student: GWS below the parametric softmax (Fig. 1)", "figure only (200,000 steps of B = 64)",
             f"{s['samples']} samples, test MSE / target variance: GWS {rel('growing_weighted_softmax')}, parametric "
             f"(width {s['psm_width']}) {rel('parametric_softmax')}; GWS below it in the means from "
             f"{turn if turn is not None else 'no checkpoint'} on", s["claims"]["gws_below_parametric"]),
            ("Teacher-student: the reference MLP student lowest of all (Fig. 1)", "figure only",
             f"MLP {rel('reference_mlp')}", s["claims"]["mlp_lowest"])]


EXPERIMENT = Experiment(
    name="teacher-student", paper="Fig. 1 (App. F.1.2, Tables 2, 6, 13)",
    what="regression on a random ReLU teacher: GWS vs parametric softmax vs reference MLP student",
    claim="GWS reaches a lower loss than the parametric softmax; the reference MLP is the lowest",
    presets=PRESETS, run=run, plot=plot, table=table)
