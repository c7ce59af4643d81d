"""The sandbox's own seccomp profile, passed on every container start.

Why our own: the engine's default profile is whatever the engine was built with. Debian's
Docker 20.10 lets a sandboxed command call ``io_uring_setup`` and ``ptrace``-attach to PID 1;
newer engines deny io_uring but still allow attaching to any process of the same uid. The
sandbox gets the same, tight profile on every engine.

Where it comes from: the allowlist of moby's current default profile
(github.com/moby/profiles, ``seccomp/default.json`` at 3c28324, May 2026; Apache-2.0),
regrouped by purpose below, then narrowed:

- **Resolved for a sandbox without capabilities.** The default profile is a template: rules
  that apply only when the container holds a capability (``CAP_SYS_ADMIN``: mount, unshare,
  setns, bpf, perf_event_open...; ``CAP_SYS_PTRACE``: kcmp, pidfd_getfd; ``CAP_SYS_MODULE``,
  ``CAP_SYS_TIME``, ``CAP_SYS_BOOT``...) are left out, since every sandbox drops all
  capabilities: those calls are refused by the filter, before the kernel's capability check.
- **64-bit only.** Only the 64-bit system call tables (x86-64 and AArch64) are listed. The
  32-bit ones (i386 and x32 on an x86-64 host, reachable from any 64-bit process with
  ``int $0x80``) are a second kernel entry point with its own history of bugs, and
  ``socketcall`` there would bypass the socket rule below; gVisor runs no 32-bit program at
  all, so this also keeps the two runtimes alike.
- **Denied beyond the default** (each group says why in :data:`DENIED`): io_uring, ptrace
  attach/seize and cross-process memory access, file handles, and socket families other than
  Unix, IPv4, IPv6 and netlink.

Under runc the engine loads this profile into the kernel for every process of the container
(its init, the agents, every ``docker exec``). Under gVisor (runsc) the profile goes to the
runtime like every container setting, but runsc applies it only when registered with
``--oci-seccomp`` (it then enforces it in its own kernel, inside the sandbox); without that
flag it ignores it, and gVisor's own kernel is what refuses (see docs/seccomp.md for the
table). runsc's host process always runs under runsc's own, much tighter filter; no OCI
profile changes that one.

``python -m sandbox.docker.seccomp`` prints the profile (``docker run --security-opt
seccomp=FILE`` takes it as it is).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

# fmt: off
#: What every sandboxed program may call, by purpose. Names that a kernel does not know are
#: skipped by the runtime (runc), so a newer call listed here costs nothing on an older host.
ALLOWED: dict[str, tuple[str, ...]] = {
    # Files and directories: everything an editor, a compiler, git or a package manager does.
    "files": (
        "access", "chdir", "chown", "close", "close_range", "copy_file_range",
        "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir",
        "fchown", "fchownat", "fcntl", "fdatasync", "flock",
        "fstat", "fstatfs", "fsync", "ftruncate", "futimesat", "getcwd", "getdents", "getdents64",
        "lchown", "link", "linkat", "lseek", "lstat", "mkdir", "mkdirat",
        "newfstatat", "pread64", "preadv", "preadv2", "pwrite64",
        "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "rename",
        "renameat", "renameat2", "rmdir", "sendfile", "splice", "stat", "statfs", "statx",
        "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "umask",
        "unlink", "unlinkat", "utime", "utimensat", "utimes", "vmsplice", "write", "writev",
    ),
    # (chmod, fchmod, fchmodat, fchmodat2, creat, open, openat, mknod, mknodat: below, only
    # without setuid/setgid bits or a device; openat2: ENOSYS.)
    # Extended attributes (cp -a, tar, rsync, package managers).
    "xattrs": (
        "fgetxattr", "flistxattr", "fremovexattr", "fsetxattr", "getxattr", "getxattrat",
        "lgetxattr", "listxattr", "listxattrat", "llistxattr", "lremovexattr", "lsetxattr",
        "removexattr", "removexattrat", "setxattr", "setxattrat",
    ),
    # Watching files (the agent's snapshots, test runners' watch modes, dev servers).
    # fanotify_mark is inert without fanotify_init, which needs CAP_SYS_ADMIN.
    "watching files": (
        "fanotify_mark", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
    ),
    # Memory: allocators, runtimes, JITs (Node, the JVM), shared memory between processes.
    "memory": (
        "brk", "cachestat", "madvise", "map_shadow_stack", "membarrier", "memfd_create",
        "memfd_secret", "mincore", "mlock", "mlock2", "mlockall", "mmap", "mprotect", "mremap",
        "mseal", "msync", "munlock", "munlockall", "munmap", "pkey_alloc", "pkey_free",
        "pkey_mprotect", "remap_file_pages",
    ),
    # Processes and threads (clone is below: only without new namespaces).
    "processes": (
        "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "getpid",
        "getppid", "gettid", "getpgid", "getpgrp", "getsid", "setpgid", "setsid",
        "set_tid_address", "get_robust_list", "set_robust_list", "rseq", "futex", "futex_requeue",
        "futex_wait", "futex_waitv", "futex_wake", "prctl", "get_thread_area", "set_thread_area",
        "pidfd_open", "pidfd_send_signal", "process_mrelease", "restart_syscall",
    ),
    # Signals (the agent's timeouts kill process groups; shells, test runners).
    "signals": (
        "kill", "tgkill", "tkill", "pause", "rt_sigaction", "rt_sigpending", "rt_sigprocmask",
        "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait", "rt_tgsigqueueinfo",
        "sigaltstack", "signalfd", "signalfd4",
    ),
    # Identity: reading it, and changing it within what the process already has (without
    # CAP_SETUID a process can only move between its own ids).
    "identity": (
        "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid",
        "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid",
        "setfsgid", "capget", "capset",
    ),
    # Time and timers (reading the clock; adjtimex and clock_adjtime only read it without
    # CAP_SYS_TIME).
    "time": (
        "adjtimex", "alarm", "clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep",
        "getitimer", "gettimeofday", "nanosleep", "setitimer", "time", "times", "timer_create",
        "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create",
        "timerfd_gettime", "timerfd_settime",
    ),
    # Waiting on many descriptors (every event loop).
    "polling": (
        "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
        "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "pipe", "pipe2",
        "poll", "ppoll", "pselect6", "select",
    ),
    # Asynchronous I/O the classic way (libaio, databases' test instances).
    "aio": ("io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit"),
    # Sockets (socket and socketpair themselves are below: a few families only).
    "sockets": (
        "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
        "listen", "recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto", "setsockopt",
        "shutdown",
    ),
    # SysV and POSIX IPC, in the sandbox's own IPC namespace (PostgreSQL, multiprocessing).
    "ipc": (
        "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
        "msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop", "shmat",
        "shmctl", "shmdt", "shmget",
    ),
    # Scheduling, priorities and limits (nice, taskset, ulimit; the pids and memory limits
    # are the engine's, out of reach).
    "scheduling and limits": (
        "getcpu", "getpriority", "setpriority", "ioprio_get", "ioprio_set", "getrlimit",
        "setrlimit", "prlimit64", "getrusage", "sched_get_priority_max", "sched_get_priority_min",
        "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_getscheduler",
        "sched_rr_get_interval", "sched_setaffinity", "sched_setattr", "sched_setparam",
        "sched_setscheduler", "sched_yield",
    ),
    # The system as seen from inside, randomness, device control on open descriptors.
    "system": ("getrandom", "ioctl", "sysinfo", "uname", "listmount", "statmount"),
    # A program's own sandboxing (Chromium, bubblewrap's seccomp, Landlock-aware tools).
    "self-restriction": ("seccomp", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self"),
    # Architecture-specific calls of the 64-bit ABIs listed (x86-64: TLS setup, the kernel's
    # uretprobe trampoline; AArch64 and RISC-V have none that the default allows beyond these).
    "architecture": ("arch_prctl", "modify_ldt", "uretprobe", "riscv_hwprobe"),
}

#: What the profile refuses that the engine's default (or Debian's older one) allows, and why.
#: Everything not in :data:`ALLOWED` nor allowed by a rule in :func:`build` is refused too
#: (EPERM), including every capability-gated call (see the module docstring).
DENIED: dict[str, tuple[str, tuple[str, ...]]] = {
    "io_uring": (
        "Its own path into the kernel, beside the system call table: a long series of privilege "
        "escalations, operations that seccomp and the audit subsystem do not see one by one, and "
        "nothing a coding agent needs (libuv, Tokio and liburing users fall back to threads). "
        "Docker's defaults deny it since 25.0; Debian's 20.10 does not.",
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    ),
    "ptrace attach and cross-process memory": (
        "A command must not take over a process it did not start: PID 1 (the container's init, "
        "same uid), the agents, or the processes of another call (the kernel's own check allows "
        "all of them: same uid, and no Yama on many hosts). Attaching (PTRACE_ATTACH, "
        "PTRACE_SEIZE) is refused; a program may still trace its own children that ask for it "
        "(PTRACE_TRACEME: `gdb ./prog`, `strace cmd`, which falls back to it). Reading or "
        "writing another process's memory directly (process_vm_readv/writev) is refused for the "
        "same reason; pidfd_getfd and kcmp need CAP_SYS_PTRACE in the default already.",
        ("process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"),
    ),
    "file handles": (
        "name_to_handle_at and open_by_handle_at turn a path into a handle and a handle back into "
        "an open file past every directory permission (the 'shocker' container escape); "
        "open_by_handle_at needs CAP_DAC_READ_SEARCH anyway, and no coding task needs either.",
        ("name_to_handle_at", "open_by_handle_at"),
    ),
    "socket families": (
        "socket() and socketpair() only for Unix, IPv4, IPv6 and netlink (getaddrinfo and `ip` "
        "read the interfaces through it). Rare families (AF_ALG, vsock, TIPC, RDS, CAN, KCM, "
        "Bluetooth, ...) load kernel code an agent never needs and keep turning up in kernel "
        "CVEs; the sandbox has no network but loopback anyway.",
        (),
    ),
    "setuid, setgid and device files": (
        "The workspace is a host directory: a file made setuid or setgid there keeps its mode on "
        "the host, where any local user who runs it gets its owner's ids (root's in a root-owned "
        "workspace, whose sandbox runs as uid 0). chmod, fchmod, fchmodat, fchmodat2 and creat "
        "with S_ISUID or S_ISGID, open and openat creating a file with them, and mknod/mknodat "
        "of a character or block device are refused; openat2, whose mode the filter cannot "
        "read, answers ENOSYS (every libc falls back to openat). The agents add the same rules "
        "as a filter of their own, for gVisor (sandbox/agent/modeguard.py).",
        ("openat2",),
    ),
    "32-bit system calls": (
        "Not listed at all: see the module docstring.",
        ("socketcall",),
    ),
}

#: Mode bits a file may not be given in the workspace: S_ISUID | S_ISGID.
SETID_BITS = 0o6000
#: open()/openat() flags under which the mode argument is read: O_CREAT, __O_TMPFILE.
CREATE_FLAGS = 0o100 | 0o20000000
#: mknod() types allowed (with S_IFMT and the setid bits as the mask): a plain mknod (0,
#: a regular file), a regular file, a FIFO and a socket; never a device.
MKNOD_TYPES = (0, 0o100000, 0o010000, 0o140000)
#: The calls that take a mode, and the index of their mode argument (and of their flags).
MODE_CALLS = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1}
OPEN_CALLS = {"open": (1, 2), "openat": (2, 3)}  # (flags, mode)
MKNOD_CALLS = {"mknod": 1, "mknodat": 2}

#: Address families socket() may create: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
SOCKET_FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}

#: ptrace requests allowed: a tracer's operations on a tracee it already has (its own child
#: that called PTRACE_TRACEME, or one it was attached to by following forks), and
#: PTRACE_TRACEME itself. Left out: PTRACE_ATTACH (16) and PTRACE_SEIZE (0x4206), which
#: start tracing a process that did not ask for it, and the two seccomp-filter dumps
#: (0x420c, 0x420d), which need CAP_SYS_ADMIN.
PTRACE_REQUESTS = {
    0: "TRACEME", 1: "PEEKTEXT", 2: "PEEKDATA", 3: "PEEKUSR", 4: "POKETEXT", 5: "POKEDATA",
    6: "POKEUSR", 7: "CONT", 8: "KILL", 9: "SINGLESTEP", 12: "GETREGS", 13: "SETREGS",
    14: "GETFPREGS", 15: "SETFPREGS", 17: "DETACH", 18: "GETFPXREGS", 19: "SETFPXREGS",
    24: "SYSCALL", 25: "GET_THREAD_AREA", 26: "SET_THREAD_AREA", 30: "ARCH_PRCTL", 31: "SYSEMU",
    32: "SYSEMU_SINGLESTEP", 33: "SINGLEBLOCK or PEEKMTETAGS", 34: "POKEMTETAGS",
    0x4200: "SETOPTIONS", 0x4201: "GETEVENTMSG", 0x4202: "GETSIGINFO", 0x4203: "SETSIGINFO",
    0x4204: "GETREGSET", 0x4205: "SETREGSET", 0x4207: "INTERRUPT", 0x4208: "LISTEN",
    0x4209: "PEEKSIGINFO", 0x420A: "GETSIGMASK", 0x420B: "SETSIGMASK", 0x420E: "GET_SYSCALL_INFO",
    0x420F: "GET_RSEQ_CONFIGURATION", 0x4210: "SET_SYSCALL_USER_DISPATCH_CONFIG",
    0x4211: "GET_SYSCALL_USER_DISPATCH_CONFIG",
}

# fmt: on

#: clone() flags that create namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
#: NEWPID, NEWNET): clone is allowed only without any of them, as in the default profile.
CLONE_NAMESPACE_FLAGS = 0x7E020000

#: personality() values allowed, as in the default profile: query (0xffffffff), Linux (0),
#: PER_LINUX32 (8), UNAME26 (0x20000) and both. ADDR_NO_RANDOMIZE is not among them: gdb
#: warns that it cannot turn address randomisation off and runs the program anyway.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

_ERRNO_EPERM = 1
_ERRNO_ENOSYS = 38


def _eq(value: int, index: int = 0) -> dict[str, Any]:
    return {"index": index, "value": value, "op": "SCMP_CMP_EQ"}


def _masked(index: int, mask: int, value: int = 0) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _mode_rules() -> list[dict[str, Any]]:
    """The rules of the calls that may set a mode: allowed only without setuid/setgid bits
    (an open only when it does not create, or creates without them), mknod never of a
    device. Rules of one call are alternatives; the arguments of one rule all hold."""
    allow = "SCMP_ACT_ALLOW"
    rules = [{"names": [n], "action": allow, "args": [_masked(i, SETID_BITS)]} for n, i in MODE_CALLS.items()]
    for name, (flags, mode) in OPEN_CALLS.items():
        rules.append({"names": [name], "action": allow, "args": [_masked(flags, CREATE_FLAGS)]})
        rules.append({"names": [name], "action": allow, "args": [_masked(mode, SETID_BITS)]})
    for name, i in MKNOD_CALLS.items():
        rules += [
            {"names": [name], "action": allow, "args": [_masked(i, 0o170000 | SETID_BITS, t)]} for t in MKNOD_TYPES
        ]
    return rules


def build(runtime: str = "runc") -> dict[str, Any]:
    """The profile for ``runtime``, in the engine's format (the OCI ``linux.seccomp``
    object with names). The two differ in one rule, ``clone3`` (below)."""
    names = sorted({n for group in ALLOWED.values() for n in group})
    rules: list[dict[str, Any]] = [{"names": names, "action": "SCMP_ACT_ALLOW"}]
    rules += [{"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "args": [_eq(r)]} for r in sorted(PTRACE_REQUESTS)]
    rules += [{"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_eq(f)]} for f in sorted(SOCKET_FAMILIES)]
    rules.append({"names": ["socketpair"], "action": "SCMP_ACT_ALLOW", "args": [_eq(1)]})
    rules += _mode_rules()
    rules += [{"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [_eq(p)]} for p in PERSONALITIES]
    rules.append(
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }
    )
    if runtime == "runsc":
        # gVisor applies the profile in its own kernel (runsc --oci-seccomp) but answers
        # every refusal with EPERM, whatever errnoRet says: ENOSYS for clone3 would reach
        # glibc as EPERM, which it does not fall back from, and no thread could start. So
        # clone3 is allowed there: a namespace it makes exists only inside gVisor's kernel.
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"})
        # (openat2 likewise: EPERM would not make a program fall back to openat; the
        # agent's own filter answers it ENOSYS there, see sandbox/agent/modeguard.py.)
        rules.append({"names": ["openat2"], "action": "SCMP_ACT_ALLOW"})
    else:
        # clone3 passes its flags in memory the filter cannot read: ENOSYS (not EPERM)
        # makes glibc and other runtimes fall back to clone, whose flags the rule above checks.
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ERRNO_ENOSYS})
        rules.append({"names": ["openat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ERRNO_ENOSYS})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": _ERRNO_EPERM,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": rules,
    }


@functools.cache
def profile_json(runtime: str = "runc") -> str:
    """The profile as the engine gets it (``security_opt=["seccomp=" + ...]``): compact and
    stable, so that the container's inspected SecurityOpt can be compared with it."""
    return json.dumps(build(runtime), sort_keys=True, separators=(",", ":"))


def digest(runtime: str = "runc") -> str:
    """A short digest of the profile (a container label: a container made with another
    profile is replaced)."""
    return hashlib.sha256(profile_json(runtime).encode()).hexdigest()[:12]


def security_opt(runtime: str = "runc") -> str:
    """The ``security_opt`` entry that gives a container the profile."""
    return "seccomp=" + profile_json(runtime)


def in_security_opt(security_opt_: list[str] | None, runtime: str = "runc") -> bool:
    """Whether a container's inspected ``HostConfig.SecurityOpt`` carries the profile."""
    return security_opt(runtime) in (security_opt_ or [])


if __name__ == "__main__":
    import sys

    print(json.dumps(build(sys.argv[1] if len(sys.argv) > 1 else "runc"), indent=2, sort_keys=True))
