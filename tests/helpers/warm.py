"""A warm interpreter for the suite's `python train.py` runs: torch, Lightning and Hydra imported once, each
run a fork of it.

Every CLI test would otherwise import torch, torchvision, Lightning and Hydra again: several seconds of
CPU per run on 2 cores, most of the suite's time. A fork of a process that has them starts at once and is
still a process of its own: its pid and process group, environment, working directory, argv, stdin from
/dev/null, stdout and stderr, exit status and interpreter shutdown (atexit, non-daemon threads) are the
run's. What the run starts itself (DDP ranks, torchrun, SLURM jobs, wandb's service) starts fresh.

A run whose environment changes what is read when those libraries load (threads, library paths, Python's
flags) gets a fresh interpreter, as does every run when HYDRALIGHT_TESTS_FRESH=1.

Run as a script, this module is the server: it reads one JSON request per line on stdin, forks, answers the
child's pid, then its exit status (as `subprocess` reports it: negative for a signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

# Read when torch, OpenMP or Python start, not later: a run that sets one differently needs its own interpreter.
LOAD_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PL_", "CUDA_", "NVIDIA_")
LOAD_TIME_EXCEPT = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONWARNINGS")


def load_time_differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Variables read while the libraries load that two environments set differently."""
    names = {n for n in (*a, *b) if n.startswith(LOAD_TIME_PREFIXES) and n not in LOAD_TIME_EXCEPT}
    return sorted(n for n in names if a.get(n) != b.get(n))


class WarmInterpreter:
    """One server per test process, started at the first run and stopped with the process."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.count = 0
        self._pending = b""

    def _start(self, env: dict[str, str]) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            self.proc = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, bufsize=0
            )
            self._pending = b""
            ready = self._answer(timeout=600)  # the imports are done
            if ready != "ready":
                raise RuntimeError(f"the warm interpreter did not start: {ready!r}")
        return self.proc

    def _answer(self, timeout: float | None = None) -> str | None:
        """The server's next line, or None after `timeout` seconds without one (unbuffered: select sees all)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the warm interpreter stopped")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def usable(self, env: dict[str, str]) -> bool:
        if os.environ.get("HYDRALIGHT_TESTS_FRESH", "") not in ("", "0"):
            return False
        return self.proc is None or not load_time_differences(self.env, env)

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """`subprocess.run(command, capture_output=True, text=True, timeout=...)` for `[python, script, *args]`."""
        proc = self._start(env)
        self.count += 1
        out, err = self.scratch / f"run{self.count}.out", self.scratch / f"run{self.count}.err"
        request = {"argv": command[1:], "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        pid = json.loads(self._answer())["pid"]
        answer = self._answer(timeout)
        timed_out = answer is None
        if timed_out:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                with contextlib.suppress(ProcessLookupError):
                    kill()
        status = json.loads(answer if answer is not None else self._answer())["status"]
        stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
        for p in (out, err):
            p.unlink(missing_ok=True)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, status, stdout, stderr)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _serve() -> dict:
    """The server's loop; returns (in the child only) the request the child is to run."""
    base_path = sys.path[1:]  # without this file's folder
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            request["base_path"] = base_path
            return request
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
    sys.exit(0)


def _become(request: dict) -> None:
    """Turn this fork into `cd CWD && env ENV python SCRIPT ARGS < /dev/null > OUT 2> ERR`."""
    os.setsid()  # its own process group: a timeout kills what it started too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):  # fmt: skip
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    script = os.path.abspath(request["argv"][0])
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *extra, *request["base_path"]]
    sys.argv[:] = request["argv"]
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_and_exit() -> None:
    """Run the script, then end as Python ends a process (non-daemon threads joined, atexit handlers, output
    flushed) but without tearing down every module: with torch loaded that teardown costs seconds per run, and
    in a fork it copies each page it touches."""
    import atexit
    import runpy
    import threading
    import traceback

    try:
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

    job = _serve()
    _become(job)
    _run_and_exit()
