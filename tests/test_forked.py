"""tests/forked.py: a forked ``growmem`` answers as the ``growmem`` process would (exit codes, output, a
SIGKILL's -9), and computes what a fresh process computes."""
import json
import os
import signal
import subprocess
import sys

from forked import ForkServer

ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
RUN = ["train", "--steps", "6", "--batch-size", "16", "--test-size", "32", "--eval-every", "6"]


def test_a_forked_command_exits_prints_and_computes_as_the_command_does(tmp_path):
    server = ForkServer(ENV, tmp_path / "forked")
    try:
        bad = server.launch(["bogus"])
        out, err = bad.communicate(timeout=120)
        assert bad.returncode == 2 and "invalid choice: 'bogus'" in err and "Traceback" not in err, err
        # a prologue runs in the child before the command (and in no other child)
        pro = server.launch(["bogus"], prologue="import sys\nsys.stderr.write('prologue ran\\n')")
        _, err = pro.communicate(timeout=120)
        assert err.startswith("prologue ran\n") and "invalid choice" in err and pro.returncode == 2, err
        again = server.launch(["bogus"])
        assert "prologue ran" not in again.communicate(timeout=120)[1]

        ok = server.launch([*RUN, "--out", str(tmp_path / "a")])
        _, err = ok.communicate(timeout=300)
        assert ok.returncode == 0, err
        fresh = subprocess.run([sys.executable, "-m", "growmem.app.cli", *RUN, "--out", str(tmp_path / "b")], env=ENV,
                               capture_output=True, text=True, timeout=300)
        assert fresh.returncode == 0, fresh.stderr
        # a cache of its own: the programs it compiles are written there (and change nothing it computes)
        own = server.launch([*RUN, "--out", str(tmp_path / "d")], cache=tmp_path / "xla")
        _, err = own.communicate(timeout=300)
        assert own.returncode == 0, err
        assert any(f.name.endswith("-cache") for f in (tmp_path / "xla").iterdir())
        a, b, d = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in "abd")
        assert (a["final_test_loss"], a["rows"]) == (b["final_test_loss"], b["rows"]) == (d["final_test_loss"],
                                                                                           d["rows"])

        long = server.launch(["train", "--steps", "100000", "--out", str(tmp_path / "c")])
        assert long.poll() is None
        long.send_signal(signal.SIGKILL)
        assert long.wait(60) == -signal.SIGKILL
    finally:
        server.close()
    assert server.proc.returncode == 0
