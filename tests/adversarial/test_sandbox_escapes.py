"""Escape attempts against the Python sandbox: one test id per attempt and isolation mode.

Each attack is a program, or a few run in order (on the same warm worker, or on a second
sandbox), that tries one way out: a Unix socket of the host's, System V IPC, a keyring or
a message queue that outlives its call, a new namespace or another kernel surface, the
status pipe the call's process reports on, the host's files, or the limits. The host
places the bait first (listeners, files it must not reach), the attacks of a mode run as
one batch, and each test then judges its attack twice where it can: from what the program
saw, and from the host's side (a listener that accepted nothing, a System V object or a
process that does not exist).

Modes: "root" (PythonSandbox as root), "user-namespace" (as an unprivileged user; as root
the batch runs under `setpriv` as uid 65534 with a supplementary group of the bait's), and
"none" (isolate=False), where only what that column claims is attacked: the system-call
filter, System V IPC, the keyrings and the status pipe. A mode this machine cannot give
skips with the reason; an attack on a feature the machine lacks (an x86-only system call
on aarch64, bait the host user may not place) skips and says so.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import toolpolicy
from toolpolicy.tools import PythonSandbox, SandboxLimits

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the attacks are Linux system calls")

# The wall clock is generous: no attack is meant to take long, and none waits for the wall clock
# (the longest sleeps 8 s), but the full-tree scan for sockets takes about 0.8 s of CPU (over 2 s
# on a loaded machine, counted with the python that runs it) and several seconds of reading,
# which the suite's load has stretched past 15 s.
LIMITS = SandboxLimits(
    cpu_seconds=5, wall_seconds=40.0, memory_mb=256, file_size_mb=1, folder_mb=8,
    max_processes=16, max_output_chars=2000, workers=1,
)  # fmt: skip
ONE_CPU_SECOND = "one CPU second"
"""The sandbox of the CPU attacks: 1 s of CPU for a call, so that passing it costs little."""
SANDBOX_LIMITS = {ONE_CPU_SECOND: replace(LIMITS, cpu_seconds=1)}
MODES = ("root", "user-namespace", "none")
NAMESPACES = frozenset({"root", "user-namespace"})
EVERY_MODE = frozenset(MODES)
NOBODY = 65534
BAIT_GROUP = 4242  # a supplementary group the unprivileged run keeps; group-only bait belongs to it

RUN = str(os.getpid())
BAIT = f"toolpolicy-bait-{RUN}"
HOST_TMP = Path(tempfile.gettempdir()) / BAIT
SECRET = f"host-secret-{RUN}"
LISTENERS = {
    "tmp": HOST_TMP / "listener.sock",
    "var-tmp": Path("/var/tmp") / f"{BAIT}.sock",
    "dev-shm": Path("/dev/shm") / f"{BAIT}.sock",
    "run": Path("/run") / f"{BAIT}.sock",
    "run-user": Path("/run/user") / BAIT / "bus",
    "group": Path("/var/tmp") / f"{BAIT}-group.sock",  # 0660, root:BAIT_GROUP
    "abstract": f"\0{BAIT}",
}
DATAGRAM = Path("/var/tmp") / f"{BAIT}.dgram"
SECRETS = {
    "tmp": HOST_TMP / "secret.txt",
    "var-tmp": Path("/var/tmp") / f"{BAIT}.secret",
    "group": Path("/var/tmp") / f"{BAIT}.group-secret",  # 0640, root:BAIT_GROUP
}
# Services a host commonly runs; connecting to one proves the socket is reachable.
SYSTEM_SOCKETS = (
    "/run/dbus/system_bus_socket", "/var/run/dbus/system_bus_socket", "/run/systemd/journal/socket",
    "/run/systemd/private", "/var/run/docker.sock", "/run/containerd/containerd.sock",
    "/run/postgresql/.s.PGSQL.5432", "/var/run/nscd/socket",
)  # fmt: skip
IPC_KEY = 0x7B000000 | (os.getpid() & 0xFFFF)
QUEUE_NAME = f"/{BAIT}"
MARKERS = {name: f"1000.{RUN}{n}" for n, name in enumerate(("fork-bomb", "setsid", "nohup"), 1)}
WRITE_TARGETS = {"etc": f"/etc/{BAIT}", "root": f"/{BAIT}", "var-tmp": f"/var/tmp/{BAIT}.written", "run": f"/run/{BAIT}.written"}

# System-call numbers for the attacks without a C library wrapper, from the kernel's headers
# (asm/unistd_64.h and asm-generic/unistd.h); kept apart from the sandbox's own table on purpose.
SYSCALLS = {
    "x86_64": {"clone": 56, "clone3": 435, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "kexec_load": 246,
               "fsopen": 430, "open_tree": 428, "pidfd_open": 434, "pidfd_getfd": 438, "getpid": 39},
    "aarch64": {"clone": 220, "clone3": 435, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "kexec_load": 104,
                "fsopen": 430, "open_tree": 428, "pidfd_open": 434, "pidfd_getfd": 438, "getpid": 172},
}  # fmt: skip
MACHINE = platform.machine()
NR = SYSCALLS.get(MACHINE, {})

# Every program starts with this: a C library, a raw system call, and the verdict line the judges read.
# Only modules the worker has imported already: in the "none" column as root a call runs as nobody,
# who may not read a Python installed under /root (documented), so it cannot import more.
PRELUDE = """\
import ctypes, errno, json, os, stat, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def syscall(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
def call(function, *args):
    ctypes.set_errno(0)
    result = function(*args)
    return result, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
def verdict(escaped, detail):
    print(("ESCAPED: " if escaped else "BLOCKED: ") + str(detail), flush=True)
"""


@dataclass(frozen=True)
class Context:
    """What a judge may look at besides the runs: the mode's isolation, and the host's bait."""

    mode: str
    isolation: dict[str, Any]
    bait: Bait


Judge = Callable[[list[dict[str, Any]], Context], None]


@dataclass(frozen=True)
class Attack:
    id: str
    kind: str
    """unix-socket, ipc, syscalls, status, filesystem or resources."""
    steps: tuple[tuple[str, str], ...]
    """(sandbox, program) in order: "first" is one warm worker, "second" another sandbox, ONE_CPU_SECOND a third."""
    judge: Judge
    modes: frozenset[str] = NAMESPACES
    machine: str = ""
    """Run only on this CPU architecture ("" for any)."""
    contained: bool = False
    """The attack can only relabel its own failure (see its judge); counted apart from the blocked ones."""


# ---------------------------------------------------------------- judges


def raised(run: dict[str, Any]) -> None:
    assert "raised" not in run, f"PythonSandbox.run raised: {run['raised']}"


def blocked(runs: list[dict[str, Any]], context: Context) -> None:
    """The last program says BLOCKED, and no program of the attack says ESCAPED."""
    for run in runs:
        raised(run)
        assert "ESCAPED" not in run["output"], run["observation"]
    assert "BLOCKED: " in runs[-1]["output"], f"no verdict from the program: {runs[-1]['observation']}"


def blocked_or_killed(runs: list[dict[str, Any]], context: Context) -> None:
    """As `blocked`, or the process died of the attempt (an ABI the kernel does not offer)."""
    if runs[-1].get("status") == "killed" and "ESCAPED" not in runs[-1]["output"]:
        return
    blocked(runs, context)


def and_then(*judges: Judge) -> Judge:
    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        for each in judges:
            each(runs, context)

    return judge


def needs_bait(name: str) -> Judge:
    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        if context.bait.placed.get(name) != "":
            pytest.skip(f"the host user could not place the bait {name!r} ({context.bait.placed.get(name, 'not placed')})")

    return judge


def nothing_accepted(name: str) -> Judge:
    """The host's listener `name` has no connection waiting (a connect would have queued one)."""

    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        needs_bait(name)(runs, context)
        listener = context.bait.listeners[name]
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return
        connection.close()
        raise AssertionError(f"the host's listener {name} accepted a connection from the sandbox")

    return judge


def nothing_received(runs: list[dict[str, Any]], context: Context) -> None:
    try:
        data = context.bait.datagram.recv(4096)
    except BlockingIOError:
        return
    raise AssertionError(f"the host's datagram socket received {data!r} from the sandbox")


def no_host_ipc(kind: str) -> Judge:
    """The host's IPC namespace holds no System V object with the bait key (/proc/sysvipc)."""

    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        assert IPC_KEY not in host_ipc_keys(kind), f"a System V {kind} object with key {IPC_KEY:#x} is on the host"

    return judge


def no_host_queue(runs: list[dict[str, Any]], context: Context) -> None:
    assert not host_queue_exists(), f"the message queue {QUEUE_NAME} is on the host"


def no_host_file(path: str) -> Judge:
    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        assert not os.path.lexists(path), f"the sandbox wrote {path} on the host"

    return judge


def no_survivor(marker: str) -> Judge:
    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        assert not processes_with(marker), f"a process of the call survived it: {processes_with(marker)}"

    return judge


def with_a_call_cgroup(runs: list[dict[str, Any]], context: Context) -> None:
    if not context.isolation.get("cpu"):
        pytest.skip(f"no cgroup holds a call's processes here: {context.isolation.get('note')}")


def stopped_for_cpu(runs: list[dict[str, Any]], context: Context) -> None:
    """The call was stopped for its CPU time, all its processes together, before the program could say it ran on."""
    run = runs[-1]
    raised(run)
    assert (run["status"], run["error"]) == ("cpu", "tool_error"), run
    assert "ESCAPED" not in run["output"], run["observation"]


def with_a_process_limit(runs: list[dict[str, Any]], context: Context) -> None:
    if not context.isolation["user"]:
        pytest.skip("without a uid of its own a call has no process limit (documented for this column)")


def tampered(runs: list[dict[str, Any]], context: Context) -> None:
    """Whatever was written on the status pipe, the program is told it wrote there: a tool error."""
    run = runs[-1]
    raised(run)
    assert (run["status"], run["error"]) == ("tampered", "tool_error"), run


def tampered_or_refused(runs: list[dict[str, Any]], context: Context) -> None:
    """As `tampered`, unless the program could not even reach the pipe (and says so)."""
    if "BLOCKED: " in runs[-1]["output"]:
        ok_and_unharmed(runs, context)
    else:
        tampered(runs, context)


def ok_and_unharmed(runs: list[dict[str, Any]], context: Context) -> None:
    """The sandbox reports the call as the plain success it was."""
    run = runs[-1]
    raised(run)
    assert (run["status"], run["error"]) == ("ok", None), run


def not_memory(runs: list[dict[str, Any]], context: Context) -> None:
    """No MemoryError was made up: the call ended ok (the writer was killed first) or was caught writing."""
    run = runs[-1]
    raised(run)
    assert run["status"] in ("ok", "tampered") and run["error"] in (None, "tool_error"), run


def the_programs_own_fault(status: str) -> Judge:
    def judge(runs: list[dict[str, Any]], context: Context) -> None:
        run = runs[-1]
        raised(run)
        assert (run["status"], run["error"]) == (status, "tool_error"), run

    return judge


# ---------------------------------------------------------------- the host's side


@dataclass
class Bait:
    """What the host placed for the sandbox to reach: listeners and secret files."""

    listeners: dict[str, socket.socket] = field(default_factory=dict)
    datagram: socket.socket | None = None
    placed: dict[str, str] = field(default_factory=dict)
    """Bait name -> "" when placed, else why it could not be."""


def place_bait() -> Bait:
    bait = Bait()
    HOST_TMP.mkdir(mode=0o755, exist_ok=True)
    for name, path in LISTENERS.items():
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if isinstance(path, Path):
                path.parent.mkdir(mode=0o755, exist_ok=True)
                listener.bind(str(path))
                os.chmod(path, 0o777)  # reachable by anyone who can see it: only the isolation may stop a call
                if name == "group":
                    os.chown(path, 0, BAIT_GROUP)
                    os.chmod(path, 0o660)
            else:
                listener.bind(path)
            listener.listen(8)
            listener.setblocking(False)
            bait.listeners[name] = listener
            bait.placed[name] = ""
        except OSError as error:
            listener.close()
            bait.placed[name] = str(error)
    bait.datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    bait.datagram.bind(str(DATAGRAM))
    os.chmod(DATAGRAM, 0o777)
    bait.datagram.setblocking(False)
    for name, path in SECRETS.items():
        try:
            path.write_text(SECRET)
            os.chmod(path, 0o644)
            if name == "group":
                os.chown(path, 0, BAIT_GROUP)
                os.chmod(path, 0o640)
            bait.placed[f"secret-{name}"] = ""
        except OSError as error:
            bait.placed[f"secret-{name}"] = str(error)
    return bait


def remove_bait(bait: Bait) -> None:
    for listener in bait.listeners.values():
        listener.close()
    if bait.datagram is not None:
        bait.datagram.close()
    for path in [*LISTENERS.values(), DATAGRAM, *SECRETS.values()]:
        if isinstance(path, Path) and path.exists():
            path.unlink()
    for folder in (HOST_TMP, LISTENERS["run-user"].parent):
        shutil.rmtree(folder, ignore_errors=True)
    remove_leaked_ipc()


def host_ipc_keys(kind: str) -> set[int]:
    """Keys of the host's System V objects of a kind (shm, msg, sem)."""
    try:
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {int(line.split()[0]) for line in lines if line.strip()}


_libc = ctypes.CDLL(None, use_errno=True)


def host_queue_exists() -> bool:
    descriptor = _libc.mq_open(QUEUE_NAME.encode(), os.O_RDONLY)
    if descriptor == -1:
        return False
    _libc.mq_close(descriptor)
    return True


def remove_leaked_ipc() -> None:
    """Remove bait IPC objects an escaped attack left on the host (on a sandbox without the fixes)."""
    ipc_rmid = 0
    for get, remove in ((_libc.shmget, _libc.shmctl), (_libc.msgget, _libc.msgctl)):
        identifier = get(IPC_KEY, 0, 0)
        if identifier != -1:
            remove(identifier, ipc_rmid, None)
    semaphore = _libc.semget(IPC_KEY, 0, 0)
    if semaphore != -1:
        _libc.semctl(semaphore, 0, ipc_rmid)
    _libc.mq_unlink(QUEUE_NAME.encode())


def processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            found.append(f"{entry.name}: {command}")
    return found


# ---------------------------------------------------------------- the attacks: Unix sockets


def connect_program(address: str) -> str:
    return PRELUDE + f"""
import socket
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.settimeout(2)
try:
    client.connect({address!r})
    client.sendall(b"hello from the sandbox")
    verdict(True, "connected")
except OSError as error:
    verdict(False, error)
"""


def host_pid_root(path: Path) -> str:
    return f"/proc/{os.getpid()}/root{path}"


SOCKET_ATTACKS = [
    *[
        Attack(f"unix-socket-{name}", "unix-socket", (("first", connect_program(str(path))),),
               and_then(blocked, nothing_accepted(name)))
        for name, path in LISTENERS.items()
    ],
    Attack("unix-socket-via-proc-pid-root", "unix-socket",
           (("first", connect_program(host_pid_root(LISTENERS["var-tmp"]))),),
           and_then(blocked, nothing_accepted("var-tmp"))),
    Attack("unix-socket-datagram-sendto", "unix-socket", (("first", PRELUDE + f"""
import socket
sender, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    sender.sendto(b"hello from the sandbox", {str(DATAGRAM)!r})
    verdict(True, "sent")
except OSError as error:
    verdict(False, error)
"""),), and_then(blocked, nothing_received)),
    Attack("unix-socket-system-services", "unix-socket", (("first", PRELUDE + f"""
import socket
reached = []
for path in {list(SYSTEM_SOCKETS)!r}:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(1)
    try:
        client.connect(path)
        reached.append(path)
    except OSError:
        pass
    client.close()
verdict(bool(reached), reached or "no system service reachable")
"""),), blocked),
    Attack("unix-socket-anywhere-in-the-tree", "unix-socket", (("first", PRELUDE + """
import subprocess
found = subprocess.run(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", ")", "-prune",
                        "-o", "-type", "s", "-print"], capture_output=True, text=True).stdout.split()
verdict(bool(found), found[:10] or "no socket file in the whole file system")
"""),), blocked),
    Attack("unix-socket-inherited-descriptor", "unix-socket", (("first", PRELUDE + """
sockets = []
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            sockets.append(fd)
    except OSError:  # the descriptor that listed the folder, closed since
        pass
verdict(bool(sockets), f"socket descriptors {sockets}" if sockets else "no socket among the inherited descriptors")
"""),), blocked),
]  # fmt: skip


# ---------------------------------------------------------------- the attacks: IPC, keyrings, shared memory


def sysv_programs(kind: str) -> tuple[str, str]:
    """(create, find) programs for a System V object of `kind` with the bait key."""
    create = {
        "shm": f"""
identifier, error = call(libc.shmget, {IPC_KEY}, 1 << 20, 0o1666)
if identifier != -1:
    libc.shmat.restype = ctypes.c_void_p
    address = libc.shmat(identifier, None, 0)
    ctypes.memmove(address, b"left behind", 11)
""",
        "msg": f"""
identifier, error = call(libc.msgget, {IPC_KEY}, 0o1666)
if identifier != -1:
    message = struct.pack("l", 1) + b"left behind"
    libc.msgsnd(identifier, message, len(message) - 8, 0)
""",
        "sem": f"""
identifier, error = call(libc.semget, {IPC_KEY}, 1, 0o1666)
""",
    }[kind]
    get = {"shm": "libc.shmget(KEY, 0, 0)", "msg": "libc.msgget(KEY, 0)", "sem": "libc.semget(KEY, 0, 0)"}[kind]
    setup = PRELUDE + create + 'print("SETUP:", "created" if identifier != -1 else f"refused {error}")\n'
    find = PRELUDE + f"KEY = {IPC_KEY}\nidentifier = {get}\nverdict(identifier != -1, f'lookup gave {{identifier}}')\n"
    return setup, find


def keyring_programs() -> tuple[str, str]:
    add = PRELUDE + f"""
key, error = syscall({NR.get("add_key", -1)}, b"user", {BAIT.encode()!r}, b"{SECRET}", {len(SECRET)}, -4)
print("SETUP:", f"added key {{key}}" if key != -1 else f"refused {{error}}")
"""
    search = PRELUDE + f"""
found, error = syscall({NR.get("keyctl", -1)}, 10, -4, b"user", {BAIT.encode()!r}, 0)  # KEYCTL_SEARCH in the user keyring
requested, error2 = syscall({NR.get("request_key", -1)}, b"user", {BAIT.encode()!r}, None, 0)
verdict(found != -1 or requested != -1, f"search gave {{found}} ({{error}}), request_key {{requested}} ({{error2}})")
for key in {{found, requested}} - {{-1}}:  # a host without the fix would keep it
    syscall({NR.get("keyctl", -1)}, 9, key, -4)  # KEYCTL_UNLINK
    syscall({NR.get("keyctl", -1)}, 3, key)  # KEYCTL_REVOKE
"""
    return add, search


def named_session_keyring_programs() -> tuple[str, str]:
    join = f"keyring, error = syscall({NR.get('keyctl', -1)}, 1, {BAIT.encode()!r})  # KEYCTL_JOIN_SESSION_KEYRING\n"
    first = PRELUDE + join + f"""
if keyring != -1:
    syscall({NR.get("add_key", -1)}, b"user", b"note", b"left behind", 11, keyring)
    syscall({NR.get("keyctl", -1)}, 8, keyring, -4)  # KEYCTL_LINK into the user keyring: it outlives the process
print("SETUP:", f"joined {{keyring}}" if keyring != -1 else f"refused {{error}}")
"""
    second = PRELUDE + join + f"""
found = syscall({NR.get("keyctl", -1)}, 10, keyring, b"user", b"note", 0)[0] if keyring != -1 else -1
linked = syscall({NR.get("keyctl", -1)}, 10, -4, b"keyring", {BAIT.encode()!r}, 0)[0]  # still in the user keyring?
verdict(found != -1 or linked != -1, f"joined {{keyring}} ({{error}}), found {{found}}, linked {{linked}}")
for ring in {{keyring, linked}} - {{-1}}:  # a host without the fix would keep it
    syscall({NR.get("keyctl", -1)}, 9, ring, -4)  # KEYCTL_UNLINK
    syscall({NR.get("keyctl", -1)}, 3, ring)  # KEYCTL_REVOKE
"""
    return first, second


QUEUE_OPEN = f"""
libc.mq_open.restype = ctypes.c_int
queue, error = call(libc.mq_open, {QUEUE_NAME.encode()!r}, {{flags}}, 0o666, None)
"""
SHM_FILE_WRITE = PRELUDE + f"""
import _posixshmem
descriptor = _posixshmem.shm_open("/{BAIT}", os.O_CREAT | os.O_RDWR, 0o600)
os.write(descriptor, b"left behind")
open("/dev/shm/{BAIT}.note", "w").write("left behind")
print("SETUP: wrote /dev/shm")
"""
SHM_FILE_FIND = PRELUDE + """
left = sorted(os.listdir("/dev/shm"))
verdict(bool(left), left or "/dev/shm is empty")
"""
IPC_NAMESPACE = PRELUDE + 'print("NAMESPACE", os.readlink("/proc/self/ns/ipc"))\n'


def not_the_hosts_ipc_namespace(runs: list[dict[str, Any]], context: Context) -> None:
    """Each call ran in an IPC namespace that is not the host's. (Two calls' namespace numbers may be
    equal: a freed namespace's number is reused; the queue and /dev/shm attacks show they are apart.)"""
    for run in runs:
        raised(run)
    seen = [line.split()[1] for run in runs for line in run["output"].splitlines() if line.startswith("NAMESPACE")]
    assert len(seen) == 2 and os.readlink("/proc/self/ns/ipc") not in seen, seen


def ipc_attacks() -> list[Attack]:
    attacks = []
    for kind in ("shm", "msg", "sem"):
        create, find = sysv_programs(kind)
        host = no_host_ipc(kind)
        attacks.append(Attack(f"sysv-{kind}-across-calls", "ipc", (("first", create), ("first", find)),
                              and_then(blocked, host), EVERY_MODE))  # fmt: skip
    create, find = sysv_programs("shm")
    attacks.append(Attack("sysv-shm-across-sandboxes", "ipc", (("first", create), ("second", find)),
                          and_then(blocked, no_host_ipc("shm")), EVERY_MODE))  # fmt: skip
    attacks.append(Attack("sysv-shm-memory-past-the-limit", "ipc", (("first", PRELUDE + """
libc.shmat.restype = ctypes.c_void_p
segments = []
for _ in range(8):  # 8 x 64 MB segments, each attached, filled and detached: 512 MB no rlimit counts
    identifier, error = call(libc.shmget, 0, 64 << 20, 0o1600)  # IPC_PRIVATE
    if identifier == -1:
        break
    address = libc.shmat(identifier, None, 0)
    ctypes.memset(address, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    segments.append(identifier)
verdict(len(segments) * 64 > 256, f"{len(segments) * 64} MB held in System V segments ({error})")
for identifier in segments:  # a host without the fix would keep them
    libc.shmctl(identifier, 0, None)
"""),), blocked, EVERY_MODE))
    add, search = keyring_programs()
    attacks.append(Attack("keyring-across-calls", "ipc", (("first", add), ("first", search)), blocked, EVERY_MODE))
    attacks.append(Attack("keyring-across-sandboxes", "ipc", (("first", add), ("second", search)), blocked, EVERY_MODE))
    first, second = named_session_keyring_programs()
    attacks.append(Attack("keyring-named-session-across-calls", "ipc", (("first", first), ("first", second)),
                          blocked, EVERY_MODE))  # fmt: skip
    create_queue = PRELUDE + QUEUE_OPEN.format(flags="os.O_CREAT | os.O_RDWR") + """
if queue != -1:
    libc.mq_send(queue, b"left behind", 11, 0)
print("SETUP:", f"opened {queue}" if queue != -1 else f"refused {error}")
"""
    find_queue = PRELUDE + QUEUE_OPEN.format(flags="os.O_RDONLY") + "verdict(queue != -1, f'open gave {queue} ({error})')\n"
    attacks.append(Attack("posix-queue-across-calls", "ipc", (("first", create_queue), ("first", find_queue)),
                          and_then(blocked, no_host_queue), EVERY_MODE))  # fmt: skip
    attacks.append(Attack("posix-queue-across-sandboxes", "ipc", (("first", create_queue), ("second", find_queue)),
                          and_then(blocked, no_host_queue), EVERY_MODE))  # fmt: skip
    attacks.append(Attack("dev-shm-across-calls", "ipc", (("first", SHM_FILE_WRITE), ("first", SHM_FILE_FIND)),
                          and_then(blocked, no_host_file(f"/dev/shm/{BAIT}.note"), no_host_file(f"/dev/shm/{BAIT}"))))
    attacks.append(Attack("dev-shm-across-sandboxes", "ipc", (("first", SHM_FILE_WRITE), ("second", SHM_FILE_FIND)),
                          and_then(blocked, no_host_file(f"/dev/shm/{BAIT}.note"))))  # fmt: skip
    attacks.append(Attack("ipc-namespace-is-not-the-hosts", "ipc", (("first", IPC_NAMESPACE), ("first", IPC_NAMESPACE)),
                          not_the_hosts_ipc_namespace))  # fmt: skip
    return attacks


# ---------------------------------------------------------------- the attacks: namespaces and kernel surface


def refused(expression: str, what: str) -> str:
    """A program that makes one call `expression` (giving (result, error)) and escapes if it succeeded."""
    return PRELUDE + f"result, error = {expression}\nverdict(result != -1, f'{what}: {{result}} {{error}}')\n"


CHILD_THAT_WAITS = """
buffer = ctypes.create_string_buffer(b"the child's memory", 32)
child = os.fork()
if child == 0:
    time.sleep(5)
    os._exit(0)
"""
PERF_ATTR = "bytearray(struct.pack('=IIQ', 1, 112, 0) + bytes(24) + struct.pack('=Q', 0x60) + bytes(64))"
SYSCALL_ATTACKS = [
    Attack("unshare-user-namespace", "syscalls", (("first", refused("call(libc.unshare, 0x10000000)", "unshare(CLONE_NEWUSER)")),), blocked, EVERY_MODE),
    Attack("unshare-mount-namespace", "syscalls", (("first", refused("call(libc.unshare, 0x00020000)", "unshare(CLONE_NEWNS)")),), blocked, EVERY_MODE),
    Attack("unshare-network-namespace", "syscalls", (("first", refused("call(libc.unshare, 0x40000000)", "unshare(CLONE_NEWNET)")),), blocked, EVERY_MODE),
    Attack("unshare-pid-and-user", "syscalls", (("first", refused("call(libc.unshare, 0x30000000)", "unshare(NEWPID|NEWUSER)")),), blocked, EVERY_MODE),
    Attack("clone-with-new-user-namespace", "syscalls", (("first", PRELUDE + f"""
result, error = syscall({NR.get("clone", -1)}, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
if result == 0:
    os._exit(0)
if result > 0:
    os.waitpid(result, 0)
verdict(result > 0, f"clone gave {{result}} {{error}}")
"""),), blocked, EVERY_MODE),
    Attack("clone3-with-new-user-namespace", "syscalls", (("first", PRELUDE + f"""
arguments = ctypes.create_string_buffer(struct.pack("=11Q", 0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0), 88)
result, error = syscall({NR.get("clone3", -1)}, arguments, 88)
if result == 0:
    os._exit(0)
if result > 0:
    os.waitpid(result, 0)
verdict(result > 0, f"clone3 gave {{result}} {{error}}")
"""),), blocked, EVERY_MODE),
    Attack("setns-into-the-workers-namespaces", "syscalls", (("first", PRELUDE + """
joined = []
for name in ("mnt", "net", "pid", "user", "ipc"):
    for pid in ("1", str(os.getppid()), "self"):
        try:
            descriptor = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY)
        except OSError:
            continue
        if libc.setns(descriptor, 0) == 0:
            joined.append(f"{pid}/{name}")
verdict(bool(joined), joined or "no setns allowed")
"""),), blocked, EVERY_MODE),
    Attack("mount-a-tmpfs", "syscalls", (("first", refused('call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None)', "mount")),), blocked, EVERY_MODE),
    Attack("fsopen-tmpfs", "syscalls", (("first", refused(f'syscall({NR.get("fsopen", -1)}, b"tmpfs", 0)', "fsopen")),), blocked, EVERY_MODE),
    Attack("open-tree-clone-of-root", "syscalls", (("first", refused(f'syscall({NR.get("open_tree", -1)}, -100, b"/", 1)', "open_tree")),), blocked, EVERY_MODE),
    Attack("chroot", "syscalls", (("first", refused('call(libc.chroot, b"/tmp")', "chroot")),), blocked, EVERY_MODE),
    Attack("ptrace-the-worker", "syscalls", (("first", refused("call(libc.ptrace, ctypes.c_long(16), ctypes.c_long(os.getppid()), None, None)", "PTRACE_ATTACH")),), blocked, EVERY_MODE),
    Attack("ptrace-own-child", "syscalls", (("first", PRELUDE + CHILD_THAT_WAITS + """
result, error = call(libc.ptrace, ctypes.c_long(16), ctypes.c_long(child), None, None)
os.kill(child, 9)
verdict(result != -1, f"PTRACE_ATTACH of its own child: {result} {error}")
"""),), blocked, EVERY_MODE),
    Attack("process-vm-readv-own-child", "syscalls", (("first", PRELUDE + CHILD_THAT_WAITS + """
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]
target = ctypes.create_string_buffer(32)
local, remote = IoVec(ctypes.addressof(target), 32), IoVec(ctypes.addressof(buffer), 32)
result, error = call(libc.process_vm_readv, child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
os.kill(child, 9)
verdict(result > 0, f"process_vm_readv: {result} {error}")
"""),), blocked, EVERY_MODE),
    Attack("pidfd-getfd-from-the-worker", "syscalls", (("first", PRELUDE + f"""
pidfd, error = syscall({NR.get("pidfd_open", -1)}, os.getppid(), 0)
stolen = []
if pidfd != -1:
    for target in range(64):
        result, error = syscall({NR.get("pidfd_getfd", -1)}, pidfd, target, 0)
        if result != -1:
            stolen.append(target)
verdict(bool(stolen), stolen or f"nothing stolen ({{error}})")
"""),), blocked, EVERY_MODE),
    Attack("bpf-map-create", "syscalls", (("first", PRELUDE + f"""
attributes = ctypes.create_string_buffer(struct.pack("=IIII", 2, 4, 4, 1), 128)  # BPF_MAP_TYPE_ARRAY
result, error = syscall({NR.get("bpf", -1)}, 0, attributes, 128)  # BPF_MAP_CREATE
verdict(result != -1, f"bpf: {{result}} {{error}}")
"""),), blocked, EVERY_MODE),
    Attack("perf-event-open-on-itself", "syscalls", (("first", PRELUDE + f"""
attributes = ctypes.create_string_buffer(bytes({PERF_ATTR}), 112)  # software cpu clock, user space only
result, error = syscall({NR.get("perf_event_open", -1)}, attributes, 0, -1, -1, 0)
verdict(result != -1, f"perf_event_open: {{result}} {{error}}")
"""),), blocked, EVERY_MODE),
    Attack("userfaultfd-user-mode", "syscalls", (("first", refused(f'syscall({NR.get("userfaultfd", -1)}, 1)', "userfaultfd(UFFD_USER_MODE_ONLY)")),), blocked, EVERY_MODE),
    Attack("io-uring-setup", "syscalls", (("first", refused(f'syscall({NR.get("io_uring_setup", -1)}, 4, ctypes.create_string_buffer(120))', "io_uring_setup")),), blocked, EVERY_MODE),
    Attack("keyctl-user-keyring", "syscalls", (("first", refused(f'syscall({NR.get("keyctl", -1)}, 0, -4, 0)', "KEYCTL_GET_KEYRING_ID")),), blocked, EVERY_MODE),
    Attack("kexec-load", "syscalls", (("first", refused(f'syscall({NR.get("kexec_load", -1)}, 0, 0, None, 0)', "kexec_load")),), blocked, EVERY_MODE),
    Attack("init-module", "syscalls", (("first", refused('call(libc.init_module, None, ctypes.c_ulong(0), b"")', "init_module")),), blocked, EVERY_MODE),
    Attack("personality-without-aslr", "syscalls", (("first", PRELUDE + """
result, error = call(libc.personality, ctypes.c_ulong(0x0040000))  # ADDR_NO_RANDOMIZE
current = libc.personality(ctypes.c_ulong(0xFFFFFFFF))
verdict(current & 0x0040000 != 0, f"personality: {result} {error}, now {current:#x}")
"""),), blocked, EVERY_MODE),
    Attack("socket-vsock-to-the-vm-host", "syscalls", (("first", refused("call(libc.socket, 40, 1, 0)", "socket(AF_VSOCK)")),), blocked, EVERY_MODE),
    Attack("socket-kernel-crypto", "syscalls", (("first", refused("call(libc.socket, 38, 5, 0)", "socket(AF_ALG)")),), blocked, EVERY_MODE),
    Attack("syslog-read-the-kernel-log", "syscalls", (("first", refused("call(libc.klogctl, 3, ctypes.create_string_buffer(4096), 4096)", "klogctl(SYSLOG_ACTION_READ_ALL)")),), blocked, EVERY_MODE),
    Attack("ioperm", "syscalls", (("first", refused("call(libc.ioperm, ctypes.c_ulong(0x80), ctypes.c_ulong(1), 1)", "ioperm")),), blocked, EVERY_MODE, machine="x86_64"),
    Attack("iopl", "syscalls", (("first", refused("call(libc.iopl, 3)", "iopl")),), blocked, EVERY_MODE, machine="x86_64"),
    Attack("x32-abi-system-call", "syscalls", (("first", PRELUDE + f"""
result, error = syscall(0x40000000 | {NR.get("getpid", -1)})
verdict(result == os.getpid(), f"x32 getpid: {{result}} {{error}}")
"""),), blocked, EVERY_MODE, machine="x86_64"),
    Attack("i386-abi-int-0x80", "syscalls", (("first", PRELUDE + """
libc.mmap.restype = ctypes.c_void_p
page = libc.mmap(None, ctypes.c_size_t(4096), 7, 0x22, -1, ctypes.c_long(0))  # rwx, MAP_PRIVATE | MAP_ANONYMOUS
ctypes.memmove(page, bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]), 8)  # mov eax, 20 (i386 getpid); int 0x80; ret
result = ctypes.CFUNCTYPE(ctypes.c_int)(page)()
verdict(result == os.getpid(), f"i386 getpid gave {result}")
"""),), blocked_or_killed, EVERY_MODE, machine="x86_64"),
]  # fmt: skip


# ---------------------------------------------------------------- the attacks: the status pipe


def status_program(body: str) -> tuple[tuple[str, str], ...]:
    return (("first", PRELUDE + body),)


MEMORY_REPORT = json.dumps({"type": "MemoryError", "errno": None, "summary": "MemoryError"})
STATUS_ATTACKS = [
    Attack("status-junk", "status", status_program('os.write(3, b"not json at all")\n'), tampered, EVERY_MODE),
    Attack("status-json-list", "status", status_program('os.write(3, b"[1, 2]")\n'), tampered, EVERY_MODE),
    Attack("status-missing-fields", "status", status_program('os.write(3, b\'{"type": "MemoryError"}\')\n'), tampered, EVERY_MODE),
    Attack("status-wrong-field-types", "status", status_program(
        'os.write(3, b\'{"type": "MemoryError", "errno": "12", "summary": 5}\')\nsys.exit(1)\n'), tampered, EVERY_MODE),
    Attack("status-fake-memory-error-then-success", "status", status_program(f"os.write(3, {MEMORY_REPORT.encode()!r})\nprint('fine')\n"), tampered, EVERY_MODE),
    Attack("status-fake-memory-error-then-raise", "status", status_program(
        f"os.write(3, {MEMORY_REPORT.encode()!r})\nraise ValueError('the real error')\n"), tampered, EVERY_MODE),
    Attack("status-huge-write", "status", status_program('os.set_blocking(3, False)\ntry:\n    os.write(3, b"{" * 200000)\nexcept OSError:\n    pass\n'), tampered, EVERY_MODE),
    Attack("status-deep-json", "status", status_program('os.write(3, b"[" * 4000 + b"]" * 4000)\nsys.exit(1)\n'), tampered, EVERY_MODE),
    Attack("status-every-descriptor", "status", status_program(f"""
for descriptor in range(256):
    try:
        os.write(descriptor, {MEMORY_REPORT.encode()!r})
    except OSError:
        pass
"""), tampered, EVERY_MODE),
    Attack("status-reopened-through-proc", "status", status_program(f"""
try:
    with open("/proc/self/fd/3", "wb") as pipe:
        pipe.write({MEMORY_REPORT.encode()!r})
except OSError as error:  # the pipe belongs to the worker's uid
    verdict(False, error)
"""), tampered_or_refused, EVERY_MODE),
    Attack("status-grandchild-writes-late", "status", status_program(f"""
if os.fork() == 0:
    time.sleep(0.3)  # after its parent, the call, has exited
    os.write(3, {MEMORY_REPORT.encode()!r})
    os._exit(0)
print("parent done")
"""), not_memory, EVERY_MODE),
    Attack("status-grandchild-writes-first", "status", status_program(f"""
child = os.fork()
if child == 0:
    os.write(3, {MEMORY_REPORT.encode()!r})
    os._exit(0)
os.waitpid(child, 0)
print("parent done")
"""), tampered, EVERY_MODE),
    Attack("status-closed-descriptors", "status", status_program("os.closerange(0, 5)\n"), ok_and_unharmed, EVERY_MODE),
    Attack("status-fake-reply-on-stdout", "status", status_program(
        'print(json.dumps({"infra": "faked"}))\nprint(json.dumps({"isolation": {}}))\n'), ok_and_unharmed, EVERY_MODE),
    Attack("status-signal-without-a-name", "status", status_program("os.kill(os.getpid(), 40)\n"),
           the_programs_own_fault("killed"), EVERY_MODE),
    Attack("status-exception-that-cannot-print", "status", status_program(
        "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()\n"),
        the_programs_own_fault("exception"), EVERY_MODE),
    Attack("status-oserror-with-a-text-errno", "status", status_program("raise OSError('not a number', 'message')\n"),
           the_programs_own_fault("exception"), EVERY_MODE),
    # Contained, not prevented: the report is written by the call's own process, so a program can
    # always say it ended in MemoryError (as `raise MemoryError` does). What it cannot do is make its
    # failure anything but its own: the call stays a tool_error, never ok, timeout or infra.
    Attack("status-well-formed-fake-through-a-saved-descriptor", "status", status_program(f"""
saved = os.dup(3)
os.dup2(os.open("/dev/null", os.O_WRONLY), 3)
os.write(saved, {MEMORY_REPORT.encode()!r})
raise ValueError("the real error")
"""), the_programs_own_fault("memory"), EVERY_MODE, contained=True),
]  # fmt: skip


# ---------------------------------------------------------------- the attacks: files


def write_program(path: str) -> str:
    return PRELUDE + f"""
try:
    with open({path!r}, "w") as handle:
        handle.write("escaped")
    verdict(True, "wrote {path}")
except OSError as error:
    verdict(False, error)
"""


def read_program(path: str) -> str:
    return PRELUDE + f"""
try:
    verdict({SECRET!r} in open({path!r}).read(), "read {path}")
except OSError as error:
    verdict(False, error)
"""


def read_bait(name: str) -> Judge:
    return and_then(needs_bait(f"secret-{name}"), blocked)


FILE_ATTACKS = [
    *[Attack(f"write-{name}", "filesystem", (("first", write_program(path)),), and_then(blocked, no_host_file(path)))
      for name, path in WRITE_TARGETS.items()],
    Attack("write-the-interpreters-folder", "filesystem", (("first", PRELUDE + f"""
path = os.path.join(sys.prefix, "{BAIT}")
try:
    open(path, "w").write("escaped")
    verdict(True, path)
except OSError as error:
    verdict(False, error)
"""),), and_then(blocked, no_host_file(os.path.join(sys.prefix, BAIT)))),
    *[Attack(f"read-secret-in-{name}", "filesystem", (("first", read_program(str(path))),), read_bait(name))
      for name, path in SECRETS.items()],
    Attack("read-through-proc-pid-root", "filesystem", (("first", read_program(host_pid_root(SECRETS["var-tmp"]))),), read_bait("var-tmp")),
    Attack("read-through-proc-1-root", "filesystem", (("first", read_program(f"/proc/1/root{SECRETS['var-tmp']}")),), read_bait("var-tmp")),
    Attack("read-through-a-symlink", "filesystem", (("first", PRELUDE + f"""
os.symlink({str(SECRETS["var-tmp"])!r}, "link")
try:
    verdict({SECRET!r} in open("link").read(), "read through the link")
except OSError as error:
    verdict(False, error)
"""),), read_bait("var-tmp")),
    Attack("host-only-folders-are-absent", "filesystem", (("first", PRELUDE + """
present = sorted(set(os.listdir("/")) & {"home", "boot", "mnt", "opt", "srv", "media", "snap"})
extra = sorted(os.listdir("/var")) + sorted(os.listdir("/var/tmp")) + sorted(os.listdir("/run"))
verdict(bool(present) or extra != ["tmp"], f"host folders {present}, /var, /var/tmp and /run hold {extra}")
"""),), blocked),
    Attack("reopen-a-read-only-folder-through-proc-self-fd", "filesystem", (("first", PRELUDE + f"""
folder = os.open("/usr", os.O_RDONLY | os.O_DIRECTORY)
try:
    os.close(os.open(f"/proc/self/fd/{{folder}}/{BAIT}", os.O_CREAT | os.O_WRONLY, 0o644))
    verdict(True, "created a file in /usr")
except OSError as error:
    verdict(False, error)
"""),), and_then(blocked, no_host_file(f"/usr/{BAIT}"))),
    Attack("the-workers-descriptors-through-proc", "filesystem", (("first", PRELUDE + """
opened = []
for descriptor in range(64):
    try:
        os.close(os.open(f"/proc/{os.getppid()}/fd/{descriptor}", os.O_WRONLY))
        opened.append(descriptor)
    except OSError:
        pass
verdict(bool(opened), opened or "none of the worker's descriptors opens")
"""),), blocked),
    Attack("raw-devices", "filesystem", (("first", PRELUDE + """
opened = []
for path in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/vda", "/dev/sda", "/dev/nvme0n1",
             "/dev/vsock", "/dev/net/tun", "/dev/fuse", "/dev/userfaultfd", "/dev/kvm", "/dev/console", "/dev/ptmx"):
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        opened.append(path)
    except OSError:
        pass
verdict(bool(opened), opened or "no device beyond null, zero, full, random and urandom")
"""),), blocked),
    Attack("mknod-a-memory-device", "filesystem", (("first", PRELUDE + """
try:
    os.mknod("mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1))
    verdict(len(open("mem", "rb").read(16)) == 16, "made and read /dev/mem's twin")
except OSError as error:
    verdict(False, error)
"""),), blocked),
    Attack("write-proc-sys-and-cgroups", "filesystem", (("first", PRELUDE + """
written = []
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/sys/fs/cgroup/release_agent",
             "/sys/kernel/uevent_helper", "/proc/sysrq-trigger"):
    try:
        with open(path, "w") as handle:
            handle.write("|/tmp/escape")
        written.append(path)
    except OSError:
        pass
verdict(bool(written), written or "nothing written")
"""),), blocked),
    Attack("setuid-binaries", "filesystem", (("first", PRELUDE + """
import subprocess
tried, gained = [], []
for command in (["/usr/bin/unshare", "--user", "--map-root-user", "true"], ["/usr/bin/mount", "-t", "tmpfs", "none", "/tmp"],
                ["/usr/bin/nsenter", "--target", "1", "--mount", "true"], ["/usr/sbin/capsh", "--caps=cap_sys_admin+eip", "--", "-c", "true"],
                ["/usr/bin/su", "-c", "true"]):
    if os.path.exists(command[0]) and os.stat(command[0]).st_mode & stat.S_ISUID:
        tried.append(command[0])
        if subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, timeout=3).returncode == 0:
            gained.append(command[0])
if tried:
    verdict(bool(gained), gained or f"no privilege from {tried}")
else:
    print("NOTHING: no setuid binary to try")
"""),), blocked),
]  # fmt: skip


def setuid_present(runs: list[dict[str, Any]], context: Context) -> None:
    if "NOTHING:" in runs[-1].get("output", ""):
        pytest.skip("no setuid binary on this machine to try")


# ---------------------------------------------------------------- the attacks: limits


def spawn_sleepers(marker: str, body: str) -> str:
    return PRELUDE + f"MARKER = {marker!r}\n" + body


RESOURCE_ATTACKS = [
    Attack("fork-bomb", "resources", (("first", spawn_sleepers(MARKERS["fork-bomb"], """
started = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execvp("sleep", ["sleep", MARKER])
    started += 1
verdict(started > %d, f"{started} processes started")
""" % LIMITS.max_processes)),), and_then(with_a_process_limit, blocked, no_survivor(MARKERS["fork-bomb"])), EVERY_MODE),
    Attack("grandchild-leaves-the-session", "resources", (("first", spawn_sleepers(MARKERS["setsid"], """
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", MARKER])
    os._exit(0)
os.waitpid(child, 0)
verdict(False, "a daemon is left; the host checks it died with the call")
""")),), and_then(with_a_call_cgroup, blocked, no_survivor(MARKERS["setsid"])), EVERY_MODE),
    Attack("grandchild-ignores-hangup-and-term", "resources", (("first", spawn_sleepers(MARKERS["nohup"], """
import signal
if os.fork() == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execvp("sleep", ["sleep", MARKER])
verdict(False, "a process of its own group is left; the host checks it died with the call")
""")),), and_then(blocked, no_survivor(MARKERS["nohup"]))),
    # CPU time spread over processes none of which passes the limit alone; the main process waits
    # long past the point where the call as a whole has used it up, then says it ran on.
    Attack("cpu-in-a-detached-daemon", "resources", ((ONE_CPU_SECOND, PRELUDE + """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            pass
    os._exit(0)
time.sleep(8)
verdict(True, "a detached daemon spun for 8 s past the call's CPU limit")
"""),), and_then(with_a_call_cgroup, stopped_for_cpu), EVERY_MODE),
    Attack("cpu-in-children-the-kernel-reaps", "resources", ((ONE_CPU_SECOND, PRELUDE + """
import signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # their CPU time is then nobody's to count
read, write = os.pipe()
for n in range(6):
    try:
        child = os.fork()
    except OSError:  # nobody's process count is shared with every other call
        break
    if child == 0:
        start = time.thread_time()
        while time.thread_time() - start < 0.9:
            pass
        os._exit(0)
os.close(write)
os.read(read, 1)  # until every child is gone
verdict(n > 1, f"{n} children used 0.9 s of CPU each, unreaped, and the call ran on")
"""),), and_then(with_a_call_cgroup, stopped_for_cpu), EVERY_MODE),
    Attack("memory-bomb", "resources", (("first", PRELUDE + """
try:
    hoard = bytearray(1 << 30)
    verdict(True, "allocated 1 GB")
except MemoryError:
    verdict(False, "MemoryError")
"""),), blocked, EVERY_MODE),
    Attack("memfd-memory-past-the-limit", "resources", (("first", PRELUDE + """
held, detail = 0, "done"
try:
    for _ in range(400):  # 1 MB per file (the file-size limit), 400 files: past the 256 MB of memory
        held += os.write(os.memfd_create("hoard"), b"x" * (1 << 20))
except OSError as error:
    detail = error
verdict(held > 256 << 20, f"{held >> 20} MB held in memfd files ({detail})")
"""),), blocked, EVERY_MODE),
    Attack("fill-tmp-and-dev-shm", "resources", (("first", PRELUDE + """
written = 0
for folder in ("/tmp", "/dev/shm"):
    for n in range(32):
        try:
            with open(f"{folder}/fill-{n}", "wb") as handle:
                written += handle.write(b"x" * (1 << 20))
        except OSError:
            break
verdict(written > %d << 20, f"{written >> 20} MB written to /tmp and /dev/shm together")
""" % LIMITS.folder_mb),), blocked),
    Attack("file-size-by-writing", "resources", (("first", PRELUDE + """
try:
    open("big", "wb").write(b"x" * (2 << 20))
    verdict(True, "wrote 2 MB")
except OSError as error:
    verdict(False, error)
"""),), blocked, EVERY_MODE),
    Attack("file-size-by-truncate", "resources", (("first", PRELUDE + """
try:
    with open("sparse", "wb") as handle:
        handle.truncate(1 << 30)
    verdict(True, "a 1 GB file")
except OSError as error:
    verdict(False, error)
"""),), blocked, EVERY_MODE),
]  # fmt: skip


ATTACKS: list[Attack] = [*SOCKET_ATTACKS, *ipc_attacks(), *SYSCALL_ATTACKS, *STATUS_ATTACKS, *FILE_ATTACKS, *RESOURCE_ATTACKS]
ATTACKS = [
    Attack(a.id, a.kind, a.steps, and_then(setuid_present, a.judge), a.modes, a.machine, a.contained)
    if a.id == "setuid-binaries" else a
    for a in ATTACKS
]  # fmt: skip
CASES = [(mode, attack) for attack in ATTACKS for mode in MODES if mode in attack.modes]


# ---------------------------------------------------------------- running a mode's batch


def run_steps(steps: list[tuple[str, str, str]], isolate: bool, cpu_per_process: bool = False) -> dict[str, Any]:
    """Run (attack id, sandbox, program) steps in order; the isolation and every run, by attack id.

    A run that makes PythonSandbox.run raise is recorded as such: that is a finding too.
    `cpu_per_process`: where no cgroup can hold a call's processes, run the batch anyway.
    """
    sandboxes: dict[str, PythonSandbox] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for attack_id, where, program in steps:
            if where not in sandboxes:
                limits = SANDBOX_LIMITS.get(where, LIMITS)
                sandboxes[where] = PythonSandbox(limits, isolate=isolate, cpu_per_process=cpu_per_process)
            try:
                run = sandboxes[where].run(program)
                record = {"status": run.status, "error": run.error, "output": run.output, "observation": run.observation()}
            except Exception as error:
                record = {"raised": f"{type(error).__name__}: {error}", "output": "", "observation": ""}
            runs.setdefault(attack_id, []).append(record)
        isolation = sandboxes["first"].isolation.__dict__ if sandboxes else {}
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()
    return {"isolation": isolation, "runs": runs}


RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("escapes", sys.argv[1])
module = sys.modules["escapes"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.run_steps(json.load(sys.stdin), True)))
"""


def batch(mode: str) -> list[tuple[str, str, str]]:
    attacks = [attack for attack in ATTACKS if mode in attack.modes and attack.machine in ("", MACHINE)]
    return [(attack.id, where, program) for attack in attacks for where, program in attack.steps]


def run_unprivileged(steps: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The batch in a sandbox started by uid 65534 with the bait's group, through setpriv."""
    from test_sandbox import delegated_cgroup, python_for_nobody

    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run a sandbox as an unprivileged user")
    python = python_for_nobody()
    if python is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that uid {NOBODY} can run")
    source = str(Path(toolpolicy.__file__).parents[1])  # the sources this test imported
    site = next(path for path in sys.path if path.endswith("site-packages"))
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={BAIT_GROUP}",
               python, "-c", RUNNER, __file__]  # fmt: skip
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{source}:{site}", "LANG": "C.UTF-8"}
    with delegated_cgroup(NOBODY) as enter:  # as systemd delegates one to a user's services
        done = subprocess.run(command, input=json.dumps(steps), capture_output=True, text=True, cwd="/", env=environment,
                              timeout=300, preexec_fn=enter)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def bait() -> Iterator[Bait]:
    placed = place_bait()
    try:
        yield placed
    finally:
        remove_bait(placed)


