"""Sublinear growth with the hybrid weighted softmax (Sec. 3.3, Fig. 5 analogue, App. F.4).

Single pass over MNIST, L=3 residual blocks + readout (no nonlinearity, RMSNorm before every
layer), d = 784, batch 16. The hybrid layers (Alg. 4) train their stored rows with Adam and
append a query only if it is farther than τ from every stored key (τ relative to
‖q‖ = √d = 28), at most N rows per layer. The reference point is the full-growth weighted
softmax (Alg. 3: one row per sample per layer) with the same rule, temperature and D0.

Images are RMS-normalised (‖x‖ = √d, like the paper's channel-normalised CIFAR inputs) so
the input and the block outputs share the residual stream on the same scale. D0 is F.3's
(B random RMS-normalised rows, w = 1/B) for both models: with F.4's zero D0 the blocks start
with output 0, so ⟨s, g⟩ = 0 and their first rows get w = 0, and on MNIST with L = 3 both the
full-growth and the hybrid model stalled (38% and 12% test accuracy after 1500 samples in a
pilot, against 91% with the random D0); ``init = "zeros"`` remains available.

Capacity = rows stored after training, summed over the 4 layers, divided by the rows of full
growth (4·(samples + B)), as in F.4.

    python benchmarks/hybrid_growth.py --preset smoke   # seconds (run by the tests)
    python benchmarks/hybrid_growth.py --preset cpu     # the committed results (~15-25 min on 2 shared cores)
    python benchmarks/hybrid_growth.py --preset cpu8k --out benchmarks/results/hybrid_growth_8k
    python benchmarks/hybrid_growth.py --preset paper   # all 60k training images, 6 τ values

Writes benchmarks/results/hybrid_growth.json (``summary.full_growth_accuracy``,
``summary.points`` = [{tau, capacity_fraction, accuracy}]) and hybrid_growth.png.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from tqdm import tqdm

from growmem import policies
from growmem.data import mnist
from growmem.layers import GrowingSpec, ResidualGrowingNet
from growmem.reporting import pyplot, save_figure, write_json
from growmem.train import Trainer

RESULTS = Path(__file__).resolve().parent / "results"

COMMON = dict(batch=16, n_blocks=3, temperature=5.0, eta=1.0, beta=30.0, adam_lr=1e-3, init="random", seed=0)
PRESETS = {
    # a few steps on a tiny subset: checks the pipeline end to end
    "smoke": dict(COMMON, n_train=160, n_test=200, n_blocks=0, taus=[0.6], capacity=256),
    # a 4000-sample single pass and 5 τ values around the knee: the shared 2-core machine ran full growth at
    # 2 s/step with 7.5k rows per layer, so 60k samples (or even 10k) would take hours
    "cpu": dict(COMMON, n_train=4_000, n_test=2_000, taus=[0.7, 0.75, 0.77, 0.8, 0.9], capacity=1024),
    # twice the samples at the two τ values nearest the goal (growth is sublinear: the capacity
    # fraction at a fixed τ falls as samples accumulate); ~20 min on 2 shared cores
    "cpu8k": dict(COMMON, n_train=8_000, n_test=2_000, taus=[0.72, 0.75], capacity=1024),
    # all of MNIST, the Table 4 τ grid scaled to d = 784 (35..60 / 55.4 of √3072)
    "paper": dict(COMMON, n_train=60_000, n_test=10_000, taus=[0.63, 0.72, 0.81, 0.9, 0.99, 1.08],
                  capacity=4096),
}


def prepare(xy):
    """RMS-normalise the images (‖x‖ = √d)."""
    x, y = xy
    return (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))).astype(np.float32), y


def make_spec(cfg) -> GrowingSpec:
    return GrowingSpec.make("weighted_softmax", temperature=cfg["temperature"], eta=cfg["eta"], beta=cfg["beta"],
                            init=cfg["init"], init_rows=cfg["batch"])


def make_policy(cfg, tau=None):
    """Full growth (tau None): Alg. 3, no policy. Otherwise the hybrid layer of Alg. 4."""
    if tau is None:
        return None
    max_rows = cfg["n_train"] + cfg["batch"]  # N: room for one row per sample (never binding)
    return policies.chain(policies.novelty(tau, relative=True), policies.capacity(max_rows, "reject"),
                          policies.hybrid(optax.adam(cfg["adam_lr"])))


def run(cfg, tau, data, bar=None, label=""):
    (xtr, ytr), (xte, yte) = data
    b = cfg["batch"]
    spec = make_spec(cfg)
    net = ResidualGrowingNet(d_out=10, n_blocks=cfg["n_blocks"], block=spec, readout=spec, capacity=cfg["capacity"])
    tr = Trainer(net, sample_input=xtr[:b], rng=jax.random.key(cfg["seed"]), policy=make_policy(cfg, tau))
    t0 = time.perf_counter()
    curve = []
    n_steps = len(xtr) // b
    for i in range(n_steps):
        tr.step(xtr[i * b:(i + 1) * b], ytr[i * b:(i + 1) * b])
        if bar is not None:
            bar.update(1)
        if (i + 1) % max(1, n_steps // 8) == 0 or i + 1 == n_steps:
            curve.append({"samples": (i + 1) * b, "rows": sum(tr.rows_in_use().values())})
            if bar is not None:
                bar.set_postfix_str(f"{label} rows={curve[-1]['rows']}")
    train_s = time.perf_counter() - t0
    pred = np.asarray(tr.predict(xte, batch_size=500)).argmax(-1)
    acc = float((pred == yte).mean())
    rows = tr.rows_in_use()
    full = (cfg["n_blocks"] + 1) * (n_steps * b + b)
    return {"accuracy": acc, "rows_per_layer": rows, "rows": sum(rows.values()),
            "capacity_fraction": sum(rows.values()) / full, "train_seconds": train_s, "growth": curve}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON and PNG")
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    args = ap.parse_args(argv)
    cfg = PRESETS[args.preset]
    data = (prepare(mnist.load("train", args.data_dir, limit=cfg["n_train"])),
            prepare(mnist.load("test", args.data_dir, limit=cfg["n_test"])))
    n_steps = cfg["n_train"] // cfg["batch"]
    t0 = time.perf_counter()
    with tqdm(total=n_steps * (1 + len(cfg["taus"])), desc=f"hybrid growth [{args.preset}]", unit="step",
              dynamic_ncols=True) as bar:
        full = run(cfg, None, data, bar, "full growth")
        hybrid = []
        for tau in cfg["taus"]:
            r = run(cfg, tau, data, bar, f"tau={tau}")
            hybrid.append({"tau": tau, "tau_absolute": tau * math.sqrt(784), **r})

    points = [{"tau": h["tau"], "capacity_fraction": h["capacity_fraction"], "accuracy": h["accuracy"]}
              for h in hybrid]
    ok = [p for p in points if p["capacity_fraction"] <= 0.2 and p["accuracy"] >= full["accuracy"] - 0.02]
    summary = {
        "full_growth_accuracy": full["accuracy"],
        "points": points,
        "goal_met": bool(ok),  # some τ keeps ≤ 20% of full capacity, losing ≤ 2 accuracy points
        "best_point_meeting_goal": min(ok, key=lambda p: p["capacity_fraction"]) if ok else None,
    }
    payload = {"benchmark": "hybrid_growth", "preset": args.preset,
               "command": "python benchmarks/hybrid_growth.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": {**cfg, "note": (
                   f"tau in units of ||q|| = sqrt(784) = 28; the {args.preset} preset uses the first "
                   f"{cfg['n_train']} training images (single pass) and the first {cfg['n_test']} test images "
                   "(to fit ~20 min on 2 shared cores); images RMS-normalised; D0 = F.3 random rows (w = 1/B) "
                   "for both models (zero D0 stalls, see the module docstring); N = samples + B (never binding)")},
               "summary": summary, "seconds": time.perf_counter() - t0, "full_growth": full, "hybrid": hybrid}
    path = write_json(args.out / "hybrid_growth.json", payload)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    xs = [p["capacity_fraction"] for p in points]
    ys = [100 * p["accuracy"] for p in points]
    ax.plot(xs, ys, "o-", color="tab:blue", label="hybrid weighted softmax (Alg. 4)")
    for p, x, y in zip(points, xs, ys):
        ax.annotate(f"τ={p['tau']}√d", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.plot([1.0], [100 * full["accuracy"]], "*", ms=12, color="tab:red", label="full growth (Alg. 3)")
    ax.axhline(100 * full["accuracy"] - 2, ls=":", color="gray", lw=0.8, label="full growth − 2 points")
    ax.axvline(0.2, ls="--", color="gray", lw=0.8, label="20% capacity")
    ax.set_xscale("log")
    ax.set_xlabel("final capacity (fraction of one row per sample)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"MNIST single pass, L=3, B=16 ({cfg['n_train']} samples, {args.preset})")
    ax.legend(fontsize=7)
    save_figure(fig, args.out / "hybrid_growth.png")
    plt.close(fig)

    print(f"\n{'model':22s} {'capacity':>9s} {'rows':>8s} {'accuracy':>9s} {'train s':>8s}")
    print(f"{'full growth':22s} {1.0:9.3f} {full['rows']:8d} {100 * full['accuracy']:8.2f}% "
          f"{full['train_seconds']:8.1f}")
    for h in hybrid:
        print(f"{'hybrid tau=' + str(h['tau']) + 'sqrt(d)':22s} {h['capacity_fraction']:9.3f} {h['rows']:8d} "
              f"{100 * h['accuracy']:8.2f}% {h['train_seconds']:8.1f}")
    print(f"goal (some tau <= 20% capacity, <= 2 points lost): {'met' if ok else 'NOT met'}")
    print(f"wrote {path} and {args.out / 'hybrid_growth.png'}")
    return payload


if __name__ == "__main__":
    main()
