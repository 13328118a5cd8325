"""The ``growmem`` command in processes forked from one warm interpreter, for tests that start it many times.

A test that kills and restarts a run dozens of times (``tests/chaos``) spends most of each restart importing
jax, flax, orbax, tensorstore and matplotlib. :class:`ForkServer` starts one interpreter that imports them
(no JAX backend is initialised, no thread started: checked) and forks it for every :meth:`ForkServer.launch`;
the child sets ``sys.argv``, sends its stdout and stderr to files and runs ``growmem.app.cli.main`` as the
``growmem`` script does, then ends the way an interpreter ends (non-daemon threads joined, ``atexit``
handlers run: ``jax.distributed``'s shutdown among them). What a forked run computes is what a fresh
process computes: the imports are the same modules, nothing ran before the fork.

:class:`Forked` answers like ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
``communicate``, ``returncode``) so a test can hold either. The server is single-threaded: it reaps its
children without blocking between requests and reports each exit code on its stdout; a child SIGKILLed
reports ``-9``, as ``Popen`` does.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: what the server imports before its first fork: everything ``growmem train`` imports
PRELOAD = ("matplotlib", "matplotlib.pyplot", "jax", "jax.numpy", "flax", "optax", "orbax.checkpoint", "tensorstore",
           "growmem.app.cli", "growmem.train", "growmem.layers", "growmem.config", "growmem.policies",
           "growmem.checkpoint", "growmem.checkpoint.manager", "growmem.backends.tiered", "growmem.data",
           "growmem.reporting", "growmem.runtime")

SERVER = r'''
import importlib, json, os, select, signal, sys, threading
import matplotlib
matplotlib.use("Agg")
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
from jax._src import xla_bridge
if xla_bridge._backends or threading.active_count() != 1:   # a fork would copy a live backend or thread
    os.write(1, b"error: the imports started a JAX backend or a thread\n")
    sys.exit(1)


def own_cache(path):
    """This process writes its compiled programs to the persistent cache in ``path``, whatever its
    ``jax.distributed`` index: JAX writes from process 0 only (``compiler._cache_write``), so a second process
    would compile its programs again at every start (its keys name its own devices, never process 0's)."""
    import jax
    from jax._src import compilation_cache, compiler

    jax.config.update("jax_compilation_cache_dir", path)
    def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        # as compiler._cache_write: no program with host callbacks, none compiled faster than the minimum
        if not host_callbacks and compile_time_secs >= jax.config.jax_persistent_cache_min_compile_time_secs:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                      int(compile_time_secs))
    compiler._cache_write = write


def child(req):
    import atexit, traceback
    rc = 1
    try:
        os.setpgid(0, 0)
        os.chdir(req["cwd"])
        for i, path in ((1, req["stdout"]), (2, req["stderr"])):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, i)
            os.close(fd)
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["growmem", *req["argv"]]
        if req.get("cache"):
            own_cache(req["cache"])
        if req.get("prologue"):          # e.g. a fault injected before the command runs
            exec(compile(req["prologue"], "<prologue>", "exec"), {"__name__": "__prologue__"})
        from growmem.app.cli import main
        try:
            rc = main(req["argv"])
            rc = 0 if rc is None else rc
        except SystemExit as e:          # as the interpreter codes it: None 0, an int itself, text printed and 1
            rc = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(int(rc) & 0xFF)


signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # an ignored SIGCHLD (inherited) would reap the children unseen
os.write(1, b"ready\n")
buf = b""
while True:
    while True:                        # reap without blocking: report each exit as Popen would code it
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        os.write(1, f"exit {pid} {code}\n".encode())
    r, _, _ = select.select([0], [], [], 0.02)
    if not r:
        continue
    data = os.read(0, 65536)
    if not data:                       # the test is done: the children it left are its own to end
        break
    buf += data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        pid = os.fork()
        if pid == 0:
            child(json.loads(line))
        os.write(1, f"pid {pid}\n".encode())
