"""The process inside the Python sandbox: it isolates itself once, then runs calls one at a time.

`toolpolicy.tools.sandbox` starts it by path, `python -I sandbox_worker.py CONFIG_JSON`,
so it imports the standard library only: every call is a fork of this process, and
what the call's code finds already imported is this file's small set of modules.

Once, at start, on Linux when namespaces are allowed (`isolate`):
  1. unshare a mount, network, PID and IPC namespace (in a new user namespace when
     not root, mapping the caller's uid to 0 inside it);
  2. fork: the child is process 1 of the new PID namespace and serves the calls; the
     parent only waits. The host kills the parent; PR_SET_PDEATHSIG then kills the
     server, and the death of a namespace's process 1 kills every process in it;
  3. build a new root on a tmpfs: the host's system folders (/usr, /etc, /lib...) and
     the interpreter's folders bound in, a /dev of five harmless devices, a /proc and
     a /sys of these namespaces, empty /tmp, /run and /var/tmp; make all of it
     read-only and nosuid, pivot into it and detach the host's tree. Nothing else of
     the host is reachable by path: no home folder, and no Unix socket of the host's
     (they live under /run, /var, /tmp and /dev/shm).

Per call: the call's processes were forked while the worker was idle (`fork_child`).
With namespaces the worker's child is process 1 of a PID namespace of the call's own,
nested in the worker's, with its own mount namespace (for a /proc of that PID
namespace) and IPC namespace; it forks the call's process, waits for it and relays its
wait status on a pipe (`_serve_as_call_init`). The call cannot name the worker, so
nothing it does to the processes it can name (the init included) fails the worker. The
call's process has its own session, has set rlimits, dropped privileges and installed
the system-call filter, and waits for its code on a pipe. `run_call` sends the code,
keeps the first `max_output_chars` of stdout and stderr (one pipe) and counts the
rest; when the child exits or the wall clock runs out it kills every other process of
the call (kill(-1) from process 1, which reaches the nested namespaces too, or the
child's process group without namespaces), reaps them and reports. After the reply the worker replaces the call's tmpfs (/tmp
and /dev/shm) and forks the next child, off the latency path.

The call's CPU time is its cgroup's (`CallCgroup`): the host made a cgroup folder for
this worker, which opens it before isolating itself and moves into its "worker"
cgroup; the first process of each call is forked into the "call" cgroup beside it, so
every process and thread of the call is born there. While the call runs, the worker
reads the cgroup's CPU time whenever the call could have passed its limit
(`next_cpu_check`) and stops the call once it has; the report gives the total, exited
processes included, and a failed reading makes the call an infra error.

How a call ended comes from what the worker sees itself (exit status, signal, CPU
time, the wall clock); with namespaces the exit status or signal is the one the call's
init saw, relayed on a pipe only the init holds (a call that keeps its init from
relaying was killed: its init's end killed it). The exception type the call's process writes on its status
pipe is only a hint, believed when it is well formed and the process then exited with
status 1; anything else on that pipe is reported as the program's tampering.

Protocol, one JSON object per line: the worker writes {"isolation": {...}} once, then
for each {"code": "..."} it reads, one report (`run_call`) or {"infra": "..."}.
"""

from __future__ import annotations

import builtins
import codecs
import ctypes
import errno
import fcntl
import functools
import gc
import json
import linecache
import os
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import types
import unicodedata
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
SHARED_MEMORY_FOLDER = "/dev/shm"
READ_BYTES = 65536
DRAIN_SECONDS = 1.0  # after the kill, how long the output pipe may take to close
STATUS_FD = 3  # where a call's child writes the exception that ended it
CODE_FD = 4  # where it reads its code, until end of file
MAX_SUMMARY_CHARS = 500
MAX_STATUS_BYTES = 8192  # a report of MAX_SUMMARY_CHARS, each escaped to 12 bytes, fits
MAX_TYPE_CHARS = 100
MAX_FD = os.sysconf("SC_OPEN_MAX") if sys.platform != "linux" else 1 << 20  # where closing "all the rest" stops
MAX_ERRNO = 4095
"""The largest errno a report may carry (Linux's are below 200; the kernel reserves up to 4095)."""

# The call's file system: the host folders it sees (read-only), its devices and its empty folders.
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
DEVICE_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))
EMPTY_FOLDERS = ("/tmp", "/run", "/var/tmp", "/proc", "/sys")
BUILD_ROOT = "/tmp"  # the new root is assembled on a tmpfs here (in this mount namespace only), then becomes /
CALL_STAGING = "/run"  # a call's tmpfs is mounted here just long enough to bind its two folders out of it
HOST_COPIES = "/.host"
"""Where the new root also holds the interpreter folders that lie under /tmp or /dev/shm (a
virtual environment in /tmp): each call's own tmpfs covers their paths, so every call's
folders get them bound back from here (`_mount_call_folders`)."""

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
SYS_MOUNT_SETATTR = 442  # the same number on every Linux architecture but alpha
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 24, 38
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2
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


