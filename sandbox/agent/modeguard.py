"""The agent's own seccomp filter: no setuid or setgid bit and no device node is made here.

The workspace is a host directory: a file a command makes setuid keeps its mode on the host,
where any local user who runs it gets the file owner's euid (root's in a root-owned
workspace). The container's own profile (``sandbox.docker.seccomp``) refuses that under runc;
gVisor applies that profile only when registered with ``--oci-seccomp``, which it usually is
not (docs/seccomp.md). So every agent also installs this small filter on itself before it
serves: every process a command starts inherits it, whatever the runtime (gVisor runs
programs' own seccomp filters in its kernel). Filters stack; the strictest answer wins.

Refused with EPERM:

- ``chmod``/``fchmod``/``fchmodat``/``fchmodat2`` and ``creat`` with S_ISUID or S_ISGID in
  the mode; ``open``/``openat`` with O_CREAT or O_TMPFILE and those bits (the mode is only
  read then, so an open without them is never refused for what its mode register holds);
- ``mknod``/``mknodat`` of a character or block device, or with those bits (devices need
  CAP_MKNOD, which no sandbox has: this is the second lock).

Calls of another ABI (i386, x32) pass this filter: the engine's profile refuses them under
runc, and gVisor has no such table at all.

``openat2`` answers ENOSYS: its mode lives in memory a filter cannot read, and every libc and
runtime falls back to ``openat`` on ENOSYS. File capabilities (``security.capability``) need
CAP_SETFCAP, which no sandbox holds; the host removes anything that arrives anyway
(``worker.guard``).

Standard library only (ctypes); where the filter cannot be installed (an unknown
architecture, no libc), :func:`install` says so and the host's check is what remains.
"""

import ctypes
import os
import struct

S_ISUID_GID = 0o6000
O_CREAT = 0o100
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE (O_TMPFILE also sets O_DIRECTORY)
S_IFMT = 0o170000
S_IFCHR = 0o020000
S_IFBLK = 0o060000

# AUDIT_ARCH_*, seccomp's own number, and the calls: name -> (number, mode argument, flags argument)
ARCHES = {
    "x86_64": (
        0xC000003E,
        317,  # seccomp(2) itself
        {
            "chmod": (90, 1, None),
            "fchmod": (91, 1, None),
            "fchmodat": (268, 2, None),
            "fchmodat2": (452, 2, None),
            "creat": (85, 1, None),
            "open": (2, 2, 1),
            "openat": (257, 3, 2),
            "mknod": (133, 1, None),
            "mknodat": (259, 2, None),
            "openat2": (437, None, None),
        },
    ),
    "aarch64": (
        0xC00000B7,
        277,
        {
            "fchmod": (52, 1, None),
            "fchmodat": (53, 2, None),
            "fchmodat2": (452, 2, None),
            "openat": (56, 3, 2),
            "mknodat": (33, 2, None),
            "openat2": (437, None, None),
        },
    ),
}

_LD_W_ABS = 0x20
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1
_ENOSYS = 38
_X32_BIT = 0x40000000


def _arg(index):
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (both
    architectures are little-endian)."""
    return 16 + 8 * index


def program(machine=None):
    """The filter for ``machine`` (default: this one's) as a list of (code, jt, jf, k), or
    None for an architecture it does not know."""
    arch = ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    audit_arch, _seccomp_nr, calls = arch
    # Symbolic program: ("jump", code, k, true_label, false_label) or plain tuples;
    # labels are resolved to forward offsets below.
    # A call of another ABI (i386, x32: their numbers differ) is left to what refuses those
    # already: the engine's profile under runc, gVisor's lack of any 32-bit table.
    prog = [
        (_LD_W_ABS, 0, 0, 4),
        ("j", _JEQ_K, audit_arch, "next", "allow"),
        (_LD_W_ABS, 0, 0, 0),
        ("j", _JGE_K, _X32_BIT, "allow", "next"),
    ]
    for name, (nr, mode_arg, flags_arg) in sorted(calls.items()):
        end = "end_" + name
        prog.append(("j", _JEQ_K, nr, "next", end))
        if mode_arg is None:
            prog.append((_RET_K, 0, 0, _RET_ERRNO | _ENOSYS))
        elif name.startswith("mknod"):
            prog += [
                (_LD_W_ABS, 0, 0, _arg(mode_arg)),
                (_ALU_AND_K, 0, 0, S_IFMT),
                ("j", _JEQ_K, S_IFCHR, "deny", "next"),
                ("j", _JEQ_K, S_IFBLK, "deny", "next"),
                (_LD_W_ABS, 0, 0, _arg(mode_arg)),
                ("j", _JSET_K, S_ISUID_GID, "deny", "allow"),
            ]
        else:
            if flags_arg is not None:
                prog += [
                    (_LD_W_ABS, 0, 0, _arg(flags_arg)),
                    ("j", _JSET_K, O_CREAT | O_TMPFILE_BIT, "next", "allow"),
                ]
            prog += [
                (_LD_W_ABS, 0, 0, _arg(mode_arg)),
                ("j", _JSET_K, S_ISUID_GID, "deny", "allow"),
            ]
        prog.append(("label", end))
    prog += [("label", "allow"), (_RET_K, 0, 0, _RET_ALLOW), ("label", "deny"), (_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    return _resolve(prog)


def _resolve(prog):
    where = {}
    out = []  # type: list
    for item in prog:
        if item[0] == "label":
            where[item[1]] = len(out)
        else:
            out.append(item)
    final = []
    for i, item in enumerate(out):
        if item[0] == "j":
            _, code, k, t, f = item
            jt = 0 if t == "next" else where[t] - i - 1
            jf = 0 if f == "next" else where[f] - i - 1
            if not (0 <= jt < 256 and 0 <= jf < 256):
                raise ValueError("seccomp jump out of range")
            final.append((code, jt, jf, k))
        else:
            final.append(item)
    return final


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install():
    """Install the filter on this process (and so on everything it starts). Returns None, or
    why it could not (the agent reports it; it goes on serving)."""
    prog = program()
    if prog is None:
        return "no filter for architecture " + os.uname().machine
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = _Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # PR_SET_NO_NEW_PRIVS (the engine sets it already; needed for a filter without
        # CAP_SYS_ADMIN), then seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC):
        # every thread of the agent gets it, also one started before.
        if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            return "prctl(PR_SET_NO_NEW_PRIVS): errno %d" % ctypes.get_errno()
        nr = ARCHES[os.uname().machine][1]
        if libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(1), ctypes.c_ulong(1), ctypes.byref(fprog)) != 0:
            return "seccomp(SECCOMP_SET_MODE_FILTER): errno %d" % ctypes.get_errno()
    except Exception as e:  # no libc to call: the host's check remains
        return "cannot install: %s" % e
    return None
