"""Warm starts: a rank restarted inside the allocation forks from a process that has imported torch.

A restart after a node death starts every rank of the step anew (MPI without ULFM cannot
keep the survivors), and on the cores of a node each new rank's interpreter, ``import
torch`` and the workload's modules cost 1-1.5 CPU-s: the largest part of the MoE LM's
restart (benchmarks/node_death.md). A job with spare nodes therefore runs one *warm
server* per node of its allocation (a step of its own, ``hetrun-warm``, started by the
batch script once the first ranks are up): a process that has imported torch, hetrun's
runtime and the plan's workload module (never MPI: ``mpi4py.MPI`` initialises it), and
listens on a node-local Unix socket (``HETRUN_WARM_SOCKET``, under /tmp).

``python -m hetrun.runtime <run_dir>``, which srun starts on every rank, first asks its
node's server (``run_warm``): it passes its stdin/stdout/stderr (SCM_RIGHTS), argv,
environment and working directory; the server forks a child that takes them over and
runs the rank as the process itself would (MPI_Init there reads the PMIx variables srun
gave the requester). The requester stays as srun's task: it forwards the signals it gets
to the child and ends as the child ends (the same exit code, or killed by the same
signal), so srun, the batch script's reader and the post-mortem see what they saw before.
No server, a refused connection, or no answer: the rank starts cold in its own process,
as before. Forking after ``import torch`` is what torch's DataLoader workers do on Linux:
the server has run no torch operation (no intra-op pool), and its one native helper thread
is not carried into the child. A requester that dies (srun's SIGKILL, a step killed) closes its connection and
the server SIGKILLs the child; a server that dies takes its children with it
(PR_SET_PDEATHSIG).

What this changes for Slurm: the rank's process lives in the warm step, so accounting
charges its CPU there and a site's task/cgroup constraints are the warm step's, not the
rank step's (set ``HETRUN_WARM_START=0`` in the job's env where that matters: the batch
script then starts no server). Only the job's own user may connect (socket mode 0600 and
SO_PEERCRED).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hetrun.rundir import WARM_FORKED_ENV as FORKED_ENV
from hetrun.rundir import WARM_SOCKET_ENV as SOCKET_ENV
from hetrun.rundir import WARM_SWITCH_ENV as SWITCH_ENV

# Signals srun (or the batch script) may send a rank; the requester passes each on.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGQUIT, signal.SIGALRM, signal.SIGCONT)
_HEADER = struct.Struct("!I")  # the request's JSON length, before the JSON
_CONNECT_TIMEOUT_S = 2.0  # no answer within this: start cold (no child exists yet)
_PR_SET_PDEATHSIG = 1


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(SOCKET_ENV)) and env.get(SWITCH_ENV, "1") != "0"


# --- the requester: srun's task -------------------------------------------------------------

def run_warm(args: list[str]) -> int | None:
    """Run this rank (``args``: the arguments after the program) in a child of the node's warm
    server; its exit code, or None to start cold (no server, or it did not fork: nothing of the
    rank has run)."""
    path = os.environ.get(SOCKET_ENV, "")
    if not enabled():
        return None
    # Signals are taken from before the request: the child may run (and srun signal this
    # task) before its pid arrives. Held until then; on a cold start they are raised again.
    relay = _Relay()
    old = {sig: signal.signal(sig, relay.handle) for sig in FORWARDED}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_CONNECT_TIMEOUT_S)
        sock.connect(path)
        body = json.dumps({"argv": [sys.argv[0], *args], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        fds = array.array("i", [0, 1, 2])
        sock.sendmsg([_HEADER.pack(len(body)) + body],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        reader = sock.makefile("rb")
        relay.started(int(json.loads(reader.readline())["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        sock.close()
        for sig, handler in old.items():  # None: set outside Python, i.e. the default here
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for held in relay.pending:  # what this process would have had without the attempt
            os.kill(os.getpid(), held)
        return None
    sock.settimeout(None)
    try:
        reply = reader.readline()
        status = int(json.loads(reply)["status"]) if reply else None
    except (OSError, ValueError, KeyError, TypeError):
        status = None
    if status is None:  # the server is gone, and its children with it (PR_SET_PDEATHSIG)
        sys.stderr.write("hetrun.runtime: the node's warm server ended before this rank did\n")
        return 1
    if os.WIFSIGNALED(status):
        _die_like(os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status)


class _Relay:
    """The requester's signal handler: passes each signal on to the child once its pid is
    known, holds them until then."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []

    def handle(self, sig: int, _frame: Any) -> None:
        if self.pid is None:
            self.pending.append(sig)
        else:
            _pass_on(self.pid, sig)

    def started(self, pid: int) -> None:
        self.pid = pid
        for sig in self.pending:
            _pass_on(pid, sig)