class FilterProgram(ctypes.Structure):
    """struct sock_fprog: a classic BPF program, as PR_SET_SECCOMP takes it."""

    _fields_ = [("length", ctypes.c_ushort), ("instructions", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    """Raise OSError for a failed libc call (result -1), naming what was attempted."""
    if result == -1:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


# ---------------------------------------------------------------- the system-call filter

# What ordinary Python programs need: the calls the standard library makes for files,
# threads, subprocesses, sockets, mmap, multiprocessing, sqlite3, zoneinfo and asyncio
# (tests/test_sandbox.py runs a program of each kind under the filter), and the calls of
# the same kinds beside them. Names an architecture lacks (aarch64 has only the *at, p*
# and 2 variants of open, stat, poll, pipe, dup2...) are skipped for it.
ALLOWED_SYSCALLS = (
    # files and descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup", "dup2", "dup3", "fcntl",
    "flock", "fsync", "fdatasync", "ftruncate", "truncate", "fallocate", "fadvise64", "sendfile",
    "copy_file_range", "splice", "tee", "ioctl", "pipe", "pipe2",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    # names, metadata and folders
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat",
    "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
    "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "utime", "utimes", "futimesat",
    "utimensat", "umask", "mknod", "mknodat",  # mknod: FIFOs (a device needs CAP_MKNOD, and the tmpfs is nodev)
    "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    # memory (RLIMIT_AS counts every mapping)
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore", "membarrier",
    # threads and the C library's start of a process
    "futex", "futex_waitv", "set_robust_list", "set_tid_address", "rseq", "gettid", "arch_prctl", "prctl",
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam",
    "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "sched_getattr", "sched_setattr", "getpriority", "setpriority", "getcpu",
    # processes: a call's own, in a PID namespace where no other is named
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill", "tkill", "tgkill",
    "pidfd_open", "pidfd_send_signal", "restart_syscall", "getpid", "getppid", "getpgid", "setpgid", "getpgrp",
    "getsid", "setsid",
    # identity: queries, and the changes the kernel refuses a process without capabilities
    "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capget",
    # signals and timers
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "pause", "alarm", "getitimer", "setitimer",
    "signalfd", "signalfd4", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
    "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime", "eventfd", "eventfd2",
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "times",
    # waiting on descriptors
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2",
    # sockets (socket and socketpair themselves are checked by family)
    "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "sendto", "recvfrom",
    "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "setsockopt", "getsockopt",
    # the machine and the process's own limits and usage
    "uname", "sysinfo", "getrusage", "getrlimit", "setrlimit", "prlimit64", "getrandom",
)  # fmt: skip
# POSIX message queues: allowed only in an IPC namespace of the call's own, which they die with.
MESSAGE_QUEUE_SYSCALLS = ("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr")
# clone flags that create namespaces: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
NAMESPACE_CLONE_FLAGS = 0x7E020000
# personality(2) values a program may set: PER_LINUX, PER_LINUX32, their UNAME26 variants, and the query.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# Socket families: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK. The rest (AF_VSOCK reaches a VM's host
# whatever the network namespace; AF_ALG, AF_PACKET...) are kernel surface a program has no use for.
SOCKET_FAMILIES = (1, 2, 10, 16)

# name: (x86_64, generic). Numbers from the kernel's headers: asm/unistd_64.h, and the generic
# table (asm-generic/unistd.h) that aarch64 uses; None where the architecture has no such call.
# Besides the calls above: those whose first argument the filter checks, clone3 (left out on
# purpose, see `syscall_filter`), and the two the worker makes itself (pivot_root, unshare).
SYSCALL_NUMBERS = {
    "read": (0, 63), "write": (1, 64), "open": (2, None), "close": (3, 57), "stat": (4, None), "fstat": (5, 80),
    "lstat": (6, None), "poll": (7, None), "lseek": (8, 62), "mmap": (9, 222), "mprotect": (10, 226),
    "munmap": (11, 215), "brk": (12, 214), "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135),
    "rt_sigreturn": (15, 139), "ioctl": (16, 29), "pread64": (17, 67), "pwrite64": (18, 68), "readv": (19, 65),
    "writev": (20, 66), "access": (21, None), "pipe": (22, None), "select": (23, None), "sched_yield": (24, 124),
    "mremap": (25, 216), "msync": (26, 227), "mincore": (27, 232), "madvise": (28, 233), "dup": (32, 23),
    "dup2": (33, None), "pause": (34, None), "nanosleep": (35, 101), "getitimer": (36, 102), "alarm": (37, None),
    "setitimer": (38, 103), "getpid": (39, 172), "sendfile": (40, 71), "socket": (41, 198), "connect": (42, 203),
    "accept": (43, 202), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211), "recvmsg": (47, 212),
    "shutdown": (48, 210), "bind": (49, 200), "listen": (50, 201), "getsockname": (51, 204),
    "getpeername": (52, 205), "socketpair": (53, 199), "setsockopt": (54, 208), "getsockopt": (55, 209),
    "clone": (56, 220), "fork": (57, None), "vfork": (58, None), "execve": (59, 221), "exit": (60, 93),
    "wait4": (61, 260), "kill": (62, 129), "uname": (63, 160), "fcntl": (72, 25), "flock": (73, 32),
    "fsync": (74, 82), "fdatasync": (75, 83), "truncate": (76, 45), "ftruncate": (77, 46), "getdents": (78, None),
    "getcwd": (79, 17), "chdir": (80, 49), "fchdir": (81, 50), "rename": (82, None), "mkdir": (83, None),
    "rmdir": (84, None), "creat": (85, None), "link": (86, None), "unlink": (87, None), "symlink": (88, None),
    "readlink": (89, None), "chmod": (90, None), "fchmod": (91, 52), "chown": (92, None), "fchown": (93, 55),
    "lchown": (94, None), "umask": (95, 166), "gettimeofday": (96, 169), "getrlimit": (97, 163),
    "getrusage": (98, 165), "sysinfo": (99, 179), "times": (100, 153), "getuid": (102, 174), "getgid": (104, 176),
    "setuid": (105, 146), "setgid": (106, 144), "geteuid": (107, 175), "getegid": (108, 177), "setpgid": (109, 154),
    "getppid": (110, 173), "getpgrp": (111, None), "setsid": (112, 157), "setreuid": (113, 145),
    "setregid": (114, 143), "getgroups": (115, 158), "setgroups": (116, 159), "setresuid": (117, 147),
    "getresuid": (118, 148), "setresgid": (119, 149), "getresgid": (120, 150), "getpgid": (121, 155),
    "setfsuid": (122, 151), "setfsgid": (123, 152), "getsid": (124, 156), "capget": (125, 90),
    "rt_sigpending": (127, 136), "rt_sigtimedwait": (128, 137), "rt_sigqueueinfo": (129, 138),
    "rt_sigsuspend": (130, 133), "sigaltstack": (131, 132), "utime": (132, None), "mknod": (133, None),
    "personality": (135, 92), "statfs": (137, 43), "fstatfs": (138, 44), "getpriority": (140, 141),
    "setpriority": (141, 140), "sched_setparam": (142, 118), "sched_getparam": (143, 121),
    "sched_setscheduler": (144, 119), "sched_getscheduler": (145, 120), "sched_get_priority_max": (146, 125),
    "sched_get_priority_min": (147, 126), "sched_rr_get_interval": (148, 127), "prctl": (157, 167),
    "arch_prctl": (158, None), "setrlimit": (160, 164), "gettid": (186, 178), "setxattr": (188, 5),
    "lsetxattr": (189, 6), "fsetxattr": (190, 7), "getxattr": (191, 8), "lgetxattr": (192, 9),
    "fgetxattr": (193, 10), "listxattr": (194, 11), "llistxattr": (195, 12), "flistxattr": (196, 13),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16), "tkill": (200, 130),
    "time": (201, None), "futex": (202, 98), "sched_setaffinity": (203, 122), "sched_getaffinity": (204, 123),
    "epoll_create": (213, None), "getdents64": (217, 61), "set_tid_address": (218, 96),
    "restart_syscall": (219, 128), "fadvise64": (221, 223), "timer_create": (222, 107), "timer_settime": (223, 110),
    "timer_gettime": (224, 108), "timer_getoverrun": (225, 109), "timer_delete": (226, 111),
    "clock_gettime": (228, 113), "clock_getres": (229, 114), "clock_nanosleep": (230, 115), "exit_group": (231, 94),
    "epoll_wait": (232, None), "epoll_ctl": (233, 21), "tgkill": (234, 131), "utimes": (235, None),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184), "mq_getsetattr": (245, 185), "waitid": (247, 95), "inotify_init": (253, None),
    "inotify_add_watch": (254, 27), "inotify_rm_watch": (255, 28), "openat": (257, 56), "mkdirat": (258, 34),
    "mknodat": (259, 33), "fchownat": (260, 54), "futimesat": (261, None), "newfstatat": (262, 79),
    "unlinkat": (263, 35), "renameat": (264, 38), "linkat": (265, 37), "symlinkat": (266, 36),
    "readlinkat": (267, 78), "fchmodat": (268, 53), "faccessat": (269, 48), "pselect6": (270, 72),
    "ppoll": (271, 73), "set_robust_list": (273, 99), "splice": (275, 76), "tee": (276, 77), "utimensat": (280, 88),
    "epoll_pwait": (281, 22), "signalfd": (282, None), "timerfd_create": (283, 85), "eventfd": (284, None),
    "fallocate": (285, 47), "timerfd_settime": (286, 86), "timerfd_gettime": (287, 87), "accept4": (288, 242),
    "signalfd4": (289, 74), "eventfd2": (290, 19), "epoll_create1": (291, 20), "dup3": (292, 24), "pipe2": (293, 59),
    "inotify_init1": (294, 26), "preadv": (295, 69), "pwritev": (296, 70), "rt_tgsigqueueinfo": (297, 240),
    "recvmmsg": (299, 243), "prlimit64": (302, 261), "sendmmsg": (307, 269), "getcpu": (309, 168),
    "sched_setattr": (314, 274), "sched_getattr": (315, 275), "renameat2": (316, 276), "getrandom": (318, 278),
    "execveat": (322, 281), "membarrier": (324, 283), "copy_file_range": (326, 285), "preadv2": (327, 286),
    "pwritev2": (328, 287), "statx": (332, 291), "rseq": (334, 293), "pidfd_send_signal": (424, 424),
    "pidfd_open": (434, 434), "clone3": (435, 435), "close_range": (436, 436), "openat2": (437, 437),
    "faccessat2": (439, 439), "epoll_pwait2": (441, 441), "futex_waitv": (449, 449),
    "unshare": (272, 97), "pivot_root": (155, 41),
}  # fmt: skip
X86_64_SYSCALLS = {name: numbers[0] for name, numbers in SYSCALL_NUMBERS.items()}
GENERIC_SYSCALLS = {name: numbers[1] for name, numbers in SYSCALL_NUMBERS.items() if numbers[1] is not None}