@pytest.fixture(scope="module")
def outcomes(bait: Bait) -> Callable[[str], dict[str, Any]]:
    """mode -> {"isolation", "runs"}: the mode's whole batch, run once, on first use."""
    done: dict[str, dict[str, Any]] = {}

    def get(mode: str) -> dict[str, Any]:
        if mode not in done:
            done[mode] = run_mode(mode)
        result = done[mode]
        if result.get("skip"):
            pytest.skip(result["skip"])
        return result

    return get


def run_mode(mode: str) -> dict[str, Any]:
    root = os.geteuid() == 0
    if mode == "none":  # a non-root call runs as the uid of its cgroup there, so none holds it (documented)
        return run_steps(batch(mode), isolate=False, cpu_per_process=not root)
    if mode == "root" and not root:
        return {"skip": "the root column needs a sandbox started as root"}
    if mode == "user-namespace" and root:
        try:
            result = run_unprivileged(batch(mode))
        except pytest.skip.Exception as skipped:
            return {"skip": str(skipped)}
    else:
        try:
            result = run_steps(batch(mode), isolate=True)
        except RuntimeError as error:  # no cgroup to hold a call's processes: the sandbox refuses to start
            return {"skip": str(error)}
    if result["isolation"].get("method") != mode:
        return {"skip": f"this machine gives {result['isolation'].get('method')!r}, not {mode!r}: {result['isolation'].get('note')}"}
    return result


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize(("mode", "attack"), CASES, ids=[f"{mode}-{attack.id}" for mode, attack in CASES])
def test_escape_fails(mode: str, attack: Attack, outcomes: Callable[[str], dict[str, Any]], bait: Bait) -> None:
    if attack.machine and attack.machine != MACHINE:
        pytest.skip(f"an attack on {attack.machine} only; this machine is {MACHINE}")
    result = outcomes(mode)
    runs = result["runs"][attack.id]
    assert len(runs) == len(attack.steps)
    attack.judge(runs, Context(mode, result["isolation"], bait))


