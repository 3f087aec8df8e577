"""A warm interpreter for the suite's `python train.py` runs: torch, Lightning and Hydra imported once, each
run a fork of it.

Every CLI test would otherwise import torch, torchvision, Lightning and Hydra again: several seconds of
CPU per run on 2 cores, most of the suite's time. A fork of a process that has them starts at once and is
still a process of its own: its pid and process group, environment, working directory, argv, stdin from
/dev/null, stdout and stderr, exit status and interpreter shutdown (atexit, non-daemon threads) are the
run's. The Python children a run starts through `subprocess.Popen` (the DDP ranks of `strategy=ddp`, the
runs of a script such as scripts/benchmark.py) are forks of the same server, on the streams Popen gave them
and in the run's process group. What starts Python another way (torchrun, SLURM jobs, submitit's local
jobs, `ddp_spawn`, wandb's service) starts fresh.

A run whose environment changes what is read when those libraries load (threads, library paths, Python's
flags) gets a fresh interpreter, as does every run when HYDRALIGHT_TESTS_FRESH=1 (in the test's environment
or the run's).

Run as a script, this module is the server: it reads one JSON request per line on stdin, forks and answers
the child's pid at once; whenever a child ends it says so with its exit status (as `subprocess` reports it:
negative for a signal). Runs may overlap, as runs started with `subprocess.Popen` do. A run asks for its
children on a Unix socket, passing their standard streams along.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Read when torch, OpenMP or Python start, not later: a run that sets one differently needs its own interpreter.
LOAD_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PL_", "CUDA_", "NVIDIA_")
# Read when used: Python's path and warnings (set per run), Lightning's seed (set by a run for its ranks),
# the compile cache, the GPUs a job may see (read when CUDA starts, which the server never does).
LOAD_TIME_EXCEPT = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONWARNINGS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
                    "TORCHINDUCTOR_CACHE_DIR", "CUDA_VISIBLE_DEVICES")  # fmt: skip
# Modules a run starts as `python [-u] -m MODULE`: the DDP ranks, and submitit's local job and its tasks.
FORKED_MODULES = ("hydralight.worker", "submitit.local._local", "submitit.core._submit")


def forkable(args: list[str]) -> bool:
    """`python [-u] SCRIPT.py ...` or `python [-u] -m MODULE ...` for a module of FORKED_MODULES."""
    rest = args[1:][1:] if args[1:2] == ["-u"] else args[1:]
    if len(args) < 2 or args[0] != sys.executable or not rest:
        return False
    return rest[0].endswith(".py") or rest[0] == "-m" and len(rest) > 1 and rest[1] in FORKED_MODULES


def load_time_differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Variables read while the libraries load that two environments set differently."""
    names = {n for n in (*a, *b) if n.startswith(LOAD_TIME_PREFIXES) and n not in LOAD_TIME_EXCEPT}
    return sorted(n for n in names if a.get(n) != b.get(n))


class Messages:
    """Newline-delimited JSON messages from a file descriptor or a socket, each awaited up to a timeout."""

    def __init__(self, source: int | socket.socket, read: Callable[[int], bytes]) -> None:
        self.source, self.read, self.pending = source, read, b""

    def next(self, timeout: float | None) -> dict | None:
        """The next message, or None after `timeout` seconds without one (select sees all: no buffering)."""
        while b"\n" not in self.pending:
            if not select.select([self.source], [], [], timeout)[0]:
                return None
            chunk = self.read(65536)
            if not chunk:
                raise RuntimeError("the warm interpreter stopped")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)