@dataclass(frozen=True)
class Architecture:
    """What the filter needs to know of a CPU architecture."""

    audit_arch: int
    """AUDIT_ARCH_* as seccomp reports it; a system call made through another ABI (i386's int 0x80) is denied."""
    syscalls: dict[str, int]
    x32_bit: int = 0
    """System-call numbers with this bit set are the x32 ABI of x86_64, denied as a foreign ABI."""


ARCHITECTURES = {
    "x86_64": Architecture(0xC000003E, X86_64_SYSCALLS, x32_bit=0x40000000),
    "aarch64": Architecture(0xC00000B7, GENERIC_SYSCALLS),
}

# Classic BPF, as seccomp runs it: opcodes, and offsets into struct seccomp_data.
BPF_OPCODES = {"load": 0x20, "jump": 0x05, "jeq": 0x15, "jge": 0x35, "jset": 0x45, "return": 0x06}
SYSCALL_NUMBER, ARCH, FIRST_ARGUMENT = 0, 4, 16  # the low 32 bits of args[0] on a little-endian CPU
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


def syscall_filter(arch: Architecture, shared_ipc: bool) -> bytes:
    """The seccomp program (struct sock_filter[]) every process of a call runs under: an allow list.

    A system call not on the list fails with ENOSYS, as on a kernel that lacks it. The C
    library and Python fall back from ENOSYS, and only from it, to an older call where
    there is one (clone3 to clone, close_range to close, statx to newfstatat), so new
    calls that a later kernel adds are neither reachable nor fatal; a program that uses
    one directly gets OSError [Errno 38] Function not implemented. clone3 is left out for
    that reason: its flags are in memory the filter cannot read, while clone's are in a
    register. An argument the filter refuses (a clone flag that makes a namespace, an
    unusual personality, a socket family other than SOCKET_FAMILIES) and a system call
    of another ABI (i386's int 0x80, x32) fail with EPERM: the call exists, the request
    is refused, and Python raises an ordinary PermissionError.

    >>> program = syscall_filter(ARCHITECTURES["x86_64"], shared_ipc=False)
    >>> len(program) % 8, struct.unpack_from("=HBBI", program)  # the first instruction loads the arch
    (0, (32, 0, 0, 4))
    """
    numbers = arch.syscalls
    names = ALLOWED_SYSCALLS + (() if shared_ipc else MESSAGE_QUEUE_SYSCALLS)
    allowed = sorted({numbers[name] for name in names if name in numbers})
    steps: list[tuple[Any, ...]] = [("load", ARCH), ("jeq", arch.audit_arch, None, "eperm"), ("load", SYSCALL_NUMBER)]
    if arch.x32_bit:
        steps.append(("jge", arch.x32_bit, "eperm", None))
    steps += [
        ("jeq", numbers["clone"], "clone", None),
        ("jeq", numbers["personality"], "personality", None),
        ("jeq", numbers["socket"], "socket", None),
        ("jeq", numbers["socketpair"], "socket", None),
        ("jump", "allow list"),
        ("label", "clone"), ("load", FIRST_ARGUMENT), ("jset", NAMESPACE_CLONE_FLAGS, "eperm", "allow"),
        ("label", "personality"), ("load", FIRST_ARGUMENT),
        *[("jeq", value, "allow", None) for value in PERSONALITIES], ("jump", "eperm"),
        ("label", "socket"), ("load", FIRST_ARGUMENT),
        *[("jeq", family, "allow", None) for family in SOCKET_FAMILIES], ("jump", "eperm"),
        ("label", "allow"), ("return", RET_ALLOW),
        ("label", "eperm"), ("return", RET_ERRNO | errno.EPERM),
        ("label", "allow list"), *allow_list_steps(allowed),
    ]  # fmt: skip
    return assemble(steps)


def allow_list_steps(numbers: list[int]) -> list[tuple[Any, ...]]:
    """Steps that allow the system-call numbers `numbers` (sorted) and answer ENOSYS to the rest.

    The numbers are taken as runs of consecutive ones, checked in ascending order: above
    the run, on to the next; below it, in the gap before it, ENOSYS; else allowed. Each
    run carries its own two returns, so every jump is a few instructions long, however
    long the list (a BPF conditional jump reaches 255 instructions at most).

    >>> [step[:2] for step in allow_list_steps([3, 4, 9])][:5]
    [('jge', 5), ('jge', 3), ('return', 2147418112), ('label', 'gap 3'), ('return', 327718)]
    """
    steps: list[tuple[Any, ...]] = []
    for low, high in consecutive_runs(numbers):
        steps += [
            ("jge", high + 1, f"above {low}", None), ("jge", low, None, f"gap {low}"), ("return", RET_ALLOW),
            ("label", f"gap {low}"), ("return", RET_ERRNO | errno.ENOSYS), ("label", f"above {low}"),
        ]  # fmt: skip
    return steps + [("return", RET_ERRNO | errno.ENOSYS)]


def consecutive_runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) of each run of consecutive ones.

    >>> consecutive_runs([0, 1, 2, 5, 7, 8])
    [(0, 2), (5, 5), (7, 8)]
    """
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


def assemble(steps: list[tuple[Any, ...]]) -> bytes:
    """Classic BPF from steps with named jump targets: ("label", name) marks a place,
    ("jeq"|"jge"|"jset", value, if_true, if_false) jumps to a label or, for None, to the
    next instruction; ("jump", label), ("load", offset), ("return", value)."""
    places, index = {}, 0
    for step in steps:
        if step[0] == "label":
            places[step[1]] = index
        else:
            index += 1
    instructions = [step for step in steps if step[0] != "label"]
    program = []
    for index, (kind, *operands) in enumerate(instructions):
        if kind in ("load", "return"):
            value, if_true, if_false = operands[0], 0, 0
        elif kind == "jump":
            value, if_true, if_false = _skip(places, operands[0], index), 0, 0
        else:
            value, if_true, if_false = operands[0], _skip(places, operands[1], index), _skip(places, operands[2], index)
        if not (0 <= if_true <= 255 and 0 <= if_false <= 255):
            raise ValueError(f"a BPF jump out of reach at instruction {index}")
        program.append(struct.pack("=HBBI", BPF_OPCODES[kind], if_true, if_false, value))
    return b"".join(program)


def _skip(places: dict[str, int], label: str | None, index: int) -> int:
    """How many instructions a jump from `index` to `label` skips (BPF jumps are relative)."""
    return 0 if label is None else places[label] - index - 1


class SyscallFilter:
    """A seccomp program ready to install: its C structures are built once, in the worker,
    so each call's child only makes the two prctl calls (the kernel's part is ~0.3 ms)."""

    def __init__(self, program: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._program = FilterProgram(len(program) // 8, ctypes.addressof(self._buffer))
        self._arguments = (ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(SECCOMP_MODE_FILTER))

    def install(self) -> None:
        """Put this process, and every process it starts, under the program for good (no_new_privs first)."""
        one, zero, mode = self._arguments
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, one, zero, zero, zero), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(_libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(self._program), zero, zero), "prctl(PR_SET_SECCOMP)")


def filter_for_calls(isolation: dict[str, Any]) -> tuple[SyscallFilter | None, str]:
    """The filter for this machine's calls, tried in a throwaway child; (None, why) when there is none."""
    arch = ARCHITECTURES.get(os.uname().machine)
    if not sys.platform.startswith("linux") or arch is None:
        return None, f"no system-call filter for {sys.platform} {os.uname().machine}"
    ready = SyscallFilter(syscall_filter(arch, shared_ipc=isolation["method"] == "none"))

    def attempt() -> None:
        ready.install()
        if _libc.syscall(arch.syscalls["unshare"], 0) != -1 or ctypes.get_errno() != errno.ENOSYS:
            raise OSError("the system-call filter did not refuse unshare")

    refusal = _in_child(attempt)
    return (None, f"no system-call filter: {refusal}") if refusal else (ready, "")


