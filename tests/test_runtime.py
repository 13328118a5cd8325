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