class WarmProcess:
    """What the suite uses of `subprocess.Popen` (pid, poll, wait, communicate, signals), for a run forked by
    the warm interpreter. Its output goes to files, read back by `communicate`."""

    def __init__(self, server: WarmInterpreter, command: list[str], pid: int, out: Path, err: Path | None) -> None:
        self.args, self.pid, self.returncode = command, pid, None
        self.stdout = self.stderr = None  # no pipes: `communicate` returns the output
        self._server, self._out, self._err = server, out, err
        self._output: tuple[str, str | None] | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.status(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout, *self._read())
        return self.returncode

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        if self._output is None:
            self._output = self._read()
            for p in (self._out, self._err):
                if p is not None:
                    p.unlink(missing_ok=True)
        return self._output

    def _read(self) -> tuple[str, str | None]:
        text = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
        return text(self._out), None if self._err is None else text(self._err)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmInterpreter:
    """One server per test process, started at the first run and stopped with the process. Runs may overlap:
    `start` answers at once, `run` waits."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.count = 0
        self._messages: Messages | None = None
        self._exited: dict[int, int] = {}

    def _start(self, env: dict[str, str]) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            self.proc = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, bufsize=0
            )
            fd = self.proc.stdout.fileno()
            self._messages = Messages(fd, lambda size: os.read(fd, size))
            self._exited = {}
            ready = self._answer(timeout=600)  # the imports are done
            if ready != {"ready": True}:
                raise RuntimeError(f"the warm interpreter did not start: {ready!r}")
        return self.proc

    def _answer(self, timeout: float | None = None) -> dict | None:
        """The server's next message, or None after `timeout` seconds without one. Exit statuses are kept for
        `status`."""
        message = self._messages.next(timeout)
        if message is not None and "exited" in message:
            self._exited[message["exited"]] = message["status"]
        return message

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of run `pid` (as `subprocess` reports it: negative for a signal), or None if it is
        still running after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._exited:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._answer(left) is None:
                return None
        return self._exited[pid]

    def usable(self, env: dict[str, str]) -> bool:
        if any(e.get("HYDRALIGHT_TESTS_FRESH", "") not in ("", "0") for e in (os.environ, env)):
            return False
        return self.proc is None or not load_time_differences(self.env, env)

    def start(self, command: list[str], cwd: Path, env: dict[str, str], merged: bool = False) -> WarmProcess:
        """`subprocess.Popen(command, stdout=PIPE, stderr=STDOUT if merged else PIPE, text=True)` for
        `[python, script, *args]`; the run has its own session."""
        proc = self._start(env)
        self.count += 1
        out = self.scratch / f"run{self.count}.out"
        err = None if merged else self.scratch / f"run{self.count}.err"
        request = {"argv": command[1:], "cwd": str(cwd), "env": env, "out": str(out), "err": str(err or out)}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        while "started" not in (answer := self._answer()):
            pass
        return WarmProcess(self, command, answer["started"], out, err)

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """`subprocess.run(command, capture_output=True, text=True, timeout=...)` for `[python, script, *args]`."""
        process = self.start(command, cwd, env)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
                with contextlib.suppress(ProcessLookupError):
                    kill()
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def _say(message: dict, to: socket.socket | None = None) -> None:
    line = (json.dumps(message) + "\n").encode()
    if to is None:
        os.write(1, line)
    else:
        with contextlib.suppress(OSError):  # the run that asked has ended
            to.sendall(line)


def _serve(listener: socket.socket) -> dict:
    """The server's loop: forks a child per request (a line on stdin, or a rank asked for on `listener` by a
    run) and reports each child's exit to whoever asked; returns (in the child only) the request the child is
    to run. Ends when stdin closes and its children have ended."""
    base_path = sys.path[1:]  # without this file's folder
    _say({"ready": True})
    children: dict[int, socket.socket | None] = {}  # pid -> where its exit is told (None: stdout)
    runs: list[socket.socket] = []
    pending, closed = b"", False
    while not closed or children:
        while children and (ended := os.waitpid(-1, os.WNOHANG))[0]:
            pid, raw = ended
            _say({"exited": pid, "status": os.waitstatus_to_exitcode(raw), "raw": raw}, children.pop(pid))
        # Poll the children every 20 ms while any run; otherwise sleep until a request comes.
        watched = ([] if closed else [0]) + [listener, *runs]
        requests: list[tuple[dict, socket.socket | None]] = []
        for ready in select.select(watched, [], [], 0.02 if children or closed else None)[0]:
            if ready == 0:
                chunk = os.read(0, 65536)
                closed = not chunk
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    requests.append((json.loads(line), None))
            elif ready is listener:
                runs.append(listener.accept()[0])
            else:
                try:
                    message, fds, _, _ = socket.recv_fds(ready, 1 << 20, 3)
                except OSError:  # the run was killed
                    message = b""
                if not message:
                    runs.remove(ready)
                    ready.close()
                    continue
                while not message.endswith(b"\n"):
                    message += ready.recv(1 << 20)
                requests.append(({**json.loads(message), "fds": fds}, ready))
        for request, asker in requests:
            pid = os.fork()
            if pid == 0:
                listener.close()
                for run in runs:
                    run.close()
                request["base_path"] = base_path
                return request
            for fd in request.get("fds", []):
                os.close(fd)
            children[pid] = asker
            _say({"started": pid}, asker)
    sys.exit(0)


def _become(request: dict) -> bool:
    """Turn this fork into `cd CWD && env ENV python SCRIPT ARGS < /dev/null > OUT 2> ERR`, or (a rank a run
    asked for) `python SCRIPT ARGS` or `python -m MODULE ARGS` on the streams it passed."""
    if "fds" in request:
        if request["session"]:
            os.setsid()
        else:
            with contextlib.suppress(PermissionError):  # the run has ended already: nothing to join
                os.setpgid(0, request["pgid"])
        for fd, passed in enumerate(request["fds"]):
            os.dup2(passed, fd)
            os.close(passed)
    else:
        os.setpgid(0, 0)  # its own process group: a timeout kills what it started too (ranks included)
        streams = [(0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)]
        if request["err"] != request["out"]:
            streams.append((2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
        for fd, path, flags in streams:
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        if request["err"] == request["out"]:
            os.dup2(1, 2)  # stderr=STDOUT: one file, one offset
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # a process of its own reads its TMPDIR afresh
    argv = request["argv"]
    if argv[0] == "-u":
        argv = argv[1:]
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    module = argv[0] == "-m"
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *request["base_path"]]
    sys.argv[:] = argv[1:] if module else argv  # `-m MODULE ARGS`: run_module makes argv[0] the module's file
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return module


class WarmChild(subprocess.Popen):
    """`subprocess.Popen` inside a warm run: a Python child (`python SCRIPT.py ...`, or a DDP rank as
    `python -m hydralight.worker PLAN`) is forked by the server instead of started as a new interpreter, with
    the streams Popen prepared (pipes, files, or the run's own), in the run's process group unless a new
    session was asked for. Popen's own code does the rest (pipes, text, communicate, timeouts, signals); only
    starting the child and reading its exit status are the server's. Any other command starts as usual."""

    address: str = ""
    server_env: dict[str, str] = {}
    _warm = False

    def _eligible(self, args, executable, preexec_fn, pass_fds, env, shell, rest) -> bool:
        restore_signals, gid, gids, uid, umask, *_ = rest
        plain = not shell and executable is None and preexec_fn is None and not pass_fds
        plain = plain and gid is None and gids is None and uid is None and umask < 0
        args = [os.fspath(a) for a in args] if isinstance(args, list | tuple) else []
        environ = dict(os.environ if env is None else env)
        return plain and forkable(args) and not load_time_differences(self.server_env, environ)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):  # fmt: skip
        if not self._eligible(args, executable, preexec_fn, pass_fds, env, shell, rest):
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, *rest)  # fmt: skip
        start_new_session = rest[5]
        process_group = rest[6] if len(rest) > 6 else -1
        self._warm = True
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.connect(self.address)
        self._messages = Messages(self._sock, self._sock.recv)
        request = {
            "argv": [os.fspath(a) for a in args[1:]],
            "cwd": os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd(),
            "env": dict(os.environ if env is None else env),
            "session": bool(start_new_session),
            "pgid": process_group if process_group >= 0 else os.getpgid(0),
        }
        fds = [fd if fd != -1 else own for fd, own in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            socket.send_fds(self._sock, [(json.dumps(request) + "\n").encode()], fds)
            self.pid = self._messages.next(None)["started"]
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._child_created = True

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if not self._warm:
            return super()._try_wait(wait_flags)
        message = self._messages.next(0 if wait_flags & os.WNOHANG else None)
        if message is None:
            return 0, 0
        self._sock.close()
        return self.pid, message["raw"]

    def _internal_poll(self, _deadstate=None, **kwargs):
        if not self._warm:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _fork_python_children(address: str, server_env: dict[str, str]) -> None:
    """In a warm run: its Python children are forks of the server too (see WarmChild)."""
    WarmChild.address, WarmChild.server_env = address, server_env
    subprocess.Popen = WarmChild


def _run_and_exit(module: bool) -> None:
    """Run the script, then end as Python ends a process (non-daemon threads joined, atexit handlers, output
    flushed) but without tearing down every module: with torch loaded that teardown costs seconds per run, and
    in a fork it copies each page it touches."""
    import atexit
    import runpy
    import traceback

    try:
        if module:
            runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # what Python prints for an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter does first at exit
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    # What every `python train.py` imports before its first step.
    import pytorch_lightning  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    import hydralight.data.contract  # noqa: F401
    import hydralight.resume.policy  # noqa: F401
    import hydralight.train  # noqa: F401
    import hydralight.training.trainer  # noqa: F401

    server_env, server = dict(os.environ), os.getpid()
    folder = tempfile.mkdtemp(prefix="warm-")
    address = os.path.join(folder, "ranks")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen()
    try:
        job = _serve(listener)
    finally:
        if os.getpid() == server:  # not in the forks
            shutil.rmtree(folder, ignore_errors=True)
    module = _become(job)
    _fork_python_children(address, server_env)
    _run_and_exit(module)
