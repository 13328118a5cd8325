"""Speed of the novelty search (Alg. 4 line 9) against its speed limit, a bare matrix product.

``policies.novelty`` finds ``min_j ‖q − k_j‖²`` over the stored rows through
``‖q‖² + ‖k‖² − 2 q·k`` in row chunks. Its unavoidable work is the product ``q Kᵀ`` (the
squared norms of the keys add a pass over each chunk, cheap while the chunk is in cache).
In one run, interleaved, this times the search and a bare jitted ``q @ K.T`` of the same
shapes (B=16, d=3072, N=50k) and reports ``ratio = bare time / search time`` (goal ≥ 0.8),
also for other chunk sizes.

    python benchmarks/novelty_search.py --preset smoke   # seconds (run by the tests)
    python benchmarks/novelty_search.py --preset cpu     # the committed results
    python benchmarks/novelty_search.py --preset paper   # same shapes, more repeats

Writes benchmarks/results/novelty_search.json (``summary.ratio``) and novelty_search.png.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from growmem import memory as memlib
from growmem import policies
from growmem.layers import rms_norm
from growmem.reporting import pyplot, save_figure, write_json
from growmem.rules import Rows

RESULTS = Path(__file__).resolve().parent / "results"

PRESETS = {
    "smoke": dict(batch=16, d=128, n_rows=2_000, repeats=2, chunks=[policies.NOVELTY_CHUNK, 1024]),
    "cpu": dict(batch=16, d=3072, n_rows=50_000, repeats=15, chunks=[64, 128, 256, 512, 1024, 4096]),
    "paper": dict(batch=16, d=3072, n_rows=50_000, repeats=50, chunks=[64, 128, 256, 512, 1024, 4096]),
}


def time_interleaved(fns, repeats, bar=None):
    """Median seconds of each zero-argument function, run in rotating order each round."""
    names = list(fns)
    for n in names:  # compile and first touch
        jax.block_until_ready(fns[n]())
    times = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[n]())
            times[n].append(time.perf_counter() - t0)
        if bar is not None:
            bar.update(1)
    return {n: float(statistics.median(t)) for n, t in times.items()}, times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON and PNG")
    args = ap.parse_args(argv)
    cfg = PRESETS[args.preset]
    b, d, n = cfg["batch"], cfg["d"], cfg["n_rows"]
    key_k, key_q = jax.random.split(jax.random.key(0))
    keys = rms_norm(jax.random.normal(key_k, (n, d), jnp.float32))
    mem = memlib.from_rows(jnp.ones((n,)), keys, jnp.zeros((n, 1)))       # capacity rounded up
    q = rms_norm(jax.random.normal(key_q, (b, d), jnp.float32))
    rows = Rows(jnp.ones((b,)), q, jnp.zeros((b, 1)))
    mask = jnp.ones((b,), bool)
    tau = 1.0  # relative to sqrt(d); the threshold does not change the work

    bare = jax.jit(lambda q, k: q @ k.T)
    fns = {"bare_product": lambda: bare(q, keys)}
    for c in cfg["chunks"]:
        pol = policies.novelty(tau, relative=True, chunk=c)
        admit = jax.jit(lambda mem, rows, mask, pol=pol: pol.admit(policies.Growth(mem, rows, mask, mask), ())[0].mask)
        fns[f"novelty_chunk_{c}"] = (lambda admit: lambda: admit(mem, rows, mask))(admit)
    with tqdm(total=cfg["repeats"], desc=f"novelty search [{args.preset}]", unit="round", dynamic_ncols=True) as bar:
        med, raw = time_interleaved(fns, cfg["repeats"], bar)

    # correctness spot check against numpy on a few queries
    d2 = np.asarray(policies.min_sq_distance(q, mem.k, size=mem.size))
    kn, qn = np.asarray(keys, np.float64), np.asarray(q, np.float64)
    want = ((qn ** 2).sum(1)[:, None] + (kn ** 2).sum(1)[None] - 2 * qn @ kn.T).min(1)
    max_rel_err = float(np.max(np.abs(d2 - want) / want))

    default = f"novelty_chunk_{policies.NOVELTY_CHUNK}"
    ratios = {c: med["bare_product"] / med[f"novelty_chunk_{c}"] for c in cfg["chunks"]}
    gflop = 2 * b * d * n / 1e9
    summary = {
        "ratio": ratios[policies.NOVELTY_CHUNK] if policies.NOVELTY_CHUNK in ratios else None,
        "default_chunk": policies.NOVELTY_CHUNK,
        "bare_product_ms": 1e3 * med["bare_product"],
        "novelty_search_ms": 1e3 * med[default] if default in med else None,
        "ratio_by_chunk": {str(c): r for c, r in ratios.items()},
        "shapes": {"B": b, "d": d, "N": n},
        "goal_met": (ratios.get(policies.NOVELTY_CHUNK) or 0) >= 0.8,
    }
    payload = {"benchmark": "novelty_search", "preset": args.preset,
               "command": "python benchmarks/novelty_search.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": cfg, "summary": summary, "median_seconds": med, "seconds_per_round": raw,
               "bare_product_gflop_per_s": gflop / med["bare_product"], "max_relative_error_vs_numpy": max_rel_err}
    path = write_json(args.out / "novelty_search.json", payload)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    cs = cfg["chunks"]
    ax.semilogx(cs, [ratios[c] for c in cs], "o-", base=2, label="bare product time / search time")
    ax.axhline(0.8, ls=":", color="gray", label="goal 0.8")
    ax.axvline(policies.NOVELTY_CHUNK, ls="--", color="tab:red", lw=0.8, label="default chunk")
    ax.set_xlabel("rows per chunk")
    ax.set_ylabel("ratio")
    ax.set_title(f"Novelty search, B={b}, d={d}, N={n} ({args.preset})")
    ax.legend(fontsize=7)
    save_figure(fig, args.out / "novelty_search.png")
    plt.close(fig)

    print(f"\n{'variant':22s} {'median ms':>10s} {'ratio':>7s}")
    print(f"{'bare q @ K.T':22s} {1e3 * med['bare_product']:10.2f} {1.0:7.2f}")
    for c in cs:
        print(f"{'novelty chunk=' + str(c):22s} {1e3 * med[f'novelty_chunk_{c}']:10.2f} {ratios[c]:7.2f}"
              + ("  (default)" if c == policies.NOVELTY_CHUNK else ""))
    print(f"ratio (default chunk {policies.NOVELTY_CHUNK}): {summary['ratio']:.2f}  (goal >= 0.8); "
          f"max rel. error vs numpy {max_rel_err:.1e}")
    print(f"wrote {path} and {args.out / 'novelty_search.png'}")
    return payload


if __name__ == "__main__":
    main()