'''


class ForkServer:
    """One warm interpreter (environment ``env``) that forks a ``growmem`` command per :meth:`launch`."""

    def __init__(self, env: dict, workdir: Path, preload=PRELOAD, timeout: float = 120.0):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(list(preload))], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._buf = b""
        self._pids: list = []
        self.exits: dict = {}
        self._count = 0
        line = self._line(timeout)
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the fork server did not start: {line!r} {self.proc.stderr.read().decode()[-3000:]}")
        os.set_blocking(self.proc.stdout.fileno(), False)

    def _line(self, timeout: float):
        """The next line the server wrote (waiting at most ``timeout`` seconds), or None."""
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self._buf:
            if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:   # timeout 0: only what is there
                return None
            data = os.read(fd, 65536)
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def pump(self, timeout: float = 0.0):
        """Read what the server reported (waiting up to ``timeout`` for one line)."""
        while (line := self._line(timeout)) is not None:
            kind, pid, *rest = line.split()
            if kind == "pid":
                self._pids.append(int(pid))
            elif kind == "exit":
                self.exits[int(pid)] = int(rest[0])
            timeout = 0.0

    def launch(self, argv, cwd=None, cache=None, prologue=None) -> "Forked":
        """Start ``growmem ARGV`` in a forked process (its stdout and stderr to files under ``workdir``).
        ``cache``: a folder of its own for the persistent compilation cache, written whatever the process's
        ``jax.distributed`` index (give each process of a distributed run its own: JAX's cache writes are not
        safe between processes). ``prologue``: Python source the child runs first (a resource limit, a patched
        function: a fault to inject)."""
        self._count += 1
        out, err = (self.workdir / f"{self._count}.{s}" for s in ("out", "err"))
        req = {"argv": [str(a) for a in argv], "cwd": str(cwd or os.getcwd()), "stdout": str(out),
               "stderr": str(err), "cache": None if cache is None else str(cache), "prologue": prologue}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        n = len(self._pids)
        end = time.monotonic() + 60
        while len(self._pids) == n:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"the fork server did not fork: {self.proc.stderr.read().decode()[-3000:]}")
            self.pump(0.05)
        return Forked(self, self._pids[-1], out, err)

    def close(self):
        """End the server (and any child still running)."""
        self.pump()
        for pid in self._pids:
            if pid not in self.exits:
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Forked:
    """A forked ``growmem`` process, answering like ``subprocess.Popen`` (text ``communicate``)."""

    def __init__(self, server: ForkServer, pid: int, out: Path, err: Path):
        self.server, self.pid, self._out, self._err = server, pid, out, err

    @property
    def returncode(self):
        return self.server.exits.get(self.pid)

    def poll(self):
        self.server.pump()
        return self.returncode

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"growmem (pid {self.pid})", timeout)
            self.server.pump(0.05)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(9)

    def communicate(self, timeout=None):
        self.wait(timeout)
        return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")


_SHARED: dict = {}


def shared(env: dict) -> ForkServer:
    """This process's server for ``env`` (started on first use, ended at exit)."""
    key = json.dumps(sorted(env.items()))
    if key not in _SHARED or _SHARED[key].proc.poll() is not None:
        _SHARED[key] = ForkServer(env, tempfile.mkdtemp(prefix="growmem-forked-"))
        atexit.register(_SHARED[key].close)
    return _SHARED[key]


def run(env: dict, args, *, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``subprocess.run(["growmem", *args], env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout)``,
    forked from :func:`shared` ``(env)``: killed and ``TimeoutExpired`` past ``timeout``, as ``subprocess.run``."""
    args = [str(a) for a in args]
    p = shared(env).launch(args, cwd=cwd)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise
    for f in (p._out, p._err):
        f.unlink(missing_ok=True)
    return subprocess.CompletedProcess(["growmem", *args], p.returncode, out, err)