# ---------------------------------------------------------------- isolation, once


def isolate(config: dict[str, Any], folders: list[str]) -> dict[str, Any]:
    """Isolate this process as far as the platform allows; the isolation actually obtained.
    `folders`: the host folders calls see (`host_folders`).

    In namespace mode the calling process never returns: it becomes the waiting
    parent, and the child (process 1 of the new PID namespace) returns instead.
    """
    root = os.geteuid() == 0
    if not config["isolate"] or not sys.platform.startswith("linux"):
        return _without_namespaces(root, "")
    arch = ARCHITECTURES.get(os.uname().machine)
    if arch is None:
        return _without_namespaces(root, f"no system-call table for {os.uname().machine}")
    uid, gid = os.getuid(), os.getgid()  # before a user namespace maps them to 0
    kept_groups = "" if root else _kept_groups(gid)
    refusal = _namespaces_refused(root, uid, gid, arch, folders)
    if refusal:
        return _without_namespaces(root, refusal)
    _check(_libc.unshare(_namespace_flags(root)), "unshare")
    _set_up_namespaces(root, uid, gid)
    _fork_namespace_init()
    _build_root(BUILD_ROOT, folders)
    processes = _mount_proc(BUILD_ROOT + "/proc")
    _mount_sys(BUILD_ROOT + "/sys")
    filesystem = _make_read_only(BUILD_ROOT)
    _enter_root(BUILD_ROOT, arch)
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # no ptrace, no /proc/1/mem
    return {"method": "root" if root else "user-namespace", "network": True, "filesystem": filesystem,
            "processes": processes, "user": True, "note": kept_groups}  # fmt: skip


def _without_namespaces(root: bool, refusal: str) -> dict[str, Any]:
    """The "none" isolation: only a root worker has a uid to drop its calls to."""
    if sys.platform.startswith("linux"):  # a call running as this uid may not read this process's fds or memory
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    user = root and _in_child(_become_nobody) == ""
    return {"method": "none", "network": False, "filesystem": False, "processes": False, "user": user, "note": refusal}


def _kept_groups(gid: int) -> str:
    """The note for a user namespace: the supplementary groups a call keeps, if any.

    setgroups(2) needs CAP_SETGID over the host's user namespace, which an unprivileged
    process never has, and a user namespace it creates must deny setgroups for good.
    """
    groups = sorted(set(os.getgroups()) - {gid})
    if not groups:
        return ""
    listed = ", ".join(str(each) for each in groups)
    return f"the caller's supplementary groups ({listed}) stay in effect: an unprivileged process cannot drop them"


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


def _namespaces_refused(root: bool, uid: int, gid: int, arch: Architecture, folders: list[str]) -> str:
    """Why this process may not create and set up the namespaces, or "" if it may.

    Tried in a throwaway child, because a process cannot leave a namespace it entered:
    some systems allow unshare but not what follows (Ubuntu's AppArmor restriction of
    unprivileged user namespaces leaves them without capabilities, so mount fails).
    """

    def attempt() -> None:
        _check(_libc.unshare(_namespace_flags(root)), "unshare")
        _set_up_namespaces(root, uid, gid)
        _build_root(BUILD_ROOT, folders)
        _enter_root(BUILD_ROOT, arch)
        _check(_libc.mount(b"tmpfs", WORK_FOLDER.encode(), b"tmpfs", 0, None), "mount tmpfs")  # as each call will

    return _in_child(attempt)


def _namespace_flags(root: bool) -> int:
    """Mount, network, PID and IPC namespaces; a user namespace too when not root."""
    return CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | (0 if root else CLONE_NEWUSER)


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


def _build_root(root: str, folders: list[str]) -> None:
    """Assemble the call's file system on a tmpfs at `root`: the host `folders` bound in, /dev,
    empty folders, and HOST_COPIES of the folders a call's own tmpfs will cover.

    Whatever is not bound here is not reachable from a call at all, however it is
    named: the caller's home, /var, /opt, and the Unix sockets the host's services
    listen on (/run, /var/run, /tmp, /dev/shm). Bound folders are whole, so a socket
    inside /usr or /etc would be reachable; none belongs there. Each folder is opened
    before the tmpfs is mounted, since `root` may cover it (a virtual environment in /tmp).
    """
    links = {folder: os.readlink(folder) for folder in folders if os.path.islink(folder)}
    opened = {folder: os.open(folder, os.O_PATH | os.O_DIRECTORY) for folder in folders if folder not in links}
    try:
        _check(_libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m,nr_inodes=4096"),
               "mount a tmpfs for the new root")  # fmt: skip
        for folder in folders:
            if folder in links:  # /bin -> usr/bin on a merged /usr: the same link, resolved inside
                os.symlink(links[folder], _mount_point(root, folder, kind="link"))
            else:
                _bind(f"/proc/self/fd/{opened[folder]}", _mount_point(root, folder), folder)
        for index, folder in enumerate(covered_folders(folders)):
            _bind(f"/proc/self/fd/{opened[folder]}", _mount_point(root, f"{HOST_COPIES}/{index}"), folder)
    finally:
        for descriptor in opened.values():
            os.close(descriptor)
    _make_devices(_mount_point(root, "/dev"))
    for folder in EMPTY_FOLDERS:
        _mount_point(root, folder)


def covered_folders(folders: list[str]) -> list[str]:
    """The `folders` under /tmp or /dev/shm, which each call's own tmpfs covers.

    >>> covered_folders(["/usr", "/tmp/project/.venv", "/dev/shm/x", "/tmpfiles"])
    ['/tmp/project/.venv', '/dev/shm/x']
    """
    return [folder for folder in folders if folder not in ("/", "/dev") and _inside(folder, [WORK_FOLDER, SHARED_MEMORY_FOLDER])]


def host_folders() -> list[str]:
    """The host folders a call sees: the system's, then the interpreter's outside them, none inside another.

    An interpreter folder is taken both as named (sys.path holds that name) and as
    resolved, so a symbolic link on the way works as on the host.
    """
    system = [each for each in SYSTEM_FOLDERS if os.path.lexists(each)]
    covered = system + [os.path.realpath(each) for each in system]
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path}
    named = {os.path.abspath(each) for each in candidates if each and os.path.isdir(each)}
    interpreter = {path for each in named for path in (each, os.path.realpath(each))}
    interpreter = {each for each in interpreter if each != "/" and not _inside(each, covered)}
    return system + sorted(each for each in interpreter if not _inside(each, interpreter - {each}))


def _inside(path: str, folders: list[str] | set[str]) -> bool:
    return any(path == each or path.startswith(each.rstrip("/") + "/") for each in folders)


def _mount_point(root: str, path: str, kind: str = "folder") -> str:
    """`root` + `path`, its missing parents made as folders, itself as a folder, an empty file, or left
    for a link ("folder", "file", "link").

    It never walks through a link or into a mount: whatever it creates stays on the new
    root's own tmpfs, never in a folder bound from the host.
    """
    target = root
    parts = path.strip("/").split("/")
    for depth, part in enumerate(parts, 1):
        target = f"{target}/{part}"
        last = depth == len(parts)
        if os.path.islink(target) or (os.path.lexists(target) and os.path.ismount(target)):
            raise OSError(errno.EEXIST, f"{target} is a link or a mount already")
        if os.path.lexists(target) or (last and kind == "link"):
            continue
        if last and kind == "file":
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        else:
            os.mkdir(target, 0o755)
    return target


