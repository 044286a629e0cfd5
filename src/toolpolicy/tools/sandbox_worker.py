"""The process inside the Python sandbox: it isolates itself once, then runs calls one at a time.

`toolpolicy.tools.sandbox` starts it by path, `python -I sandbox_worker.py CONFIG_JSON`,
so it imports the standard library only: every call is a fork of this process, and
what the call's code finds already imported is this file's small set of modules.

Once, at start, on Linux when namespaces are allowed (`isolate`):
  1. unshare a mount, network and PID namespace (in a new user namespace when not
     root, mapping the caller's uid to 0 inside it);
  2. fork: the child is process 1 of the new PID namespace and serves the calls; the
     parent only waits. The host kills the parent; PR_SET_PDEATHSIG then kills the
     server, and the death of a namespace's process 1 kills every process in it;
  3. cover private folders, make every mount private and read-only, mount a /proc
     and a /sys of these namespaces, and a tmpfs over /tmp: the working folder.

Per call: the call's child was forked while the worker was idle (`fork_child`), has
its own session, has dropped privileges and set rlimits, and waits for its code on a
pipe. `run_call` sends the code, keeps the first `max_output_chars` of stdout and
stderr (one pipe) and counts the rest; when the child exits or the wall clock runs
out it kills every other process of the call (kill(-1) from process 1, or the child's
process group without namespaces), reaps them and reports. After the reply the
worker replaces the working folder and forks the next child, off the latency path.

Protocol, one JSON object per line: the worker writes {"isolation": {...}} once, then
for each {"code": "..."} it reads, one report (`run_call`) or {"infra": "..."}.
"""

from __future__ import annotations

import builtins
import codecs
import ctypes
import fcntl
import gc
import json
import linecache
import os
import pwd
import resource
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

# Imported once here, so a call's `import math` costs a dictionary lookup.
PRELOADED = (
    "bisect", "collections", "datetime", "decimal", "fractions", "functools",
    "heapq", "itertools", "math", "random", "re", "statistics", "string",
)  # fmt: skip
CODE_FILENAME = "<code>"
NOBODY = 65534
WORK_FOLDER = "/tmp"
READ_BYTES = 65536
DRAIN_SECONDS = 1.0  # after the kill, how long the output pipe may take to close
STATUS_FD = 3  # where a call's child writes the exception that ended it
CODE_FD = 4  # where it reads its code, until end of file
MAX_SUMMARY_CHARS = 500

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
SYS_MOUNT_SETATTR = 442  # the same number on every Linux architecture but alpha
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
CAPABILITY_VERSION_3 = 0x20080522
LAST_CAPABILITY = 63  # PR_CAPBSET_DROP of a capability the kernel does not know fails harmlessly


class MountAttr(ctypes.Structure):
    """struct mount_attr of mount_setattr(2)."""

    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]  # fmt: skip


class CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapabilityData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    """Raise OSError for a failed libc call (result -1), naming what was attempted."""
    if result == -1:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


# ---------------------------------------------------------------- isolation, once


def isolate(config: dict[str, Any]) -> dict[str, Any]:
    """Isolate this process as far as the platform allows; the isolation actually obtained.

    In namespace mode the calling process never returns: it becomes the waiting
    parent, and the child (process 1 of the new PID namespace) returns instead.
    """
    root = os.geteuid() == 0
    if not config["isolate"] or not sys.platform.startswith("linux"):
        return _without_namespaces(root, "")
    home, uid, gid = _home_folder(), os.getuid(), os.getgid()  # before a user namespace maps them to 0
    refusal = _namespaces_refused(root, uid, gid)
    if refusal:
        return _without_namespaces(root, refusal)
    _check(_libc.unshare(_namespace_flags(root)), "unshare")
    _set_up_namespaces(root, uid, gid)
    _fork_namespace_init()
    method = "root" if root else "user-namespace"
    filesystem = _hide_private_folders(root, home) and _make_tree_read_only()
    if filesystem and not _mount_work_folder(config, NOBODY if root else 0):  # /tmp is read-only now
        raise OSError(ctypes.get_errno(), "mount a tmpfs on /tmp")
    processes = _mount_proc()
    _mount_sys()
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # no ptrace, no /proc/1/mem
    return {"method": method, "network": True, "filesystem": filesystem,
            "processes": processes, "user": True}  # fmt: skip


