"""The Python sandbox tool: model-written code runs in a separate, confined process.

A `PythonSandbox` keeps warm worker processes (`sandbox_worker.py`, standard library
only). A worker isolates itself once, at start. Each call runs in a child the worker
forked and confined ahead of time, so a call costs milliseconds, not an interpreter
start. The child has fresh globals, an empty working folder, rlimits and no
privileges; when it exits or the wall clock runs out, every process it started is
killed. Nothing a call does (files, modules, globals, processes) reaches the next call.

What a call gets on each platform; `PythonSandbox.isolation` says which column applies
(method "root", "user-namespace" or "none"):

              root                      user-namespace            none
              (Linux, run as root)      (Linux, not root, user    (macOS and other POSIX;
                                        namespaces allowed)       Linux refusing the
                                                                  namespaces: `note` says why)
  network     none: a network namespace with no interface up;     the host's network, and
              connect() fails, even to 127.0.0.1; no DNS; no      every Unix socket the
              abstract Unix socket of the host's                  call's uid may reach
  files       a private root (pivot_root): the host's /usr, /bin, the host's files
              /sbin, /lib*, /etc and the interpreter's folders,
              read-only and nosuid; /dev holds null, zero, full,
              random and urandom; /proc and /sys of its own
              namespaces; /run and /var/tmp empty and read-only.
              Nothing else of the host exists for the call: no
              home folder, no /var, no host Unix socket
  writing     only /tmp (the working folder) and /dev/shm: one    wherever the call's uid
              fresh tmpfs of folder_mb per call, noexec, dropped  may write; the working
              after it                                            folder is a new folder
                                                                  in the host's temp dir
  reading     what nobody may read of   what the caller may read  what the call's uid
              the folders above         of the folders above,     may read; without root,
                                        also through the caller's also the environment and
                                        supplementary groups,     memory of the caller's
                                        which it cannot drop      other processes
                                        (`note` names them)
  processes   a PID namespace of its own per call, nested in      own session; at the end every
              the worker's, and a read-only /proc of it: host     process of the call's cgroup
              processes and the worker are invisible and cannot   is killed (as root: even one
              be named (no signal, prlimit or pidfd of the call   that called setsid); without
              reaches the worker); at the end every process of    the cgroup, its process group
              the call is killed (kill(-1) from the worker, its   (a process that calls setsid
              cgroup.kill, and the end of the call's namespace),  escapes)
              even ones that left its session
  IPC         an IPC namespace of its own per call: System V      the host's; System V IPC
              objects and POSIX queues die with the call (the     and mq_open are denied by
              filter denies System V IPC anyway)                  the filter (on Linux)
  user        uid/gid nobody (65534),   uid 0 of the namespace    nobody when root (as in
              no supplementary groups,  (the caller outside),     the first column), else
              no capabilities,          no capabilities,          the caller's uid, as is
              no_new_privs              no_new_privs
  processes   RLIMIT_NPROC for uid      RLIMIT_NPROC counts this  root: as the first column;
  limit       nobody: one budget with   worker's namespace only   otherwise not set: only
              every other process of                              the wall clock bounds a
              nobody (concurrent calls)                           fork bomb

  CPU limit   per call: one cgroup v2 holds every process and     as root: as the first column;
              thread of the call from birth, the call is stopped  otherwise per process only
              when their CPU time together passes cpu_seconds     (RLIMIT_CPU), and only with
              (`Isolation.cpu`); the user-namespace column needs  cpu_per_process=True
              a cgroup delegated to the caller

On every platform: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE and no core dumps (macOS does
not enforce RLIMIT_AS), with one malloc arena (glibc's further arenas reserve 64 MB of
address space each, so threads would fail under memory_mb by timing alone); an environment
of PATH, LANG, HOME, TMPDIR, PWD and MALLOC_ARENA_MAX only (the
host's variables never reach a worker); the interpreter in isolated mode (-I); the
wall-clock deadline; output cut to `max_output_chars`, with a note saying how much.

On Linux (x86_64 and aarch64), in every column, a seccomp filter installed just before
the code runs (`isolation.syscalls`), an allow list: the system calls of files, memory,
threads, processes, signals, timers, polling, sockets and the process's own limits
(`sandbox_worker.ALLOWED_SYSCALLS`, about 230). Every other call fails with ENOSYS, as on
a kernel without it, so the C library falls back to an older call where there is one
(clone3 to clone) and one that a later kernel adds is never reachable: among those left
out are new namespaces, mounts, ptrace and the other ways into a process, the keyrings,
System V IPC, memfd_create and memfd_secret (memory no rlimit counts), bpf, perf,
io_uring, userfaultfd, kernel modules, kexec, reboot, swap and the clock. Arguments are
checked where a listed call could do more than a program needs: clone with a CLONE_NEW*
flag, personality flags other than the usual, and sockets other than Unix, IP and
netlink (AF_VSOCK reaches a VM's host whatever the network namespace) fail with EPERM,
an ordinary PermissionError, as do system calls of another ABI (i386 through int 0x80,
x32). POSIX message queues are listed only where the call has an IPC namespace of its own.

How a call ended rests on what the worker saw itself: the exit status, the signal,
the CPU time, the wall clock. The exception type comes from the call's own process,
on a pipe the code can reach: it is believed only as the sandbox writes it (one
well-formed report, then exit status 1), and anything else on that pipe makes the
call "tampered", a tool_error. A program can still claim any exception it could raise
(MemoryError included); it cannot make its failure look like a success, a timeout or
the sandbox's fault, and a malformed report never makes `run` raise.

Not covered, on any platform: the listed system calls are reachable with any argument
but those above (ioctl, prctl and the file calls are large surfaces of their own);
files readable by the call's uid in the folders it sees stay readable (read-only is
not invisible), and those folders are bound whole
(a socket inside /usr or /etc would be reachable; none belongs there); memory is
limited per process, not per call (n processes may use n x memory_mb, plus folder_mb
of tmpfs), and memory the kernel holds for a call (pipe and socket buffers) is not
counted: there is no memory cgroup. In a user namespace the caller's supplementary
groups stay in effect: an unprivileged process cannot drop them, so start the host
without them where that matters. bubblewrap is not used, nothing beyond the kernel is
needed; an architecture without a system-call table here (not x86_64 or aarch64)
gets the "none" column. In the "none" column as root, a call runs as nobody and can
import only what nobody can read (a Python under /root is not covered without a mount
namespace); otherwise it runs as the worker's uid and can kill its worker, which is
reported as an infra error. Windows is not supported.

CPU time and the wall clock are reported differently on purpose. A busy loop hits
the CPU limit first (`cpu_seconds` < `wall_seconds`): that is the code's fault, a
"tool_error". A wall-clock timeout means the code waited (sleep, a blocked read) or
the machine was too loaded to run it: status "timeout", still the code's tool_error.

The CPU limit is the call's, not a process's (`Isolation.cpu`). The host makes a cgroup
folder per worker in its own cgroup v2 (`make_worker_cgroup`); the worker forks each
call's first process into the calls' cgroup there (`sandbox_worker.CallCgroup`), so the
kernel counts every process and thread the call starts, however it detached, and keeps
counting those that exited, however they were reaped. The worker reads that total when
the call could first have passed its limit (`sandbox_worker.next_cpu_check`), kills
every process of the cgroup once it has, and reports the total as `cpu_seconds`; a call
that used its limit is status "cpu" however it ended. A reading that fails ends the call
as an infra error. RLIMIT_CPU stays on each process as a second bound, a second past the
call's limit (it fires a few ms early by the cgroup's clock, so the call's limit decides). Where no cgroup
can be made (macOS, a user without a delegated cgroup) or a call could leave it (the
"none" column without root), `PythonSandbox` refuses to start unless `cpu_per_process`
accepts the per-process limit. Not covered: CPU time the kernel spends for a call
outside its processes (kernel threads, interrupts); a call may overrun its limit by up
to MIN_CPU_CHECK_SECONDS (10 ms) per CPU of the machine before it is stopped.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from toolpolicy.tools.decorator import Tool, tool
from toolpolicy.tools.sandbox_worker import CALL_CGROUP, WORKER_CGROUP, remove_folder, valid_exception
from toolpolicy.types import ErrorKind, ToolResult

WORKER_FILE = Path(__file__).with_name("sandbox_worker.py")
WORKER_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
START_SECONDS = 30.0  # a worker must report its isolation within this
REPLY_GRACE_SECONDS = 5.0  # beyond the wall clock, for the worker to kill, reap and reply
SHUTDOWN_SECONDS = 1.0  # close() waits this long for workers to exit on their own
MAX_REPLY_BYTES = 16 * 1024 * 1024
WORK_FOLDER = "/tmp"

Status = Literal["ok", "exception", "exit", "timeout", "cpu", "memory", "file_size", "killed", "tampered", "infra"]
# A wall-clock timeout is the code's doing (it slept, blocked or spun), so the model sees
# it as its own tool error and RL can penalise it; only a broken worker is "infra".
_ERROR_KINDS: dict[str, ErrorKind | None] = {"ok": None, "infra": "infra"}
_NO_NETWORK_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL}
# The fields of a worker's report of a call, and their types.
REPORT_FIELDS: dict[str, tuple[type, ...]] = {
    "output": (str,), "omitted": (int,), "timed_out": (bool,), "exit_code": (int, type(None)),
    "signal": (int, type(None)), "exception": (dict, type(None)), "tampered": (bool,),
    "cpu_seconds": (int, float), "wall_seconds": (int, float),
}  # fmt: skip


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use, and how many calls may run at once."""

    cpu_seconds: int = 5
    """CPU time of the call: every process and thread it starts, together (`Isolation.cpu`); past it
    every process of the call is killed. Each process is also held to it plus 1 s alone (RLIMIT_CPU),
    or to it exactly where the limit is per process only."""
    wall_seconds: float = 10.0
    """Wall-clock deadline of a call; at it every process of the call is killed."""
    memory_mb: int = 256
    """Address space of each process of the call (RLIMIT_AS); past it allocations raise MemoryError."""
    file_size_mb: int = 16
    """Largest file the call may write (RLIMIT_FSIZE); a longer write fails with EFBIG."""
    folder_mb: int = 64
    """Size of the call's working folder (a tmpfs where the filesystem is isolated)."""
    max_processes: int = 32
    """Processes the call may run at once (RLIMIT_NPROC, where the call has a uid of its own)."""
    max_output_chars: int = 3000
    """stdout and stderr kept per call; the rest is counted and reported as cut. Keep it
    under ToolSet.max_output_chars so the line saying why a call failed is not cut."""
    workers: int = 2
    """Warm worker processes, i.e. calls that can run at the same time."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value}")


@dataclass(frozen=True)
class Isolation:
    """The confinement the workers got on this machine (the rows of the module docstring's table)."""

    method: Literal["root", "user-namespace", "none"]
    network: bool
    """No network at all: a network namespace with no interface up."""
    filesystem: bool
    """A private root: only the host's system and interpreter folders, read-only; a fresh tmpfs per call
    at /tmp and /dev/shm; no host socket, home folder or other file is reachable."""
    processes: bool
    """A PID namespace with its own /proc, and an IPC namespace per call: host processes are invisible,
    every process of a call dies with it, and so does every System V object or message queue it made."""
    user: bool
    """The code runs without privileges: as nobody, or with no capabilities in a user namespace."""
    syscalls: bool = False
    """A seccomp filter denies what a program has no use for: new namespaces, mounts, ptrace, keyrings,
    System V IPC, bpf, perf, kernel modules... (EPERM, an ordinary error)."""
    cpu: bool = False
    """The CPU limit holds per call: every process and thread a call starts is born in one cgroup that
    none of them can leave, the call is stopped when their CPU time together passes `cpu_seconds`, and
    `SandboxRun.cpu_seconds` is that total. Without it (`note` says why) the limit is RLIMIT_CPU per
    process only, which a call with several processes defeats; the sandbox then starts only when asked
    to with `cpu_per_process=True`."""
    note: str = ""
    """What the isolation lacks here, in words: why namespaces or the filter were unavailable,
    or the supplementary groups a user namespace keeps."""


@dataclass(frozen=True)
class SandboxRun:
    """What one call did: how it ended, what it printed, and the line the model reads about it."""

    status: Status
    output: str
    """stdout and stderr as they were interleaved, cut to max_output_chars."""
    omitted: int
    """Characters of output cut after `output`."""
    reason: str
    """One line saying why the call failed, or a hint for the failure; "" when there is nothing to add."""
    exit_code: int | None = None
    signal: int | None = None
    cpu_seconds: float = 0.0
    """CPU time every process and thread of the call used together (`Isolation.cpu`); without a
    cgroup, that of the call's process and of the children it waited for."""
    wall_seconds: float = 0.0

    @property
    def error(self) -> ErrorKind | None:
        """Whose fault a failure was: the code's (tool_error), the wall clock's, or the sandbox's."""
        return _ERROR_KINDS.get(self.status, "tool_error")

    def observation(self) -> str:
        """The text the model sees: output, a note if it was cut, then the reason."""
        lines = [self.output.rstrip("\n")] if self.output else []
        if self.omitted:
            lines.append(f"... [output truncated: {self.omitted} more characters]")
        if self.reason:
            lines.append(self.reason)
        return "\n".join(lines) or "(no output)"

    def to_tool_result(self) -> ToolResult:
        return ToolResult(self.observation(), self.error)


class WorkerError(Exception):
    """A worker died, hung or answered nonsense: the sandbox's failure, not the code's."""


class PythonSandbox:
    """Warm, isolated Python workers shared by any number of threads; `.tool` is the model's `python` tool.

    >>> with PythonSandbox() as sandbox:                     # doctest: +SKIP
    ...     sandbox.run("print(6 * 7)").output
    '42\\n'
    """

    def __init__(self, limits: SandboxLimits | None = None, isolate: bool = True, name: str = "python",
                 cpu_per_process: bool = False) -> None:  # fmt: skip
        """Start `limits.workers` workers and wait until each has isolated itself.

        `isolate=False` skips the namespaces (the "none" row), e.g. to compare.
        Raises RuntimeError if a worker cannot start, or if a call's CPU time cannot be
        counted across its processes here (`Isolation.cpu`: no cgroup v2 to make one in,
        as on macOS or for a user without a delegated cgroup) unless `cpu_per_process`
        accepts a CPU limit per process instead.
        """
        self.limits = limits or SandboxLimits()
        self._config = {"isolate": isolate, **asdict(self.limits)}
        self._lock = threading.Lock()
        self._workers: set[Worker] = set()
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._closed = False
        started = [self._spawn() for _ in range(self.limits.workers)]
        try:
            isolations = {worker.wait_ready(START_SECONDS) for worker in started}
        except WorkerError as error:
            self.close()
            raise RuntimeError(f"the Python sandbox could not start: {error}") from error
        self.isolation = min(isolations, key=lambda each: (each.network, each.filesystem, each.processes, each.syscalls, each.cpu))
        if not self.isolation.cpu and not cpu_per_process:
            self.close()
            raise RuntimeError(
                f"the Python sandbox could not start: a call's CPU time cannot be counted across its processes here "
                f"({self.isolation.note}); PythonSandbox(cpu_per_process=True) accepts a CPU limit per process"
            )
        for worker in started:
            self._idle.put(worker)
        self.tool: Tool = self._make_tool(name)

    def run(self, code: str) -> SandboxRun:
        """Run one program in a fresh child of a warm worker. Never raises for anything the code does."""
        if self._closed:
            return infra_run("the sandbox is closed")
        worker = self._idle.get()
        try:
            worker = self._healthy(worker)
            report = worker.request({"code": code}, self.limits.wall_seconds + REPLY_GRACE_SECONDS)
        except WorkerError as error:
            worker.kill()  # replaced when next taken from the queue
            return infra_run(str(error))
        finally:
            self._idle.put(worker)
        if "infra" in report:
            return infra_run(report["infra"])
        return read_report(report, self.limits, self.isolation)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (each the parent of its namespace's process 1)."""
        with self._lock:
            return sorted(worker.pid for worker in self._workers if worker.alive)

    def description(self) -> str:
        """The tool description: what the model may rely on, in one paragraph."""
        limits, version = self.limits, f"{sys.version_info.major}.{sys.version_info.minor}"
        network = " There is no network." if self.isolation.network else ""
        return (
            f"Run a Python {version} program in a fresh sandboxed process and return what it prints "
            f"(stdout and stderr). Nothing persists between calls; the working folder starts empty.{network} "
            f"Limits: {limits.cpu_seconds} s CPU, {limits.wall_seconds:g} s wall clock, {limits.memory_mb} MB memory."
        )

    def close(self) -> None:
        """Kill every worker; later calls return an infra error. Safe to call twice."""
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers), set()
        for worker in workers:  # all at once: a worker removes its folder before it exits
            worker.close_input()
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        for worker in workers:
            worker.discard(grace=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self) -> Worker:
        worker = Worker(self._config)
        with self._lock:
            self._workers.add(worker)
            closed = self._closed
        if closed:
            worker.discard()
        return worker

    def _healthy(self, worker: Worker) -> Worker:
        """`worker` if it is alive, else a fresh one in its place (WorkerError if that fails too)."""
        if worker.alive:
            return worker
        worker.discard()
        with self._lock:
            self._workers.discard(worker)
        replacement = self._spawn()
        try:
            replacement.wait_ready(START_SECONDS)
        except WorkerError:
            replacement.discard()
            with self._lock:
                self._workers.discard(replacement)
            raise
        return replacement

    def _make_tool(self, name: str) -> Tool:
        sandbox = self

        def python(code: str) -> ToolResult:
            """Run a Python program.

            Args:
                code: A complete Python 3 program; print what you want to see.
            """
            return sandbox.run(code).to_tool_result()

        return tool(name=name, description=self.description())(python)


class Worker:
    """One warm worker process and the JSON-lines pipes to it."""

    def __init__(self, config: dict[str, Any]) -> None:
        # Working folders go here when the worker cannot mount a tmpfs; removed with the
        # worker, also when it was killed before it could clean up. So is its cgroup folder.
        self.scratch = tempfile.mkdtemp(prefix="toolpolicy-sandbox-")
        os.chmod(self.scratch, 0o711)  # a call running as nobody must reach its folder inside
        self.cgroup, refusal = make_worker_cgroup()
        config = {**config, "scratch": self.scratch, "cgroup": self.cgroup, "cgroup_refusal": refusal}
        command = [sys.executable, "-I", str(WORKER_FILE), json.dumps(config)]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=WORKER_ENVIRONMENT,
            cwd="/",
            start_new_session=True,  # its own process group, killed as one
        )
        self.pid = self.process.pid
        self._pending = b""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> Isolation:
        """The isolation the worker reports once it has set itself up."""
        message = self._read(timeout)
        fields = message.get("isolation")
        try:
            return Isolation(**fields)
        except TypeError:  # not a dict, or not the fields of one
            raise WorkerError(f"the worker started with an unexpected message: {str(message)[:200]}") from None

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
        except (OSError, ValueError) as error:  # ValueError: the pipe was closed by discard()
            raise WorkerError(f"the worker is gone ({error})") from None
        return self._read(timeout)

    def _read(self, timeout: float) -> dict[str, Any]:
        """The next JSON line from the worker; WorkerError on end of file, timeout or garbage."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(f"the worker did not answer within {timeout:g} s")
            try:
                fd = self.process.stdout.fileno()
                ready, _, _ = select.select([fd], [], [], remaining)
                chunk = os.read(fd, 65536) if ready else None
            except (OSError, ValueError) as error:  # the pipe was closed under us
                raise WorkerError(f"the pipe from the worker failed ({error})") from None
            if chunk is None:
                continue
            if not chunk:
                raise WorkerError("the worker exited")
            self._pending += chunk
            if len(self._pending) > MAX_REPLY_BYTES:
                raise WorkerError("the worker's reply is too large")
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            raise WorkerError(f"the worker answered something that is not a JSON object: {line[:200]!r}")
        return message

    def kill(self) -> None:
        """Kill the worker's process group; its namespace, and every call in it, dies with it.

        The pipes stay open for the thread that may be reading them (it sees end of
        file); `discard` closes them once the worker is out of use.
        """
        if self.process.poll() is None:  # once reaped, the group id may belong to someone else
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()

    def close_input(self) -> None:
        """End of file for the worker: it finishes its call, cleans up and exits."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:  # a write buffered for a dead worker
            pass

    def discard(self, grace: float = 0.0) -> None:
        """Let the worker exit on its own for `grace` seconds, then kill it; close its pipes.

        A thread still reading the pipes gets WorkerError.
        """
        self.close_input()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        remove_folder(self.scratch)
        if self.cgroup is not None:
            remove_cgroup(self.cgroup)