def _bind(source: str, target: str, named: str = "") -> None:
    _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {named or source}")


def _make_devices(dev: str) -> None:
    """A /dev of its own: five devices bound from the host's, links into /proc, and a /dev/shm mount point."""
    _check(_libc.mount(b"tmpfs", dev.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"mode=0755,size=64k"),
           "mount a tmpfs on /dev")  # fmt: skip
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", _mount_point(dev, name, kind="file"))
    for name, target in DEVICE_LINKS:
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm", 0o755)


def _make_read_only(root: str) -> bool:
    """Every mount under `root` read-only and nosuid (mount_setattr, Linux >= 5.12); False if refused."""
    attr = MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
    result = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, root.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    return result == 0


def _enter_root(root: str, arch: Architecture) -> None:
    """Make `root` this process's /, and detach the host's tree: no path leads back to it."""
    os.chdir(root)
    _check(_libc.syscall(arch.syscalls["pivot_root"], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's file system")  # the old root, stacked on "."
    os.chdir("/")


def _mount_proc(target: str) -> bool:
    """A read-only /proc of this PID namespace: a call sees its own processes, not the host's.

    Mounted while the host's /proc is still attached: in a user namespace the kernel
    allows a new proc only where a full one is already visible.
    """
    result = _libc.mount(b"proc", target.encode(), b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    return result == 0


def _mount_sys(target: str) -> None:
    """A read-only /sys of this network namespace, which lists no interface of the host's.

    Only what a call can learn is at stake, so a refusal is not an error.
    """
    _libc.mount(b"sysfs", target.encode(), b"sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def _mount_call_folders(config: dict[str, Any], owner: int, covered: list[str]) -> None:
    """One fresh tmpfs of folder_mb for the call, owned by the uid it runs as, seen at /tmp and /dev/shm.

    It is mounted on CALL_STAGING, its two folders are bound out, and the staging
    mount is detached, so /run is empty again and both folders share one size limit.
    The `covered` interpreter folders (under /tmp or /dev/shm) are bound back into it,
    read-only as their HOST_COPIES are; no process of the call exists yet to race it.
    """
    options = f"size={config['folder_mb']}m,nr_inodes=10000,mode=0700,uid={owner},gid={owner}"
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(_libc.mount(b"tmpfs", CALL_STAGING.encode(), b"tmpfs", flags, options.encode()), "mount the call's tmpfs")
    try:
        for name, target in (("work", WORK_FOLDER), ("shm", SHARED_MEMORY_FOLDER)):
            inside = f"{CALL_STAGING}/{name}"
            os.mkdir(inside, 0o700)
            os.chown(inside, owner, owner)
            _check(_libc.mount(inside.encode(), target.encode(), None, MS_BIND, None), f"bind {target}")
    finally:
        _check(_libc.umount2(CALL_STAGING.encode(), MNT_DETACH), f"detach {CALL_STAGING}")
    for index, folder in enumerate(covered):
        os.makedirs(folder, 0o755, exist_ok=True)
        _bind(f"{HOST_COPIES}/{index}", folder)


def _unmount_call_folders() -> None:
    """Drop the last call's tmpfs, and all it held, from /tmp and /dev/shm."""
    for target in (WORK_FOLDER, SHARED_MEMORY_FOLDER):
        _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _as_nobody(isolation: dict[str, Any]) -> bool:
    """Whether calls drop from root to nobody (rather than to no capabilities, or to nothing)."""
    return isolation["user"] and isolation["method"] != "user-namespace"


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


# ---------------------------------------------------------------- the call's cgroup

CALL_CGROUP, WORKER_CGROUP = "call", "worker"
"""The two cgroups in a worker's cgroup folder (made by the host): the calls' processes, and the worker's own."""
MIN_CPU_CHECK_SECONDS = 0.01
"""The shortest wait between two readings of a call's CPU time; with n CPUs a call may pass its
limit by n times this before it is stopped."""
EMPTY_SECONDS = 2.0  # after the kill, how long the call's cgroup may take to hold no process


class CallCgroup:
    """The cgroup v2 every process of a worker's calls is born in, and the worker's own beside it.

    The worker moves itself into the call cgroup just long enough to fork a call's
    first process (`fork`), so that process and everything it starts (children,
    grandchildren, daemons that leave their session or are re-parented, threads) is
    in it from birth; no process of a call can leave it, since none can write to a
    cgroup file (no cgroup file system in its root, no privileges; where a call could,
    the worker does not use the cgroup: `cpu_refusal`). The kernel counts the CPU time of every
    task in it, also of those that exited, however they were reaped (`cpu.stat`), and
    `cgroup.kill` kills all of them at once, forks in flight included.
    """

    def __init__(self, folder: str) -> None:
        """Open the cgroup files under `folder` and move this process into its worker cgroup
        (OSError if the kernel refuses: no cgroup v2 there, or no right to move)."""
        flags = os.O_CLOEXEC
        self._fds: list[int] = []
        self.home = self._open(f"{folder}/{WORKER_CGROUP}/cgroup.procs", os.O_WRONLY | flags)
        self.procs = self._open(f"{folder}/{CALL_CGROUP}/cgroup.procs", os.O_WRONLY | flags)
        self.stat = self._open(f"{folder}/{CALL_CGROUP}/cpu.stat", os.O_RDONLY | flags)
        self.events = self._open(f"{folder}/{CALL_CGROUP}/cgroup.events", os.O_RDONLY | flags)
        self.killer = self._open(f"{folder}/{CALL_CGROUP}/cgroup.kill", os.O_WRONLY | flags)
        try:
            os.write(self.home, b"0")
        except OSError:
            self.close()
            raise

    def _open(self, path: str, flags: int) -> int:
        try:
            fd = os.open(path, flags)
        except OSError:
            self.close()
            raise
        self._fds.append(fd)
        return fd

    def fork(self, fork: Callable[[], int]) -> int:
        """`fork()` with the child born in the call cgroup; this process stays in its own."""
        os.write(self.procs, b"0")
        try:
            pid = fork()
        except BaseException:
            os.write(self.home, b"0")
            raise
        if pid:
            os.write(self.home, b"0")
        return pid

    def cpu_seconds(self) -> float:
        """CPU time used by every task ever in the call cgroup, exited ones included (OSError, ValueError if unreadable)."""
        return cpu_stat_seconds(os.pread(self.stat, 4096, 0))

    def populated(self) -> bool:
        """Whether a process is still alive in the call cgroup (a zombie no longer counts)."""
        return cgroup_populated(os.pread(self.events, 4096, 0))

    def kill(self) -> None:
        """SIGKILL every process in the call cgroup, including one forked while this runs."""
        os.write(self.killer, b"1")

    def wait_empty(self, timeout: float) -> None:
        """Until no process of the call is alive; OSError if one still is after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.populated():
            if time.monotonic() > deadline:
                raise OSError(errno.EBUSY, f"a process of the call was still alive {timeout:g} s after it was killed")
            self.kill()
            time.sleep(0.001)

    def close(self) -> None:
        for fd in self._fds:
            _close(fd)
        self._fds = []


def cpu_stat_seconds(raw: bytes) -> float:
    """The usage_usec line of a cgroup's cpu.stat, in seconds; ValueError if there is none.

    >>> cpu_stat_seconds(b"usage_usec 1250000\\nuser_usec 1000000\\nsystem_usec 250000\\n")
    1.25
    """
    for line in raw.decode("ascii").splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"cpu.stat has no usage_usec: {raw[:200]!r}")


def cgroup_populated(raw: bytes) -> bool:
    """The populated line of a cgroup's cgroup.events; ValueError if there is none.

    >>> cgroup_populated(b"populated 1\\nfrozen 0\\n"), cgroup_populated(b"populated 0\\nfrozen 0\\n")
    (True, False)
    """
    for line in raw.decode("ascii").splitlines():
        name, _, value = line.partition(" ")
        if name == "populated":
            return value.strip() != "0"
    raise ValueError(f"cgroup.events has no populated: {raw[:200]!r}")


def next_cpu_check(now: float, used: float, limit: float, cpus: int) -> float:
    """When to read a call's CPU time next: the earliest moment it could reach `limit`.

    The call's processes use at most `cpus` CPU-seconds per second, so a call with
    `limit - used` left cannot pass the limit before that divided by `cpus`; the waits
    shrink as the call nears its limit, down to MIN_CPU_CHECK_SECONDS. An idle call is
    read a few times, a busy one about log2(limit / MIN_CPU_CHECK_SECONDS) times.

    >>> next_cpu_check(10.0, used=0.0, limit=2.0, cpus=2), next_cpu_check(10.0, used=1.999, limit=2.0, cpus=2)
    (11.0, 10.01)
    """
    return now + max(MIN_CPU_CHECK_SECONDS, (limit - used) / cpus)


def open_call_cgroup(config: dict[str, Any]) -> tuple[CallCgroup | None, str]:
    """The cgroup of this worker's calls, from the folder the host made (`config["cgroup"]`); (None, why) without one.

    Opened before the worker isolates itself: the new root has no cgroup file system,
    and the open files are all the worker keeps of it.
    """
    folder = config.get("cgroup")
    if not folder:
        return None, config.get("cgroup_refusal") or "no cgroup for the calls"
    try:
        return CallCgroup(folder), ""
    except OSError as error:
        return None, f"the calls' cgroup {folder} cannot be used: {error}"


def probe_call_cgroup(cgroup: CallCgroup) -> str:
    """Why a process cannot be born in, counted in and killed in `cgroup` here, or "" if it can.

    Run after isolation, from where every call's first process is forked.
    """
    try:
        before = cgroup.cpu_seconds()
        pid = cgroup.fork(os.fork)
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        cgroup.kill()
        cgroup.wait_empty(EMPTY_SECONDS)
        if cgroup.cpu_seconds() < before:
            return "the calls' cgroup counts CPU time backwards"
    except (OSError, ValueError) as error:
        return f"the calls' cgroup cannot be used: {error}"
    return ""


def cpu_refusal(cgroup: CallCgroup | None, refusal: str, isolation: dict[str, Any]) -> str:
    """Why a call's CPU time cannot be counted across its processes, or "" if it can.

    A call that runs as the uid owning its cgroup, with the host's cgroup file system
    in sight (the "none" column without root), could move its processes out of it.
    """
    if cgroup is None:
        return refusal
    if not isolation["user"]:
        return "a call runs as the uid that owns its cgroup and could move its processes out of it"
    return probe_call_cgroup(cgroup)


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
    """The next call's processes, forked and confined ahead of the call, waiting for its code."""

    pid: int  # the call's process, or with namespaces the call's init, its parent
    code: int  # write end: the code, then end of file
    output: int  # read end of stdout and stderr
    status: int  # read end of the exception report
    relay: int | None = None  # read end of the call's wait status, as its init saw it (with namespaces)


def fork_child(folder: str, config: dict[str, Any], isolation: dict[str, Any], syscalls: SyscallFilter | None,
               pid_namespace: int | None, cgroup: CallCgroup | None) -> Child:  # fmt: skip
    """Fork the process that will run the next call, and let it confine itself now.

    Its confinement (and the page faults of a fresh fork) happen while the worker is
    idle, so a call only pays for sending the code and running it. `syscalls` is the
    seccomp filter it installs (None for none). With namespaces, `pid_namespace` is this
    process's own PID namespace (an open /proc/self/ns/pid): the child is forked into a
    new one nested in it, as its init (`_serve_as_call_init`), and forks the call's
    process there. With a `cgroup`, the child is born in the calls' cgroup, and so is
    every process of the call after it.
    """
    code_read, code_write = os.pipe()
    output_read, output_write = os.pipe()
    status_read, status_write = os.pipe()
    relay_read, relay_write = os.pipe() if pid_namespace is not None else (None, None)
    fork = functools.partial(_fork_in_new_pid_namespace, pid_namespace) if pid_namespace is not None else os.fork
    pid = cgroup.fork(fork) if cgroup is not None else fork()
    if pid == 0:
        confined = (code_read, output_write, status_write, folder, config, isolation, syscalls)
        if relay_write is None:
            _run_child(*confined)
        _close_all_but(code_read, output_write, status_write, relay_write)  # the code pipe must end when the worker closes it
        _serve_as_call_init(relay_write, confined)
    for fd in (code_read, output_write, status_write, relay_write):
        _close(fd) if fd is not None else None
    return Child(pid, code_write, output_read, status_read, relay_read)


def _fork_in_new_pid_namespace(own: int) -> int:
    """os.fork(), the child as process 1 of a new PID namespace nested in this process's own (`own`).

    unshare(CLONE_NEWPID) puts this process's next child in a new namespace; setns back
    to its own makes the one after that start another.
    """
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = os.fork()
    if pid:
        _check(_libc.setns(own, CLONE_NEWPID), "setns to the worker's PID namespace")
    return pid


def _serve_as_call_init(relay: int, confined: tuple[Any, ...]) -> None:
    """Process 1 of a call's PID namespace: fork the call's process, wait for it, relay its status. Never returns.

    Its own mount namespace carries a /proc of the call's PID namespace (pids there are
    the call's, as os.getpid() gives them), and its own IPC namespace holds the call's
    System V objects and queues. The call's process cannot name the worker, which
    lives in the namespace above, so no signal, prlimit or pidfd of the call's reaches
    it; what the call does to this process only ends the call. When this process
    exits, the kernel kills every other process of the namespace.
    """
    exit_status = 70  # EX_SOFTWARE: the worker reads a missing relay as the call killed
    try:
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(CLONE_NEWNS | CLONE_NEWIPC)")
        _check(_libc.mount(b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        call = os.fork()
        if call == 0:
            os.close(relay)
            _run_child(*confined)
        for fd in confined[:3]:  # the call's ends of its pipes
            os.close(fd)
        while (reaped := os.waitpid(-1, 0))[0] != call:  # orphans of the call are this process's to reap
            pass
        os.write(relay, struct.pack("=i", reaped[1]))
        exit_status = 0
    finally:
        os._exit(exit_status)


def run_call(child: Child, code: str, config: dict[str, Any], isolation: dict[str, Any],
             cgroup: CallCgroup | None) -> dict[str, Any]:  # fmt: skip
    """Give `child` the code, follow it to its end, kill what it left, and report.

    The report: output (the first max_output_chars characters of stdout and stderr
    together), omitted (characters cut after them), timed_out, exit_code or signal,
    exception ({"type", "errno", "summary"} when the code raised), tampered (the
    status pipe held what the sandbox did not write there), cpu_seconds and
    wall_seconds. Everything but the exception is what this process saw itself.

    With a `cgroup`, cpu_seconds is what every process and thread of the call used
    together, and the call is stopped (all its processes killed) once that passes
    cpu_seconds of the limits; a reading that fails raises, so the call is reported
    as the sandbox's failure, never as a success. Without one, it is the CPU time of
    the call's process and of the children it waited for.
    """
    start = time.monotonic()
    capture = Capture(config["max_output_chars"])
    meter = CpuMeter(cgroup, config["cpu_seconds"], config["cpus"], start) if cgroup is not None else None
    try:
        _send(child.code, code.encode("utf-8", "surrogatepass"))
        ending = _follow(child, capture, start + config["wall_seconds"], meter)
    finally:
        kill_call(child, isolation, cgroup)
    _, status, usage = os.wait4(child.pid, 0)  # with namespaces the init's usage includes the call's, reaped
    if child.relay is not None:
        status = relayed_status(_read_available(child.relay, 4))
    _drain(child.output, capture)
    if isolation["method"] != "none":
        _reap_all()
    timed_out = ending == "timeout"
    cpu_seconds = usage.ru_utime + usage.ru_stime
    if meter is not None:
        _wait_for_the_call(cgroup, isolation)  # type: ignore[arg-type]
        cpu_seconds = meter.used()
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    exception, tampered = judge_status(_read_available(child.status, MAX_STATUS_BYTES + 1), None if timed_out else exit_code)
    report = {
        "output": capture.text,
        "omitted": capture.omitted,
        "timed_out": timed_out,
        "exit_code": exit_code,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exception": exception,
        "tampered": tampered,
        "cpu_seconds": round(cpu_seconds, 4),
        "wall_seconds": round(time.monotonic() - start, 4),
    }
    _close(child.output, child.status, child.relay)
    return report


def relayed_status(raw: bytes) -> int:
    """The call's wait status as its init relayed it; killed by SIGKILL when there is none.

    Only the call can keep its init from relaying (by lowering the init's limits, say),
    and the init's end kills every process of the call: the call was killed.

    >>> os.WEXITSTATUS(relayed_status(struct.pack("=i", 3 << 8))), os.WTERMSIG(relayed_status(b""))
    (3, 9)
    """
    return struct.unpack("=i", raw)[0] if len(raw) == 4 else signal.SIGKILL


def discard(child: Child, isolation: dict[str, Any], cgroup: CallCgroup | None) -> None:
    """Kill and reap a child whose call failed in the worker, and close its pipes."""
    kill_call(child, isolation, cgroup)
    if isolation["method"] != "none":
        _reap_all()
    else:
        try:
            os.waitpid(child.pid, 0)
        except ChildProcessError:  # already reaped
            pass
    if cgroup is not None:
        _wait_for_the_call(cgroup, isolation)
    _close(child.code, child.output, child.status, child.relay)


def _wait_for_the_call(cgroup: CallCgroup, isolation: dict[str, Any]) -> None:
    """Until no process of the call is alive (OSError if one still is) and, without namespaces, none is left
    unreaped: this process is their subreaper there, so a process that left the call's session does not
    linger as a zombie that still counts against nobody's process limit."""
    cgroup.wait_empty(EMPTY_SECONDS)
    if isolation["method"] == "none":
        while True:  # every child of this process now is a process of the call, dead or dying
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return


def _close_all_but(*kept: int) -> None:
    """Close every descriptor above stderr but `kept`."""
    start = 3
    for fd in sorted(kept):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, MAX_FD)


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is None:
            continue
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


class CpuMeter:
    """A call's CPU time so far, all its processes together, read from its cgroup when it could have passed the limit."""

    def __init__(self, cgroup: CallCgroup, limit: float, cpus: int, start: float) -> None:
        self.cgroup, self.limit, self.cpus = cgroup, limit, cpus
        self.baseline = cgroup.cpu_seconds()  # the waiting child's confinement, before the code came
        self.next_check = next_cpu_check(start, 0.0, limit, cpus)

    def used(self) -> float:
        return max(0.0, self.cgroup.cpu_seconds() - self.baseline)

    def passed(self, now: float) -> bool:
        """Whether the call has used its CPU limit; if not, when to ask next is set."""
        used = self.used()
        if used >= self.limit:
            return True
        self.next_check = next_cpu_check(now, used, self.limit, self.cpus)
        return False


def _follow(child: Child, capture: Capture, deadline: float, meter: CpuMeter | None) -> str:
    """Read the child's output until it exits: "exit", or "timeout" if the wall clock ran out
    first, or "cpu" if the call's processes used up its CPU time first (`meter`)."""
    exit_fd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else None
    poller = select.poll()
    poller.register(child.output, select.POLLIN)
    if exit_fd is not None:
        poller.register(exit_fd, select.POLLIN)
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if meter is not None and now >= meter.next_check and meter.passed(now):
                return "cpu"
            wake = deadline if meter is None else min(deadline, meter.next_check)
            # Without a pidfd (not Linux) the child's exit is seen by polling waitid.
            wait_ms = (wake - now) * 1000 if exit_fd is not None else min(wake - now, 0.01) * 1000
            for fd, _ in poller.poll(max(0.0, wait_ms)):
                if fd == child.output:
                    chunk = os.read(child.output, READ_BYTES)
                    capture.feed(chunk) if chunk else poller.unregister(child.output)
                elif fd == exit_fd:
                    return "exit"
            if exit_fd is None and os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return "exit"
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def kill_call(child: Child, isolation: dict[str, Any], cgroup: CallCgroup | None) -> None:
    """Kill every process of the call: the whole cgroup of calls, then the whole namespace but
    this process, or the child's group."""
    if cgroup is not None:
        cgroup.kill()
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


def _read_available(fd: int, limit: int) -> bytes:
    """What waits on a pipe whose writers are gone, up to `limit` bytes (on the status pipe, more is garbage anyway)."""
    os.set_blocking(fd, False)
    chunks, size = [], 0
    while size < limit:
        try:
            chunk = os.read(fd, limit - size)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def judge_status(raw: bytes, exit_code: int | None) -> tuple[dict[str, Any] | None, bool]:
    """The exception a call's process reported, and whether its status pipe was tampered with.

    The pipe is in reach of the code (the same process writes the report), so what is
    on it is believed only as what the sandbox writes, when it writes it: one well-formed
    report, followed by exit status 1. Any other bytes, or a report with another exit
    status, are tampering. `exit_code` is None when a signal or the wall clock ended
    the call: those facts decide, and the pipe is not read into them.

    >>> report = b'{"type": "MemoryError", "errno": null, "summary": "MemoryError"}'
    >>> judge_status(report, 1)
    ({'type': 'MemoryError', 'errno': None, 'summary': 'MemoryError'}, False)
    >>> judge_status(report, 0), judge_status(b'[1, 2]', 1), judge_status(b"", 1), judge_status(b"junk", None)
    ((None, True), (None, True), (None, False), (None, False))
    """
    if not raw or exit_code is None:
        return None, False
    try:
        exception = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_STATUS_BYTES else None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        exception = None
    if not valid_exception(exception) or exit_code != 1:
        return None, True
    return exception, False


def valid_exception(exception: Any) -> bool:
    """Whether `exception` has exactly the shape `_report_exception` writes: an identifier,
    an errno the kernel could give, and a summary of printable text that encodes as UTF-8
    (JSON can spell a lone surrogate, which no observation can carry).

    >>> valid_exception({"type": "OSError", "errno": 28, "summary": "OSError: no space"})
    True
    >>> [valid_exception({"type": "E", "errno": n, "summary": s}) for n, s in [(None, "\\ud800"), (10**30, "x"), (None, "a\\x1b[2J")]]
    [False, False, False]
    """
    if not isinstance(exception, dict) or set(exception) != {"type", "errno", "summary"}:
        return False
    name, number, summary = exception["type"], exception["errno"], exception["summary"]
    return (
        isinstance(name, str) and name.isidentifier() and printable(name) == name and len(name) <= MAX_TYPE_CHARS
        and (number is None or (type(number) is int and 0 <= number <= MAX_ERRNO))
        and isinstance(summary, str) and len(summary) <= MAX_SUMMARY_CHARS and printable(summary) == summary
    )  # fmt: skip


def printable(text: str) -> str:
    """`text` as an observation can carry it: what does not encode as UTF-8 (a lone surrogate)
    and control characters other than tab and newline written as backslash escapes.

    >>> printable("bad \\ud800 and \\x1b[2J here\\n")
    'bad \\\\ud800 and \\\\x1b[2J here\\n'
    """
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch in "\t\n" or unicodedata.category(ch) != "Cc" else ch.encode("unicode_escape").decode() for ch in text)


def new_folder(previous: str | None, config: dict[str, Any], isolation: dict[str, Any], covered: list[str]) -> str:
    """An empty working folder for the next call; the previous one, and all it held, is gone.

    With namespaces it is a fresh tmpfs on /tmp (and /dev/shm); otherwise a new folder
    in the scratch folder the host made for this worker (and removes with it), owned
    by the uid the call will run as.
    """
    if isolation["method"] != "none":
        if previous is not None:
            _unmount_call_folders()
        _mount_call_folders(config, NOBODY if _as_nobody(isolation) else 0, covered)
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


def _run_child(code: int, output: int, status: int, folder: str, config: dict[str, Any],
               isolation: dict[str, Any], syscalls: SyscallFilter | None) -> None:  # fmt: skip
    """The forked child: confine itself, wait for the code, run it, exit. Never returns."""
    exit_status = 70  # EX_SOFTWARE: the confinement itself failed
    try:
        if sys.platform.startswith("linux"):  # without namespaces, nothing else ties it to the worker
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        _redirect(code, output, status)
        os.chdir(folder)
        os.environ.update(HOME=folder, TMPDIR=folder, PWD=folder, MALLOC_ARENA_MAX="1")  # the variable: for programs it starts
        _set_limits(config, isolation)
        _one_malloc_arena()
        _drop_privileges(isolation)
        if syscalls is not None:
            syscalls.install()
        source = _read_code(CODE_FD)
        exit_status = _run_code(source, reporter=os.getpid())
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
    os.closerange(CODE_FD + 1, MAX_FD)
    # Line-buffered, so what was printed before a kill still reaches the pipe.
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)


M_ARENA_MAX = -8
"""glibc's mallopt parameter: the most malloc arenas a process creates."""


def _one_malloc_arena() -> None:
    """Every thread of the call allocates from glibc's main arena. Each further arena, which
    glibc creates when threads' allocations happen to contend, reserves 64 MB of address
    space, which RLIMIT_AS counts: under memory_mb: 128, 8 threads that allocate failed to
    start in 9 of 40 runs, depending on timing alone. A C library without mallopt (not
    glibc): nothing to do."""
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 1)


def _set_limits(config: dict[str, Any], isolation: dict[str, Any]) -> None:
    """CPU time, address space, file size and process count, as rlimits.

    RLIMIT_NPROC counts processes per uid: as nobody it is shared with every other
    process running as nobody (other calls, and the other workers' waiting children);
    in a user namespace it counts that namespace only (whose other three processes are
    the worker, its parent and the call's init). Without a uid of its own a call would share the count
    with the host user's processes, so it is not set.
    """
    megabyte = 1024 * 1024
    # Where the call's cgroup counts, its limit decides: a process alone is stopped by the call's
    # limit first (RLIMIT_CPU fires on a finer clock than the cgroup's, a few ms early), and RLIMIT_CPU,
    # a second past it, is only a bound should the worker fail to stop the call.
    cpu = config["cpu_seconds"] + (1 if isolation.get("cpu") else 0)
    limits = [
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (config["memory_mb"] * megabyte,) * 2),
        (resource.RLIMIT_FSIZE, (config["file_size_mb"] * megabyte,) * 2),
    ]
    if isolation["method"] == "user-namespace":  # + the worker, its parent and the call's init
        limits.append((resource.RLIMIT_NPROC, (config["max_processes"] + 3,) * 2))
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


def _run_code(code: str, reporter: int) -> int:
    """Run `code` as __main__ in fresh globals; its exit status, as the interpreter would give.

    The globals are a new module registered as __main__, so pickle (multiprocessing)
    finds the code's functions by name. Only process `reporter` reports an uncaught
    exception on the status pipe: a process the code forked raises into here too.
    """
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    sys.argv = [CODE_FILENAME]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    try:
        exec(compile(code, CODE_FILENAME, "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return (stop.code or 0) & 0xFF
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException as error:
        _report_exception(error, os.getpid() == reporter)
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


def _report_exception(error: BaseException, on_status_pipe: bool) -> None:
    """The traceback, trimmed to the code's own frames, on stderr; its type and errno on fd 3."""
    summary = traceback.format_exception_only(type(error), error)[-1].strip()
    number = error.errno if isinstance(error, OSError) and type(error.errno) is int else None
    name = type(error).__name__ if printable(type(error).__name__) == type(error).__name__ else "Exception"
    if number is not None and not 0 <= number <= MAX_ERRNO:
        number = None
    report = {"type": name[:MAX_TYPE_CHARS], "errno": number, "summary": printable(summary)[:MAX_SUMMARY_CHARS]}
    try:
        if on_status_pipe:
            os.write(STATUS_FD, json.dumps(report).encode())
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


def serve(requests: BinaryIO, replies: BinaryIO, config: dict[str, Any], isolation: dict[str, Any],
          syscalls: SyscallFilter | None, covered: list[str], cgroup: CallCgroup | None) -> None:  # fmt: skip
    """Answer one request per line until the host closes the pipe.

    After each reply, the previous call's folder is replaced and the next call's child
    forked, so both are ready before the next request arrives. `covered`: the interpreter
    folders each call's folders get bound back (`covered_folders`); `cgroup`: where each
    call's processes are born and counted (None: CPU time is limited per process only).
    """
    folder = new_folder(None, config, isolation, covered)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if isolation["method"] != "none" else None
    child = fork_child(folder, config, isolation, syscalls, own, cgroup)
    for line in requests:
        if os.waitpid(child.pid, os.WNOHANG)[0]:  # the waiting child died before its call: it never ran code
            discard(child, isolation, cgroup)
            child = fork_child(folder, config, isolation, syscalls, own, cgroup)
        try:
            reply = run_call(child, json.loads(line)["code"], config, isolation, cgroup)
        except Exception as error:  # the worker's own failure: the host reports it as infra
            reply = {"infra": f"{type(error).__name__}: {error}"}
            discard(child, isolation, cgroup)
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()
        folder = new_folder(folder, config, isolation, covered)
        child = fork_child(folder, config, isolation, syscalls, own, cgroup)
    discard(child, isolation, cgroup)
    if isolation["method"] == "none":
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
    folders = host_folders()  # before a mount covers any of them
    # Every CPU the call's processes could run on, online or not: the most CPU time a call uses per second.
    config["cpus"] = max(os.sysconf("SC_NPROCESSORS_CONF"), os.cpu_count() or 1)
    cgroup, cgroup_refusal = open_call_cgroup(config)  # before the new root hides the cgroup file system
    isolation = isolate(config, folders)
    syscalls, refusal = filter_for_calls(isolation)
    isolation["syscalls"] = syscalls is not None
    cpu_refused = cpu_refusal(cgroup, cgroup_refusal, isolation)
    if cpu_refused and cgroup is not None:
        cgroup.close()
        cgroup = None
    isolation["cpu"] = not cpu_refused
    if cgroup is not None and isolation["method"] == "none":  # the call's orphans become this process's to reap
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    isolation["note"] = "; ".join(each for each in (isolation["note"], refusal, cpu_refused) if each)
    gc.freeze()  # what exists now is shared with every child; no collection there touches it
    replies.write(json.dumps({"isolation": isolation}).encode() + b"\n")
    replies.flush()
    serve(requests, replies, config, isolation, syscalls, covered_folders(folders), cgroup)


if __name__ == "__main__":
    main()