def test_the_suite_covers_every_class() -> None:
    """At least 40 attacks, several per class; the counts are printed for the record."""
    kinds = {kind: sum(1 for attack in ATTACKS if attack.kind == kind) for kind in dict.fromkeys(a.kind for a in ATTACKS)}
    per_mode = {mode: sum(1 for case_mode, _ in CASES if case_mode == mode) for mode in MODES}
    contained = [attack.id for attack in ATTACKS if attack.contained]
    print(f"\n{len(ATTACKS)} attacks by class {kinds}; cases per mode {per_mode}; contained, not blocked: {contained}")
    assert len(ATTACKS) >= 40 and len({attack.id for attack in ATTACKS}) == len(ATTACKS)
    assert all(count >= 3 for count in kinds.values()), kinds


def test_a_user_namespace_names_the_groups_it_keeps(outcomes: Callable[[str], dict[str, Any]]) -> None:
    """An unprivileged process cannot drop its supplementary groups; the isolation says which stay."""
    result = outcomes("user-namespace")
    if os.geteuid() != 0 and not (set(os.getgroups()) - {os.getgid()}):
        pytest.skip("this user has no supplementary group to keep")
    expected = str(BAIT_GROUP) if os.geteuid() == 0 else ""
    assert "supplementary groups" in result["isolation"]["note"] and expected in result["isolation"]["note"]