def _without_namespaces(root: bool, refusal: str) -> dict[str, Any]:
    """The "none" isolation: only a root worker has a uid to drop its calls to."""
    user = root and _in_child(_become_nobody) == ""
    isolation = {"method": "none", "network": False, "filesystem": False, "processes": False, "user": user}
    return {**isolation, "unavailable": refusal} if refusal else isolation


def _become_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)  # fails where 65534 is not mapped (some containers)


def _in_child(attempt: Callable[[], None]) -> str:
    """Run `attempt()` in a throwaway child: "" if it returned, else the error it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            attempt()
            os._exit(0)
        except BaseException as error:
            os.write(write, str(error).encode())
            os._exit(1)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as reason:
        return "" if status == 0 else reason.read().decode(errors="replace") or f"status {status}"


def _namespaces_refused(root: bool, uid: int, gid: int) -> str:
    """Why this process may not create and set up the namespaces, or "" if it may.

    Tried in a throwaway child, because a process cannot leave a namespace it entered:
    some systems allow unshare but not what follows (Ubuntu's AppArmor restriction of
    unprivileged user namespaces leaves them without capabilities, so mount fails).
    """

    def attempt() -> None:
        _check(_libc.unshare(_namespace_flags(root)), "unshare")
        _set_up_namespaces(root, uid, gid)
        _check(_libc.mount(b"tmpfs", WORK_FOLDER.encode(), b"tmpfs", 0, None), "mount tmpfs")  # a private mount

    return _in_child(attempt)


def _namespace_flags(root: bool) -> int:
    """Mount, network and PID namespaces; a user namespace too when not root."""
    return CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)


def _set_up_namespaces(root: bool, uid: int, gid: int) -> None:
    """Map the caller to 0 in a new user namespace (when not root) and keep mounts from propagating out."""
    if not root:  # the one mapping an unprivileged process may write: itself as 0
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    # A fresh namespace's loopback is down and it has no other interface: no network at all.
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")


def _fork_namespace_init() -> None:
    """Fork; the parent waits for the child and exits with its status, the child returns.

    The child is process 1 of the PID namespace, so kill(-1) from it reaches exactly
    the calls' processes, and its death kills them all.
    """
    child = os.fork()
    if child:
        _, status = os.waitpid(child, 0)
        os._exit(0 if status == 0 else 1)
    # If the parent was killed before this line, the host has closed the pipes, and the
    # loop ends at once on end of file.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _hide_private_folders(root: bool, home: str) -> bool:
    """Cover private folders with an empty tmpfs, binding the interpreter's folders back.

    As root, a call runs as nobody, and a Python installed under a private folder
    (pyenv under /root, which is 0700) would leave it unable to import most of the
    standard library: each private ancestor of the interpreter is covered, and the
    interpreter's folders inside it are bound back at their own paths. In a user
    namespace the call runs with the caller's file access, so the caller's home
    (SSH keys, tokens) is covered the same way.
    """
    interpreter = _interpreter_folders()
    private = _private_ancestors(interpreter) if root else [home]
    try:
        for folder in private:
            _cover(folder, interpreter)
    except OSError:
        return False
    return True


def _cover(folder: str, interpreter: list[str]) -> None:
    """An empty tmpfs over `folder`, with the interpreter folders inside it bound back."""
    if not os.path.isdir(folder) or folder == "/" or any(folder == each or folder.startswith(each + "/") for each in interpreter):
        return  # the folder is itself part of the interpreter
    inside = [each for each in interpreter if each.startswith(folder + "/")]
    handles = [os.open(each, os.O_PATH | os.O_DIRECTORY) for each in inside]  # still reachable once covered
    _check(_libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m"), f"cover {folder}")
    for each, handle in zip(inside, handles):
        os.makedirs(each, mode=0o755, exist_ok=True)
        source = f"/proc/self/fd/{handle}".encode()
        _check(_libc.mount(source, each.encode(), None, MS_BIND | MS_REC, None), f"bind {each}")
        os.close(handle)


def _interpreter_folders() -> list[str]:
    """The installation prefixes and import path folders, without those inside another."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path}
    folders = sorted({os.path.realpath(each) for each in candidates if each and os.path.isdir(each)})
    return [each for each in folders if not any(each.startswith(other + "/") for other in folders if other != "/")]