def _pass_on(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _die_like(sig: int) -> None:
    """End this process by ``sig`` as the child did (srun reports the signal), without a core."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor needs to be
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), sig)
    time.sleep(1)  # a signal whose default is to ignore (SIGCONT): leave as killed
    os._exit(128 + sig)


# --- the server: one per node of the allocation ---------------------------------------------

def preload(run_dir: Path) -> list[str]:
    """Import what a rank's start imports, MPI excepted; the modules that failed (the rank
    then imports them itself and reports their errors where it always has). A job of command
    components (runtime/warm_command.py: their Python programs fork from here): torch's
    distributed and DDP modules, and torch._dynamo, which ``DistributedDataParallel(...)`` and
    torch's optimizers import on first use (~1.3 s of a DDP script's restart); not hetrun's
    runtime, which such a program does not run."""
    failed = []
    import torch

    from .plan_view import load_plan
    try:
        plan = load_plan(run_dir, validate=False)
    except Exception as exc:  # the rank reports it, with its context, if it fails there too
        return [f"{type(exc).__name__}: {exc}"]
    if any(c.command is not None for c in plan.components):
        import torch._dynamo
        import torch.distributed
        import torch.nn.parallel  # noqa: F401
    if any(c.command is None for c in plan.components):
        from . import entry, executor  # noqa: F401
        from .workload import load_workload_class, workload_search_dirs
        try:
            if plan.workload:
                load_workload_class(plan.workload, workload_search_dirs(plan, run_dir))
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
    if "mpi4py.MPI" in sys.modules:  # MPI_Init in a server would be inherited by every fork
        raise RuntimeError("a preloaded module imported mpi4py.MPI: warm starts would share its MPI state")
    return failed


class ChildExit(SystemExit):
    """A forked rank's end: leaves the server's loop and exits the interpreter with ``code``."""


class WarmServer:
    """Accepts requests on ``path``, forks a child per request that runs ``target(argv)``,
    and reports each child's wait status to its requester."""

    def __init__(self, path: str, target: Callable[[list[str]], int]):
        self.path, self.target = path, target
        self.pid = os.getpid()  # a handler run in a fork (a signal pending at the fork) is not the server's
        self.children: dict[int, socket.socket] = {}  # child pid -> its requester's connection
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.listener = self._listen(path)

    @staticmethod
    def _listen(path: str) -> socket.socket:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a stale socket from a server that died
        else:
            raise RuntimeError(f"another warm server answers on {path}")
        finally:
            probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # 0600 from the start: no window where another user could connect
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        listener.listen(64)
        return listener

    def serve(self) -> None:
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            # A time limit or preemption signals every step: the ranks forked here may be
            # writing their checkpoint; stop taking requests, leave when they have ended.
            signal.signal(sig, lambda *_: self._stop())
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while not (self.stopping and not self.children):
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        self.wake_r.recv(4096)
                else:
                    self._requester_readable(key.fileobj, key.data)
            self._reap()
        self.close()

    def _stop(self) -> None:
        if not self.stopping and os.getpid() == self.pid:
            self.stopping = True
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        self._stop()
        for conn in list(self.children.values()):
            conn.close()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            request, fds = self._read_request(conn)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"hetrun.runtime.warm_start: request refused: {exc}\n")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._child(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the requester is gone already: so is the rank
            self._kill(pid)
        self.sel.register(conn, selectors.EVENT_READ, pid)

    @staticmethod
    def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
        conn.settimeout(_CONNECT_TIMEOUT_S)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            raise ValueError(f"uid {uid} is not this job's user ({os.getuid()})")
        fd_size = array.array("i").itemsize * 3
        data, ancdata, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(fd_size))
        fds: list[int] = []
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(raw[: len(raw) - len(raw) % got.itemsize])
                fds.extend(got)
        try:
            if len(fds) != 3 or len(data) < _HEADER.size:
                raise ValueError(f"a request needs 3 descriptors and a header, got {len(fds)} and {len(data)} bytes")
            (size,) = _HEADER.unpack_from(data)
            body = data[_HEADER.size:]
            while len(body) < size:
                more = conn.recv(size - len(body))
                if not more:
                    raise ValueError("the request ended early")
                body += more
            request = json.loads(body)
            if not (isinstance(request.get("argv"), list) and isinstance(request.get("env"), dict)
                    and isinstance(request.get("cwd"), str)):
                raise ValueError("a request needs argv, env and cwd")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        conn.settimeout(None)
        return request, fds

    def _child(self, request: dict[str, Any], fds: list[int]) -> None:
        """In the fork: become the rank srun started, run it, and end as its process would.

        Raises ``ChildExit`` (a SystemExit nothing in the server catches): the interpreter
        then exits normally, with its exit handlers (mpi4py's MPI_Finalize among them: mpirun
        takes a rank that exits without it for a failure), as ``python -m hetrun.runtime`` does."""
        code = 1
        try:
            forked = time.time()
            parent = os.getppid()
            _die_with_parent()
            if os.getppid() != parent:  # the server died between fork and prctl
                os._exit(1)
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, *FORWARDED):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.sel.close()
            for s in (self.listener, self.wake_r, self.wake_w, *self.children.values()):
                s.close()
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in request["env"].items()})
            os.environ[FORKED_ENV] = repr(forked)
            os.chdir(request["cwd"])
            sys.argv = [str(a) for a in request["argv"]]
            _match_threads()
            code = self.target(sys.argv[1:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        raise ChildExit(code)

    def _requester_readable(self, conn: Any, pid: int) -> None:
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:  # the requester died (srun's kill): the rank must not outlive it
            self._kill(pid)
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)

    def _kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _match_threads() -> None:
    """torch read OMP_NUM_THREADS when the server imported it; the rank's may differ."""
    raw = os.environ.get("OMP_NUM_THREADS", "")
    if raw.isdigit() and int(raw) > 0:
        import torch

        torch.set_num_threads(int(raw))


def _run_rank(argv: list[str]) -> int:
    """The forked child's work: a command component's Python program (runtime/warm_command.py),
    else an action rank (``python -m hetrun.runtime <run_dir>``)."""
    from .warm_command import PYTHON_FLAG, run_program

    if argv[:1] == [PYTHON_FLAG] and len(argv) >= 2:
        return run_program(argv[1:])
    from .entry import run_rank

    if len(argv) != 1:
        sys.stderr.write("usage: python -m hetrun.runtime <run_dir>\n")
        return 2
    return run_rank(argv[0], interp_ready=time.time())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m hetrun.runtime.warm_start <run_dir>  (socket: $HETRUN_WARM_SOCKET)\n")
        return 2
    path = os.environ.get(SOCKET_ENV, "")
    if not path:
        sys.stderr.write(f"hetrun.runtime.warm_start: {SOCKET_ENV} is not set\n")
        return 2
    started = time.time()
    from .gc_pause import collector_paused

    with collector_paused(then_freeze=True):  # the forks share these pages: no collection writes them
        failed = preload(Path(argv[0]))
    server = WarmServer(path, _run_rank)
    print(f"hetrun.runtime.warm_start: {os.uname().nodename} serves {path} "
          f"(preloaded in {time.time() - started:.2f} s, cpu {time.process_time():.2f} s)"
          + (f"; not preloaded: {'; '.join(failed)}" if failed else ""), flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
