"""Subprocess used by tests/test_continual_resume.py: a small continual run that checkpoints.

    python tests/continual_resume_worker.py OUT.json [--ckpt DIR] [--resume] [--hang-at LINE]

Prints ``<method> exp <e> batch <b>`` (flushed) after every training batch; with ``--hang-at``
it stops after printing that line and waits to be killed (so the kill lands at a known point);
writes the runs' results (without timings) to OUT.json.
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
    ap.add_argument("--hang-at", default=None)
    a = ap.parse_args()

    def on_batch(info):
        line = f"{info['method']} exp {info['experience']} batch {info['batch']}"
        print(line, flush=True)
        if line == a.hang_at:
            time.sleep(600)  # the test kills this process with SIGKILL now

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