def _private_ancestors(folders: list[str]) -> list[str]:
    """For each folder others cannot reach, its outermost ancestor without the others' x bit."""
    private: set[str] = set()
    for folder in folders:
        parts = folder.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            ancestor = "/" + "/".join(parts[:depth])
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                private.add(ancestor)
                break
    return sorted(private)


def _home_folder() -> str:
    try:
        return os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid with no passwd entry has no home to hide
        return ""


def _make_tree_read_only() -> bool:
    """Every mount read-only and nosuid (mount_setattr, Linux >= 5.12); False if refused."""
    attr = MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
    result = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    return result == 0


def _mount_proc() -> bool:
    """A read-only /proc of this PID namespace: a call sees its own processes, not the host's."""
    result = _libc.mount(b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    return result == 0


def _mount_sys() -> None:
    """A read-only /sys of this network namespace, which lists no interface of the host's.

    Only what a call can learn is at stake, so a refusal is not an error.
    """
    _libc.mount(b"sysfs", b"/sys", b"sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def _mount_work_folder(config: dict[str, Any], owner: int) -> bool:
    """A fresh, empty tmpfs over /tmp, owned by the uid the calls run as."""
    options = f"size={config['folder_mb']}m,nr_inodes=10000,mode=0700,uid={owner},gid={owner}"
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    return _libc.mount(b"tmpfs", WORK_FOLDER.encode(), b"tmpfs", flags, options.encode()) == 0


def _as_nobody(isolation: dict[str, Any]) -> bool:
    """Whether calls drop from root to nobody (rather than to no capabilities, or to nothing)."""
    return isolation["user"] and isolation["method"] != "user-namespace"


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


# ---------------------------------------------------------------- one call


class Capture:
    """The first `limit` characters of a byte stream, and a count of the characters after them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: list[str] = []
        self.kept_chars = 0
        self.omitted = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes, final: bool = False) -> None:
        text = self._decoder.decode(chunk, final)
        room = max(0, self.limit - self.kept_chars)
        if room:
            self.kept.append(text[:room])
            self.kept_chars += len(self.kept[-1])
        self.omitted += max(0, len(text) - room)

    @property
    def text(self) -> str:
        return "".join(self.kept)


@dataclass
class Child:
    """The next call's process, forked and confined ahead of the call, waiting for its code."""

    pid: int
    code: int  # write end: the code, then end of file
    output: int  # read end of stdout and stderr
    status: int  # read end of the exception report


def fork_child(folder: str, config: dict[str, Any], isolation: dict[str, Any]) -> Child:
    """Fork the process that will run the next call, and let it confine itself now.

    Its confinement (and the page faults of a fresh fork) happen while the worker is
    idle, so a call only pays for sending the code and running it.
    """
    code_read, code_write = os.pipe()
    output_read, output_write = os.pipe()
    status_read, status_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _run_child(code_read, output_write, status_write, folder, config, isolation)
    for fd in (code_read, output_write, status_write):
        os.close(fd)
    return Child(pid, code_write, output_read, status_read)


def run_call(child: Child, code: str, config: dict[str, Any], isolation: dict[str, Any]) -> dict[str, Any]:
    """Give `child` the code, follow it to its end, kill what it left, and report.

    The report: output (the first max_output_chars characters of stdout and stderr
    together), omitted (characters cut after them), timed_out, exit_code or signal,
    exception ({"type", "errno", "summary"} when the code raised), cpu_seconds and
    wall_seconds.
    """
    start = time.monotonic()
    capture = Capture(config["max_output_chars"])
    try:
        _send(child.code, code.encode("utf-8", "surrogatepass"))
        timed_out = _follow(child, capture, start + config["wall_seconds"])
    finally:
        kill_call(child, isolation)
    _, status, usage = os.wait4(child.pid, 0)
    _drain(child.output, capture)
    if isolation["method"] != "none":
        _reap_all()
    report = {
        "output": capture.text,
        "omitted": capture.omitted,
        "timed_out": timed_out,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exception": _read_exception(child.status),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 4),
        "wall_seconds": round(time.monotonic() - start, 4),
    }
    _close(child.output, child.status)
    return report


def discard(child: Child, isolation: dict[str, Any]) -> None:
    """Kill and reap a child whose call failed in the worker, and close its pipes."""
    kill_call(child, isolation)
    if isolation["method"] != "none":
        _reap_all()
    else:
        try:
            os.waitpid(child.pid, 0)
        except ChildProcessError:  # already reaped
            pass
    _close(child.code, child.output, child.status)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:  # closed already
            pass


def _send(fd: int, data: bytes) -> None:
    """Write all of `data` and close: the child reads its code to end of file."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _follow(child: Child, capture: Capture, deadline: float) -> bool:
    """Read the child's output until it exits; True if the wall clock ran out first."""
    exit_fd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else None
    poller = select.poll()
    poller.register(child.output, select.POLLIN)
    if exit_fd is not None:
        poller.register(exit_fd, select.POLLIN)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            # Without a pidfd (not Linux) the child's exit is seen by polling waitid.
            wait_ms = remaining * 1000 if exit_fd is not None else min(remaining, 0.01) * 1000
            for fd, _ in poller.poll(wait_ms):
                if fd == child.output:
                    chunk = os.read(child.output, READ_BYTES)
                    capture.feed(chunk) if chunk else poller.unregister(child.output)
                elif fd == exit_fd:
                    return False
            if exit_fd is None and os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return False
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def kill_call(child: Child, isolation: dict[str, Any]) -> None:
    """Kill every process of the call: the whole namespace but this process, or the child's group."""
    if isolation["method"] != "none":
        os.kill(-1, signal.SIGKILL)  # from process 1 of a PID namespace: everything else in it
        return
    for kill in (os.killpg, os.kill):  # the child has its own group, unless it died before setsid
        try:
            kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _drain(output: int, capture: Capture) -> None:
    """Read what is left in the pipe; stop when every writer is gone or after DRAIN_SECONDS."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([output], [], [], remaining)
        if not ready:
            break
        chunk = os.read(output, READ_BYTES)
        if not chunk:
            break
        capture.feed(chunk)
    capture.feed(b"", final=True)


def _reap_all() -> None:
    """Kill and wait for every process left in the namespace; orphans are this process's children.

    kill(-1) is repeated before each wait, so a process forked while the first kill ran
    cannot be waited for without having been killed.
    """
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _read_exception(status: int) -> dict[str, Any] | None:
    os.set_blocking(status, False)
    try:
        line = os.read(status, 4096).decode("utf-8", "replace")
    except BlockingIOError:
        return None
    try:
        return json.loads(line) if line else None
    except ValueError:
        return None


def new_folder(previous: str | None, config: dict[str, Any], isolation: dict[str, Any]) -> str:
    """An empty working folder for the next call; the previous one, and all it held, is gone.

    With filesystem isolation it is a fresh tmpfs on /tmp; otherwise a new folder in
    the scratch folder the host made for this worker (and removes with it), owned by
    the uid the call will run as.
    """
    if isolation["filesystem"]:
        if previous is not None:
            _check(_libc.umount2(WORK_FOLDER.encode(), MNT_DETACH), "umount /tmp")
            if not _mount_work_folder(config, NOBODY if _as_nobody(isolation) else 0):
                raise OSError(ctypes.get_errno(), "mount a fresh tmpfs on /tmp")
        return WORK_FOLDER
    if previous is not None:
        remove_folder(previous)
    folder = tempfile.mkdtemp(prefix="call-", dir=config["scratch"])
    if _as_nobody(isolation):
        os.chown(folder, NOBODY, NOBODY)
    return folder


def remove_folder(folder: str) -> None:
    """Remove a working folder outside a tmpfs, also where the call took away its owner's permissions.

    Without root, the remover has the call's uid, and a folder the call made 000 would
    stop rmtree, so permissions are given back first (symbolic links are not followed).
    Root needs no permissions, and never changes any here: a process of the call still
    alive could swap a folder for a link to a file of the host's.
    """
    if os.geteuid() != 0:
        _restore_permissions(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _restore_permissions(folder: str) -> None:
    try:
        os.chmod(folder, 0o700)
    except OSError:  # gone already
        return
    for parent, folders, _ in os.walk(folder):
        for path in (os.path.join(parent, name) for name in folders):
            if not os.path.islink(path):
                try:
                    os.chmod(path, 0o700)
                except OSError:  # removed meanwhile
                    pass


# ---------------------------------------------------------------- inside the call's child


def _run_child(code: int, output: int, status: int, folder: str, config: dict[str, Any], isolation: dict[str, Any]) -> None:
    """The forked child: confine itself, wait for the code, run it, exit. Never returns."""
    exit_status = 70  # EX_SOFTWARE: the confinement itself failed
    try:
        if sys.platform.startswith("linux"):  # without namespaces, nothing else ties it to the worker
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        _redirect(code, output, status)
        os.chdir(folder)
        os.environ.update(HOME=folder, TMPDIR=folder, PWD=folder)
        _set_limits(config, isolation)
        _drop_privileges(isolation)
        source = _read_code(CODE_FD)
        exit_status = _run_code(source)
        _join_threads()
    except BaseException as error:  # a broken confinement must not fall back into the worker's loop
        exit_status = _report_failure(error, exit_status)
    finally:
        _flush()
        os._exit(exit_status)


def _read_code(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, READ_BYTES):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogatepass")


def _redirect(code: int, output: int, status: int) -> None:
    """stdin from /dev/null, stdout and stderr to the capture pipe, the status pipe on
    fd 3 and the code pipe on fd 4; nothing else of the worker stays open."""
    code, output, status = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (code, output, status))  # out of the way
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.dup2(status, STATUS_FD, inheritable=False)
    os.dup2(code, CODE_FD, inheritable=False)
    os.closerange(CODE_FD + 1, os.sysconf("SC_OPEN_MAX") if sys.platform != "linux" else 1 << 20)
    # Line-buffered, so what was printed before a kill still reaches the pipe.
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)


def _set_limits(config: dict[str, Any], isolation: dict[str, Any]) -> None:
    """CPU time, address space, file size and process count, as rlimits.

    RLIMIT_NPROC counts processes per uid: as nobody it is shared with every other
    process running as nobody (other calls, and the other workers' waiting children);
    in a user namespace it counts that namespace only (whose other two processes are
    the worker and its parent). Without a uid of its own a call would share the count
    with the host user's processes, so it is not set.
    """
    megabyte = 1024 * 1024
    cpu = config["cpu_seconds"]
    limits = [
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (config["memory_mb"] * megabyte,) * 2),
        (resource.RLIMIT_FSIZE, (config["file_size_mb"] * megabyte,) * 2),
    ]
    if isolation["method"] == "user-namespace":  # + the worker and its parent
        limits.append((resource.RLIMIT_NPROC, (config["max_processes"] + 2,) * 2))
    elif _as_nobody(isolation):  # + the other workers' waiting children
        limits.append((resource.RLIMIT_NPROC, (config["max_processes"] + config["workers"] - 1,) * 2))
    for which, (soft, hard) in limits:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):  # e.g. RLIMIT_AS on macOS; documented in sandbox.py
            pass


def _drop_privileges(isolation: dict[str, Any]) -> None:
    """Run as nobody (when root) or with no capabilities (in a user namespace), for good.

    The capability bounding set is emptied and no_new_privs set, so no setuid binary
    and no file capability can give privileges back.
    """
    if not isolation["user"]:
        return
    if sys.platform.startswith("linux"):
        for capability in range(LAST_CAPABILITY + 1):
            _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if isolation["method"] == "user-namespace":
        header, data = CapabilityHeader(CAPABILITY_VERSION_3, 0), (CapabilityData * 2)()
        _check(_libc.capset(ctypes.byref(header), data), "capset")
        return
    _become_nobody()


def _run_code(code: str) -> int:
    """Run `code` as __main__ in fresh globals; its exit status, as the interpreter would give."""
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    sys.argv = [CODE_FILENAME]
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, CODE_FILENAME, "exec"), namespace)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return (stop.code or 0) & 0xFF
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException as error:
        _report_exception(error)
        return 1
    return 0


def _join_threads() -> None:
    """Wait for the code's non-daemon threads, as the interpreter does before it exits."""
    threading = sys.modules.get("threading")
    if threading is None:  # the code started no thread
        return
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def _report_exception(error: BaseException) -> None:
    """The traceback, trimmed to the code's own frames, on stderr; its type and errno on fd 3."""
    summary = traceback.format_exception_only(type(error), error)[-1].strip()
    number = error.errno if isinstance(error, OSError) else None
    try:
        os.write(STATUS_FD, json.dumps({"type": type(error).__name__, "errno": number,
                                        "summary": summary[:MAX_SUMMARY_CHARS]}).encode())  # fmt: skip
    except OSError:  # the code closed fd 3
        pass
    tb = error.__traceback__.tb_next if error.__traceback__ else None  # drop this file's exec frame
    sys.stderr.write("".join(traceback.TracebackException(type(error), error, tb).format()))


def _report_failure(error: BaseException, exit_status: int) -> int:
    """A failure outside the code (confinement, or printing the traceback itself)."""
    try:
        os.write(2, f"sandbox: {type(error).__name__}: {error}\n".encode())
    except OSError:
        pass
    return exit_status


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the code closed its stdout
            pass


# ---------------------------------------------------------------- the loop


def serve(requests: BinaryIO, replies: BinaryIO, config: dict[str, Any], isolation: dict[str, Any]) -> None:
    """Answer one request per line until the host closes the pipe.

    After each reply, the previous call's folder is replaced and the next call's child
    forked, so both are ready before the next request arrives.
    """
    folder = new_folder(None, config, isolation)
    child = fork_child(folder, config, isolation)
    for line in requests:
        if os.waitpid(child.pid, os.WNOHANG)[0]:  # the waiting child died before its call: it never ran code
            discard(child, isolation)
            child = fork_child(folder, config, isolation)
        try:
            reply = run_call(child, json.loads(line)["code"], config, isolation)
        except Exception as error:  # the worker's own failure: the host reports it as infra
            reply = {"infra": f"{type(error).__name__}: {error}"}
            discard(child, isolation)
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()
        folder = new_folder(folder, config, isolation)
        child = fork_child(folder, config, isolation)
    discard(child, isolation)
    if not isolation["filesystem"]:
        remove_folder(folder)


def main() -> None:
    config = json.loads(sys.argv[1])
    # The protocol moves off fds 0 and 1, so nothing a call inherits can reach the host.
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # process 1 must have no handler a call could trigger
    os.chdir("/")
    os.umask(0o022)
    for name in PRELOADED:
        __import__(name)
    isolation = isolate(config)
    gc.freeze()  # what exists now is shared with every child; no collection there touches it
    replies.write(json.dumps({"isolation": isolation}).encode() + b"\n")
    replies.flush()
    serve(requests, replies, config, isolation)


if __name__ == "__main__":
    main()
