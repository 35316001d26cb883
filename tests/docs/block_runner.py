"""Run code blocks each in a process of its own, without paying torch's import for each.

A server process imports torch, numpy and PIL once (2-3 s of a tiny example's 4-8 s here), then
forks one child per block. The child is the example's whole world, as ``python -c CODE``
would be: its own environment, folder and ``__main__`` module, stdin from /dev/null, stdout
and stderr to files, and its normal interpreter exit (atexit handlers, finalizers) gives the
exit status. Nothing a block does reaches the server or a later block: the server runs no
block code, and never imports unstall (whose settings a block may set before importing it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The server: preload, then for each request line fork a child that runs the block.
SERVER = r"""
import gc, json, os, sys, traceback, types
import numpy, PIL.Image, torch, torch.utils.data  # the costly imports, done once
gc.freeze()  # their objects: never the blocks' garbage, not walked by the children's collections

def child(req):
    os.setpgid(0, 0)  # the block and its workers: one group, killed together on a timeout
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, to in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")  # a fresh __main__, as `python -c` has
    sys.modules["__main__"] = main
    try:
        exec(compile(req["code"], req["name"], "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    sys.exit(0)

for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(req)  # never returns: SystemExit ends this process through the normal exit
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


class BlockRunner:
    """One server process; `run` a block at a time (the tests of one module share it)."""

    def __init__(self, env: dict[str, str], logs: Path):
        self.logs = logs
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=logs, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
        )  # fmt: skip
        self.count = 0
        self.buffer = b""

    def run(self, name: str, code: str, *, cwd: Path, env: dict[str, str], timeout: float) -> Done:
        """Run ``code`` in a fresh child with ``env`` in ``cwd``; its exit status and output
        (a traceback names the block ``name``).
        Past ``timeout`` (seconds, the server's start included) the child's whole process
        group is killed and the run fails."""
        self.count += 1
        out, err = (self.logs / f"block-{self.count}.{kind}" for kind in ("out", "err"))
        req = {"name": name, "code": code, "env": env, "cwd": str(cwd)}
        req |= {"out": str(out), "err": str(err)}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        pid = self._reply(timeout, "pid")
        try:
            status = self._reply(timeout, "status")
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            self._reply(30, "status")
            raise
        return Done(status, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def _reply(self, timeout: float, key: str) -> int:
        """The server's next reply line, which carries ``key``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError(f"no {key} from the block runner within {timeout} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the block runner exited ({self.proc.wait()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)[key]

    def close(self) -> None:
        """End the server: killed, as it ran no block code and has no child left (each run
        waited for its own); a normal exit would spend a second or two tearing torch down."""
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
