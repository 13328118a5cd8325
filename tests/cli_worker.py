"""``python tests/cli_worker.py ARGS...``: the ``growmem`` command as a script (for tests that
start it as several jax.distributed processes)."""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from growmem.app.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
