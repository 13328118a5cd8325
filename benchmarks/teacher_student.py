"""Teacher-student regression (Sec. 5, Fig. 1; App. F.1.2, Tables 2, 6, 13).

Compares, at equal numbers of samples, the single-layer growing weighted softmax
(Table 2 grid), the parametric softmax whose width equals the final database
size (Table 6), and the reference MLP student (Table 13). For each model the
hyperparameters with the lowest final test loss are kept (App. F.1).

    python benchmarks/teacher_student.py --preset smoke   # seconds (run by the tests)
    python benchmarks/teacher_student.py --preset cpu     # the committed results (<1 h on 2 cores)
    python benchmarks/teacher_student.py --preset paper   # Tables 2/6/13 as printed (GPU/TPU)

Writes benchmarks/results/teacher_student.json (``summary.final_test_loss``,
``summary.samples``) and teacher_student.png.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from growmem.repro import teacher_student as experiments
from growmem.data.teacher_student import TeacherStudent
from growmem.reporting import pyplot, save_figure, write_json
from growmem.repro.core import grid
from growmem.repro.teacher_student import PRESETS as _REPRO_PRESETS

RESULTS = Path(__file__).resolve().parent / "results"

#: the grids of ``growmem repro teacher-student`` (smoke: a handful of steps; cpu: reduced grids of
#: Tables 2 / 6 / 13 at 64k samples, centred on what a first sweep chose — results/teacher_student_sweep1.json;
#: paper: 200k steps, the full grids). One definition: the repro reuses this benchmark's JSON.
PRESETS = {name: {k: v for k, v in cfg.items() if k not in ("seed", "reuse_benchmark")}
           for name, cfg in _REPRO_PRESETS.items()}


def best(runs):
    return min(runs, key=lambda r: r["final_test_loss"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON and PNG")
    ap.add_argument("--seed", type=int, default=0, help="teacher seed")
    ap.add_argument("--resume", action="store_true",
                    help="reuse finished runs from <out>/teacher_student.partial.jsonl (same preset and seed)")
    args = ap.parse_args(argv)
    cfg = PRESETS[args.preset]
    steps, batch, every = cfg["steps"], cfg["batch"], cfg["eval_every"]
    task = TeacherStudent(seed=args.seed)
    test = task.test_set(cfg["test_size"])
    gws_grid, psm_grid, mlp_grid = grid(cfg["gws"]), grid(cfg["psm"]), grid(cfg["mlp"])
    total = steps * (len(gws_grid) + len(psm_grid) + len(mlp_grid))
    t0 = time.perf_counter()
    runs = {"growing_weighted_softmax": [], "parametric_softmax": [], "reference_mlp": []}
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "teacher_student.partial.jsonl"
    done = {}
    if args.resume and partial.exists():
        for line in partial.read_text().splitlines():
            rec = json.loads(line)
            if rec["preset"] == args.preset and rec["seed"] == args.seed:
                done[(rec["model"], json.dumps(rec["hyper"], sort_keys=True))] = rec["result"]
    elif partial.exists():
        partial.unlink()
    # parametric softmax as wide as the final database of the growing model (Table 6)
    width = batch * (steps + 1)
    jobs = ([("growing_weighted_softmax", hp, experiments.run_growing_ws, {}) for hp in gws_grid]
            + [("parametric_softmax", hp, experiments.run_parametric_softmax, {"width": width}) for hp in psm_grid]
            + [("reference_mlp", hp, experiments.run_reference_mlp, {}) for hp in mlp_grid])
    with tqdm(total=total, desc=f"teacher-student [{args.preset}]", unit="step", dynamic_ncols=True) as bar:
        common = dict(steps=steps, batch=batch, eval_every=every, test=test, progress=bar.update)
        for model, hp, fn, extra in jobs:
            hyper = {**hp, **extra}
            key = (model, json.dumps(hyper, sort_keys=True))
            if key in done:
                r = done[key]
                bar.update(steps)
            else:
                bar.set_postfix_str(f"{model} {hp}")
                r = fn(task, **common, **hp, **extra)
                with partial.open("a") as f:
                    f.write(json.dumps({"preset": args.preset, "seed": args.seed, "model": model,
                                        "hyper": hyper, "result": r}) + "\n")
            runs[model].append({"hyper": hyper, **r})

    chosen = {name: best(rs) for name, rs in runs.items()}
    target_var = float(test[1].var())
    summary = {
        "final_test_loss": {name: r["final_test_loss"] for name, r in chosen.items()},
        "samples": steps * batch,
        "chosen_hyperparameters": {name: r["hyper"] for name, r in chosen.items()},
        "target_variance": target_var,
        "claim_gws_below_parametric": chosen["growing_weighted_softmax"]["final_test_loss"]
        < chosen["parametric_softmax"]["final_test_loss"],
        "claim_mlp_best": chosen["reference_mlp"]["final_test_loss"]
        <= min(r["final_test_loss"] for r in chosen.values()),
    }
    payload = {"benchmark": "teacher_student", "preset": args.preset,
               "command": "python benchmarks/teacher_student.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "config": {k: v for k, v in cfg.items()}, "summary": summary,
               "seconds": time.perf_counter() - t0, "runs": runs}
    path = write_json(args.out / "teacher_student.json", payload)
    partial.unlink(missing_ok=True)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {"growing_weighted_softmax": "tab:blue", "parametric_softmax": "tab:red", "reference_mlp": "tab:gray"}
    for name, r in chosen.items():
        xs, ys = zip(*[(s, l) for s, l in r["curve"] if s > 0])
        ax.loglog(xs, ys, label=f"{name} {r['hyper']}", color=colors[name])
    ax.axhline(target_var, ls=":", color="k", lw=0.8, label="predict 0 (target variance)")
    ax.set_xlabel("training samples")
    ax.set_ylabel("test MSE")
    ax.set_title(f"Teacher-student regression ({args.preset} preset)")
    ax.legend(fontsize=6)
    save_figure(fig, args.out / "teacher_student.png")

    print(f"\n{'model':28s} {'final test MSE':>15s}  {'/ target var':>12s}  hyperparameters")
    for name, r in chosen.items():
        print(f"{name:28s} {r['final_test_loss']:15.3e}  {r['final_test_loss'] / target_var:12.4f}  {r['hyper']}")
    g, p, m = (summary["final_test_loss"][k] for k in ("growing_weighted_softmax", "parametric_softmax", "reference_mlp"))
    print(f"ratios at {steps * batch} samples: parametric/growing = {p / g:.2f}x, growing/mlp = {g / m:.2f}x")
    print(f"wrote {path} and {args.out / 'teacher_student.png'}")
    return payload


if __name__ == "__main__":
    main()
