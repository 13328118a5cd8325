"""growmem.runtime.allgather_json across two real jax.distributed processes: every process gets every
process's value, in process order, exchange after exchange, and the coordinator's store keeps only the
last two exchanges."""
import json
from pathlib import Path

import allgather_worker as worker
from growmem.runtime import allgather_json

HERE = Path(__file__).parent


def test_one_process_gets_its_own_value_back():
    assert allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}]


def test_two_processes_each_get_both_values_in_process_order(distributed_run):
    logs = distributed_run(HERE / "allgather_worker.py", lambda i, port: (port, i))
    for log in logs:
        got = [json.loads(line) for line in log.splitlines() if line.startswith("[")]
        assert got == [[worker.value(call, 0), worker.value(call, 1)] for call in range(5)], log[-2000:]
        left = [json.loads(line[len("left "):]) for line in log.splitlines() if line.startswith("left ")]
        assert left == [[f"growmem/allgather/{n}/{i}" for n in (5, 6) for i in (0, 1)]], log[-2000:]


CACHE_SCRIPT = """
import jax, jax.numpy as jnp
from jax import monitoring
from growmem.runtime import compilation_cache
loaded = []   # programs loaded from the persistent cache
monitoring.register_event_listener(lambda name, **kw: loaded.append(name) if name ==
                                   '/jax/compilation_cache/cache_hits' else None)
print(compilation_cache())
f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())
print(float(f(jnp.arange(5.0)).sum()), len(loaded) > 0)
"""


def _cache_run(env, tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "GROWMEM_XLA_CACHE")} | env
    p = subprocess.run([sys.executable, "-c", CACHE_SCRIPT], env={**env, "JAX_PLATFORMS": "cpu"}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.split()


def test_the_compilation_cache_keeps_programs_where_asked_and_leaves_a_users_cache_alone(tmp_path):
    # the default folder under $XDG_CACHE_HOME: a program compiled there is loaded by the next process
    folder, value, hit = _cache_run({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path)
    assert folder == str(tmp_path / "xdg" / "growmem" / "xla") and hit == "False"
    assert any(p.name.endswith("-cache") for p in Path(folder).iterdir()), "no compiled program was written"
    assert _cache_run({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path) == [folder, value, "True"]
    # GROWMEM_XLA_CACHE names another folder, or turns it off; a user's own JAX cache is kept as it is
    assert _cache_run({"GROWMEM_XLA_CACHE": str(tmp_path / "mine")}, tmp_path)[0] == str(tmp_path / "mine")
    assert _cache_run({"GROWMEM_XLA_CACHE": "off", "XDG_CACHE_HOME": str(tmp_path / "x2")}, tmp_path)[0] == "None"
    assert not (tmp_path / "x2").exists()
    assert _cache_run({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax")}, tmp_path)[0] == str(tmp_path / "jax")
