"""Every example in examples/ runs as documented (as a user would run it)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def _run(name, *args, env=None):
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=600,
                       env={**ENV, **(env or {})})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_every_example_has_a_test():
    tested = {"quickstart.py", "custom_policy.py", "sharded_memory.py", "target_memory.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_quickstart_trains_a_layer_and_stores_rows():
    out = _run("quickstart.py")
    rows = re.search(r"stored rows: \{'w': \((\d+),\)", out)
    assert rows and int(rows.group(1)) > 0
    mse = [float(m) for m in re.findall(r"test MSE ([0-9.e+-]+)", out)]
    assert len(mse) >= 2 and mse[-1] < mse[0]


def test_custom_policy_refuses_candidates():
    out = _run("custom_policy.py")
    refused = [int(m) for m in re.findall(r"refused\s+(\d+)", out)]
    assert refused and refused[-1] > 0


def test_sharded_memory_example_on_four_devices():
    out = _run("sharded_memory.py", env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert "4 shards" in out


def test_target_memory_example_does_not_forget():
    out = _run("target_memory.py")
    acc = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.{18}) accuracy ([0-9.]+)", out, re.M)}
    assert acc["class-incremental"] == pytest.approx(acc["shuffled"], abs=0.01)
    assert acc["class-incremental"] > 0.9
    used, allocated = re.search(r"40 kB budget.*bytes (\d+) \(allocated (\d+)\)", out).groups()
    assert int(used) <= int(allocated) <= 40_000
