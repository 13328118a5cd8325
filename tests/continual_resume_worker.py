"""Subprocess used by tests/test_continual_resume.py: a small continual run that checkpoints.

    python tests/continual_resume_worker.py OUT.json [--ckpt DIR] [--resume] [--sleep S]

Prints ``<method> exp <e> batch <b>`` (flushed) after every training batch; writes the runs'
results (without timings) to OUT.json.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from growmem.continual.runner import run_continual  # noqa: E402

SETTINGS = dict(stream="drifting_teacher", methods=["growmem", "naive"], seeds=[5],
                stream_options=dict(n_experiences=3, train_limit=160, test_limit=64), checkpoint_every=3,
                progress=False, verbose=False, threads=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ckpt")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()

    def on_batch(info):
        print(f"{info['method']} exp {info['experience']} batch {info['batch']}", flush=True)
        if a.sleep:
            time.sleep(a.sleep)

    doc = run_continual(checkpoint_dir=a.ckpt, resume=a.resume, on_batch=on_batch, **SETTINGS)
    keep = ("method", "seed", "accuracy_matrix", "acc_stream_weighted_after", "bytes", "prequential_acc", "resumed")
    runs = []
    for r in doc["runs"]:
        s = {k: v for k, v in r["summary"].items() if not k.endswith("seconds")}
        runs.append({**{k: r[k] for k in keep}, "summary": s})
    with open(a.out, "w") as f:
        json.dump(runs, f)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
