"""``python tests/allgather_worker.py PORT PROCESS_ID``: one process of a 2-process ``jax.distributed`` run
that exchanges five JSON values of different sizes with :func:`growmem.runtime.allgather_json` and prints
what it received, one JSON line per exchange, then the exchanges' keys left in the coordinator's store."""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from growmem.runtime import allgather_json  # noqa: E402


def value(call: int, pid: int):
    """What process ``pid`` sends at exchange ``call`` (sizes differ between processes and calls)."""
    return {"pid": pid, "call": call, "rows": list(range(pid * 7 + call)), "name": "é" * (pid + call)}


if __name__ == "__main__":
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    for call in range(5):
        print(json.dumps(allgather_json(value(call, pid))), flush=True)
    allgather_json(None)      # both processes past exchange 5: what each left is its own keys of 5 and 6
    from jax._src import distributed
    print("left", json.dumps(sorted(k for k, _ in distributed.global_state.client.key_value_dir_get("growmem/"))),
          flush=True)
