"""Bounded memory under weight decay and pruning (App. A.4.1, D.1; Eqs. 21, 90).

A long MNIST stream (the training set, reshuffled every pass) through a growing weighted
softmax readout (L = 0, RMSNorm input, batch 16) whose policy is
``weight_decay(γ, prune_below=ε)``: every step the stored ``w`` and ``ṽ`` shrink by
``(1 − γ)`` and rows with ``|w|, ‖ṽ‖ < ε`` leave. A row of size s lives about
``log(ε/s) / γ`` steps, so the rows in use flatten to a plateau instead of growing one row
per sample. Records rows in use against the step for each γ (γ = 0: plain growth) and the
test accuracy at the end against γ.

    python benchmarks/decay_bounded.py --preset smoke   # seconds (run by the tests)
    python benchmarks/decay_bounded.py --preset cpu     # the committed results (~10 min on 2 shared cores)
    python benchmarks/decay_bounded.py --preset paper   # a longer stream

Writes benchmarks/results/decay_bounded.json (``summary.rows_at_end``, ``summary.rows_at_half``
of the headline γ) and decay_bounded.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from growmem import policies
from growmem.data import mnist
from growmem.layers import GrowingSpec, ResidualGrowingNet
from growmem.reporting import pyplot, save_figure, write_json
from growmem.train import Trainer

RESULTS = Path(__file__).resolve().parent / "results"

COMMON = dict(batch=16, temperature=5.0, eta=1.0, beta=30.0, eps=1e-3, seed=0)
PRESETS = {
    "smoke": dict(COMMON, steps=30, n_train=1_000, n_test=200, gammas=[0.0, 0.3], headline=0.3, record_every=5),
    # 1500 steps = 24k samples (2 shared cores); γ = 0 is the unbounded reference; test on the
    # first 2000 test images
    "cpu": dict(COMMON, steps=1_500, n_train=60_000, n_test=2_000, gammas=[0.0, 0.01, 0.03, 0.1],
                headline=0.03, record_every=25),
    "paper": dict(COMMON, steps=20_000, n_train=60_000, n_test=10_000,
                  gammas=[0.0, 0.001, 0.003, 0.01, 0.03, 0.1], headline=0.01, record_every=100),
}


def stream(x, y, batch, steps, seed):
    """``steps`` batches from the data, reshuffled at every pass."""
    rng = np.random.default_rng(seed)
    order = np.empty(0, int)
    for _ in range(steps):
        if len(order) < batch:
            order = np.concatenate([order, rng.permutation(len(x))])
        idx, order = order[:batch], order[batch:]
        yield x[idx], y[idx]


def run(cfg, gamma, data, bar=None):
    (xtr, ytr), (xte, yte) = data
    pol = policies.weight_decay(gamma, prune_below=cfg["eps"]) if gamma > 0 else None
    spec = GrowingSpec.make("weighted_softmax", temperature=cfg["temperature"], eta=cfg["eta"], beta=cfg["beta"],
                            init="random", init_rows=cfg["batch"])
    net = ResidualGrowingNet(d_out=10, n_blocks=0, readout=spec, capacity=1024)
    tr = Trainer(net, sample_input=xtr[:cfg["batch"]], rng=jax.random.key(cfg["seed"]), policy=pol)
    curve = [(0, sum(tr.rows_in_use().values()))]
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(stream(xtr, ytr, cfg["batch"], cfg["steps"], cfg["seed"])):
        tr.step(x, y)
        if (i + 1) % cfg["record_every"] == 0 or i + 1 == cfg["steps"]:
            curve.append((i + 1, sum(tr.rows_in_use().values())))
            if bar is not None:
                bar.set_postfix_str(f"gamma={gamma} rows={curve[-1][1]}")
        if bar is not None:
            bar.update(1)
    seconds = time.perf_counter() - t0
    acc = float((np.asarray(tr.predict(xte, batch_size=500)).argmax(-1) == yte).mean())
    half = min(curve, key=lambda c: abs(c[0] - cfg["steps"] // 2))
    return {"gamma": gamma, "accuracy": acc, "rows_at_end": curve[-1][1], "rows_at_half": half[1],
            "curve": curve, "train_seconds": seconds}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON and PNG")
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    args = ap.parse_args(argv)
    cfg = PRESETS[args.preset]
    data = (mnist.load("train", args.data_dir, limit=cfg["n_train"]),
            mnist.load("test", args.data_dir, limit=cfg["n_test"]))
    t0 = time.perf_counter()
    runs = []
    with tqdm(total=cfg["steps"] * len(cfg["gammas"]), desc=f"decay bounded [{args.preset}]", unit="step",
              dynamic_ncols=True) as bar:
        for gamma in cfg["gammas"]:
            runs.append(run(cfg, gamma, data, bar))
    head = next(r for r in runs if r["gamma"] == cfg["headline"])
    summary = {
        "rows_at_end": head["rows_at_end"],
        "rows_at_half": head["rows_at_half"],
        "gamma": head["gamma"],
        "prune_below": cfg["eps"],
        "samples": cfg["steps"] * cfg["batch"],
        "accuracy_by_gamma": {str(r["gamma"]): r["accuracy"] for r in runs},
        "rows_at_end_by_gamma": {str(r["gamma"]): r["rows_at_end"] for r in runs},
    }
    payload = {"benchmark": "decay_bounded", "preset": args.preset,
               "command": "python benchmarks/decay_bounded.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": cfg, "summary": summary, "seconds": time.perf_counter() - t0, "runs": runs}
    path = write_json(args.out / "decay_bounded.json", payload)

    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in runs:
        s, n = zip(*r["curve"])
        a1.plot(s, n, label=f"γ={r['gamma']}" + (" (no decay)" if r["gamma"] == 0 else ""))
    a1.set_xlabel("step")
    a1.set_ylabel("rows in use")
    a1.set_yscale("log")
    a1.set_title(f"rows in use, prune below ε={cfg['eps']}")
    a1.legend(fontsize=7)
    dec = [r for r in runs if r["gamma"] > 0]
    a2.semilogx([r["gamma"] for r in dec], [100 * r["accuracy"] for r in dec], "o-", label="weight decay + pruning")
    ref = [r for r in runs if r["gamma"] == 0]
    if ref:
        a2.axhline(100 * ref[0]["accuracy"], ls=":", color="gray", label="γ = 0 (unbounded growth)")
    a2.set_xlabel("γ")
    a2.set_ylabel("test accuracy (%)")
    a2.set_title(f"MNIST, {cfg['steps'] * cfg['batch']} samples streamed")
    a2.legend(fontsize=7)
    save_figure(fig, args.out / "decay_bounded.png")
    plt.close(fig)

    print(f"\n{'gamma':>7s} {'rows@half':>10s} {'rows@end':>9s} {'accuracy':>9s} {'train s':>8s}")
    for r in runs:
        print(f"{r['gamma']:7g} {r['rows_at_half']:10d} {r['rows_at_end']:9d} {100 * r['accuracy']:8.2f}% "
              f"{r['train_seconds']:8.1f}")
    print(f"headline gamma={head['gamma']}: rows_at_half={head['rows_at_half']}, rows_at_end={head['rows_at_end']}")
    print(f"wrote {path} and {args.out / 'decay_bounded.png'}")
    return payload


if __name__ == "__main__":
    main()