def make_worker_cgroup() -> tuple[str | None, str]:
    """A cgroup folder for one worker, in this process's own cgroup v2: (path, "") or (None, why not).

    It holds two cgroups, the worker's and its calls' (`sandbox_worker.CallCgroup`),
    and no controller is enabled in it, so nothing of the host's limits changes. Making
    one needs the right to create a cgroup here: root, or a cgroup delegated to this
    user (systemd's Delegate=yes).
    """
    try:
        parent = own_cgroup_folder(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError as error:  # no /proc: not Linux
        return None, f"no cgroup v2 to count a call's CPU time in ({error.strerror})"
    if parent is None:
        return None, "no cgroup v2 hierarchy is mounted to count a call's CPU time in"
    try:
        folder = tempfile.mkdtemp(prefix="toolpolicy-sandbox-", dir=parent)
    except OSError as error:
        return None, f"no cgroup can be made for the calls in {parent} ({error.strerror})"
    try:
        for name in (WORKER_CGROUP, CALL_CGROUP):
            os.mkdir(f"{folder}/{name}")
    except OSError as error:
        remove_cgroup(folder)
        return None, f"no cgroup can be made for the calls in {folder} ({error.strerror})"
    return folder, ""


def own_cgroup_folder(mountinfo: str, proc_cgroup: str) -> str | None:
    """Where this process's cgroup v2 is on the file system, from /proc/self/mountinfo and /proc/self/cgroup.

    /proc/self/cgroup names the cgroup from the hierarchy's root (the "0::" line); the
    mount of that hierarchy may show a subtree of it (its root field), so the path is
    taken relative to that. None when no cgroup2 file system is mounted or this
    process's cgroup lies outside the mounted subtree.

    >>> info = "30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\\n"
    >>> own_cgroup_folder(info, "1:cpu:/\\n0::/user.slice/app\\n")
    '/sys/fs/cgroup/unified/user.slice/app'
    >>> own_cgroup_folder("31 1 0:27 /user.slice /mnt/my\\\\040cg rw - cgroup2 none rw\\n", "0::/user.slice/app\\n")
    '/mnt/my cg/app'
    >>> own_cgroup_folder("", "0::/\\n") is None  # no cgroup2 mounted
    True
    """
    path = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if path is None:
        return None
    for line in mountinfo.splitlines():
        fields, _, filesystem = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or filesystem.split()[:1] != ["cgroup2"]:
            continue
        root, mount_point = (_mountinfo_unescape(each) for each in parts[3:5])
        relative = os.path.relpath(path, root)
        if relative == os.pardir or relative.startswith(os.pardir + os.sep):
            continue
        return os.path.normpath(os.path.join(mount_point, relative))
    return None


def _mountinfo_unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as three octal digits."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), field)


def remove_cgroup(folder: str) -> None:
    """Kill every process left in a worker's cgroup folder and remove it, its two cgroups first.

    A process that outlived its worker (one that left its session in the "none" column)
    dies here. The kernel removes a process from its cgroup as it exits, so the folders
    can go once none is alive; what is still busy after SHUTDOWN_SECONDS is left behind.
    """
    try:
        Path(folder, "cgroup.kill").write_text("1")
    except OSError:  # gone already, or a kernel before 5.14
        pass
    deadline = time.monotonic() + SHUTDOWN_SECONDS
    while time.monotonic() < deadline:
        try:
            if "populated 0" in Path(folder, "cgroup.events").read_text():
                break
        except OSError:
            break
        time.sleep(0.005)
    for path in (f"{folder}/{CALL_CGROUP}", f"{folder}/{WORKER_CGROUP}", folder):
        try:
            os.rmdir(path)
        except OSError:  # not there, or still busy
            pass


def read_report(report: dict[str, Any], limits: SandboxLimits, isolation: Isolation) -> SandboxRun:
    """A worker's report of one call, classified and explained; an infra failure if it is malformed."""
    problem = report_problem(report)
    if problem:
        return infra_run(f"the worker's report {problem}")
    status, reason = classify(report, limits, isolation)
    return SandboxRun(
        status=status,
        output=report["output"],
        omitted=report["omitted"],
        reason=reason,
        exit_code=report["exit_code"],
        signal=report["signal"],
        cpu_seconds=report["cpu_seconds"],
        wall_seconds=report["wall_seconds"],
    )


def report_problem(report: dict[str, Any]) -> str:
    """What is wrong with a worker's report of a call, or "" if every field is there with its type."""
    for name, types in REPORT_FIELDS.items():
        if name not in report or not isinstance(report[name], types):
            return f"has no valid {name!r}"
    if report["exception"] is not None and not valid_exception(report["exception"]):
        return "has a malformed 'exception'"
    return ""


def classify(report: dict[str, Any], limits: SandboxLimits, isolation: Isolation) -> tuple[Status, str]:
    """How a call ended and the one line the model should read about it.

    Whose fault it was rests on what the worker saw itself: the wall clock, the exit
    status, the signal, the CPU time. The exception is the program's own word, and a
    program that wrote to the sandbox's status pipe is told so, whatever it wrote.

    >>> plain = {"timed_out": False, "signal": None, "exit_code": 0, "exception": None, "tampered": False,
    ...          "cpu_seconds": 0.01, "omitted": 0}
    >>> classify({**plain, "signal": 24, "exit_code": None}, SandboxLimits(cpu_seconds=2), Isolation("none", *[False] * 4))
    ('cpu', 'CPU time limit of 2 s exceeded; the process was killed.')
    """
    exception, signal_number = report["exception"], report["signal"]
    if report["timed_out"]:
        killed = "every process it started was killed" if isolation.processes else "its process group was killed"
        return "timeout", f"Timed out after {limits.wall_seconds:g} s wall clock; {killed}."
    if signal_number == signal.SIGXCPU or report["cpu_seconds"] >= limits.cpu_seconds:
        if isolation.cpu:
            return "cpu", f"CPU time limit of {limits.cpu_seconds} s exceeded by the call's processes together; all of them were killed."
        return "cpu", f"CPU time limit of {limits.cpu_seconds} s exceeded; the process was killed."
    if report["tampered"]:
        return "tampered", "The program wrote to the sandbox's status pipe itself, so how it ended is not reported."
    if signal_number == signal.SIGXFSZ or (exception and exception["errno"] == errno.EFBIG):
        return "file_size", f"File size limit of {limits.file_size_mb} MB exceeded."
    if exception and exception["type"] == "MemoryError":
        return "memory", f"Memory limit of {limits.memory_mb} MB exceeded (MemoryError)."
    if exception:
        return "exception", exception_hint(exception, report["omitted"] > 0, limits, isolation)
    if signal_number is not None:
        return "killed", f"The process was killed by signal {signal_name(signal_number)}."
    if report["exit_code"]:
        return "exit", f"The program exited with status {report['exit_code']}."
    return "ok", ""


def exception_hint(exception: dict[str, Any], output_cut: bool, limits: SandboxLimits, isolation: Isolation) -> str:
    """What to add to a traceback: the error itself if the output cut it off, and why the sandbox refused."""
    lines = [exception["summary"]] if output_cut else []
    number = exception["errno"]
    if isolation.network and (number in _NO_NETWORK_ERRNOS or exception["type"] == "gaierror"):
        lines.append("The sandbox has no network access.")
    elif isolation.filesystem and number == errno.EROFS:
        lines.append(f"Only the working folder ({WORK_FOLDER}) is writable; the rest of the file system is read-only.")
    elif number == errno.ENOSPC:
        lines.append(f"The working folder is full ({limits.folder_mb} MB).")
    return "\n".join(lines)


def signal_name(number: int) -> str:
    """SIGSEGV for 11; the number itself for a signal without a name (the real-time ones)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def infra_run(detail: str) -> SandboxRun:
    return SandboxRun("infra", "", 0, f"The sandbox failed ({detail}); this is not the program's fault.")
