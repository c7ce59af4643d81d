"""The dangerous-command blocklist: a courtesy, not the boundary.

The container (no network, capped resources, only the workspace mounted) is what keeps a
command from hurting the host. This list only stops commands that are almost always a
mistake when a model types them: wiping ``/`` or ``~``, formatting a disk, writing to a
raw device, opening up ``/`` with ``chmod -R 777``, and piping a download into a shell.

Commands are split into simple commands by :mod:`worker.policy.shellwords` (shlex's tokens, in
linear time: ``;``, ``&&``, ``||``, ``|``, ``&``, ``$( )``, backticks, newlines), wrappers
such as ``sudo``/``env``/``nohup`` are looked through, and ``sh -c '...'`` strings are
checked recursively; a few regexes on the raw text cover what does not tokenize
(unbalanced quotes). Everything here is linear in the command's length.
"""

from __future__ import annotations

import functools
import re

from ..tool import PolicyError
from . import shellwords

_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "busybox"}
_INTERPRETERS = _SHELLS | {"python", "python3", "perl", "ruby", "node", "php"}
_DOWNLOADERS = {"curl", "wget", "fetch", "aria2c"}
_WRAPPERS = {
    "sudo",
    "doas",
    "command",
    "exec",
    "nohup",
    "time",
    "env",
    "nice",
    "ionice",
    "builtin",
    "then",
    "do",
    "else",
    "if",
    "while",
    "until",
    "!",
    "xargs",
    "timeout",
    "stdbuf",
}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "`", "{", "}", ";;", "|&", "$"}
_REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<>", ">&"}
#: Device files that are fine to write to.
_SAFE_DEVICES = re.compile(r"^/dev/(null|zero|stdout|stderr|tty|fd/\d+)$")
#: Targets whose recursive removal (or chmod) is refused.
_ROOT_TARGETS = re.compile(r"^(/+\.?/*|/+\*|~/?\*?|\$\{?HOME\}?/?\*?|/+\.\./?\.*)$")

#: Rules on the raw text, for what does not tokenize (unbalanced quotes). Each has the
#: words it needs: a command holding none of them is not searched (a substring test runs
#: at memory speed, a regular expression that cannot start with a literal does not: a
#: 1 MiB command took ~0.1 s here before).
_RAW_RULES: list[tuple[tuple[str, ...], re.Pattern[str], str]] = [
    (
        ("curl", "wget", "fetch"),
        re.compile(r"\b(curl|wget|fetch)\b[^|;&]*\|\s*(sudo\s+)?(\S*/)?(ba|z|da|k|mk|fi|tc|c)?sh\b"),
        "piping a download into a shell runs unreviewed remote code",
    ),
    (
        ("<(",),
        re.compile(r"\b(ba|z|da|k)?sh\s+(-\w+\s+)*<\(\s*(curl|wget)\b"),
        "running a downloaded script in a shell runs unreviewed remote code",
    ),
    (("mkfs",), re.compile(r"(^|[\s;&|(`])mkfs(\.\w+)?\b"), "mkfs formats a filesystem"),
]
#: Writing to a device: found from each ``/dev/<name>`` that is not a harmless one (a
#: literal, fast to find), then the redirection just before it.
_DEVICE = re.compile(r"/dev/(?!(null|zero|stdout|stderr|tty|fd/\d+)\b)\w")
_REDIRECT_BEFORE = re.compile(r"(^|[^<&0-9])\d?>{1,2}\|?\s*\Z")
#: How far before a device name its redirection is looked for.
_REDIRECT_WINDOW = 4096


def _raw_refusal(command: str) -> str | None:
    """Why a raw-text rule refuses ``command``, or None. Linear in its length."""
    for needles, rx, why in _RAW_RULES:
        if any(n in command for n in needles) and rx.search(command):
            return why
    if "/dev/" in command:
        for m in _DEVICE.finditer(command):
            start = m.start()
            if _REDIRECT_BEFORE.search(command, max(0, start - _REDIRECT_WINDOW), start):
                return "writing to a device file"
    return None


#: A command made only of these characters has nothing that quotes, escapes, separates,
#: expands or comments: it splits exactly where ``str.split`` does.
_PLAIN = re.compile(r"[A-Za-z0-9_./:=+,@%~ -]*")


def _tokens(command: str) -> list[str] | None:
    """The command's words and operators; None for unbalanced quotes (left to the raw rules)."""
    if _PLAIN.fullmatch(command):
        return command.split()
    return shellwords.split(command)


def _simple_commands(tokens: list[str]) -> list[tuple[list[str], bool]]:
    """Split tokens into simple commands; the flag says the command's output is piped on."""
    out: list[tuple[list[str], bool]] = []
    cur: list[str] = []
    for tok in tokens:
        if tok in _SEPARATORS:
            if cur:
                out.append((cur, tok in ("|", "|&")))
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append((cur, False))
    return out


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _strip_wrappers(argv: list[str]) -> list[str]:
    i = 0
    while i < len(argv):
        word = argv[i]
        base = word.rsplit("/", 1)[-1]
        if _ASSIGNMENT.match(word):
            i += 1
        elif base in _WRAPPERS:
            i += 1
            # Options of the wrapper itself (sudo -u root, nice -n 5, timeout 10).
            while i < len(argv) and (argv[i].startswith("-") or argv[i].isdigit()):
                if argv[i] in ("-u", "-g", "-n", "-s", "-k") and i + 1 < len(argv):
                    i += 1
                i += 1
        else:
            break
    return argv[i:]


def _flags(args: list[str]) -> tuple[set[str], list[str]]:
    """Short flags as single letters and long flags as words; the rest are operands."""
    flags: set[str] = set()
    operands: list[str] = []
    end = False
    for a in args:
        if end or not a.startswith("-") or a == "-":
            operands.append(a)
        elif a == "--":
            end = True
        elif a.startswith("--"):
            flags.add(a[2:].split("=", 1)[0])
        else:
            flags.update(a[1:])
    return flags, operands


def _runs_stdin(prog: str, args: list[str]) -> bool:
    """Whether ``prog args`` executes what it reads on stdin (``python3 -m json.tool`` does not)."""
    if prog in _SHELLS:
        return True
    flags, operands = _flags(args)
    return not (flags & {"m", "c", "e"}) and (not operands or operands[0] == "-")


def _check_simple(argv: list[str], piped: bool, prev_download: bool, depth: int) -> None:
    argv = _strip_wrappers(argv)
    if not argv:
        return
    prog = argv[0].rsplit("/", 1)[-1]
    args = argv[1:]
    if prog == "rm":
        flags, operands = _flags(args)
        recursive = bool(flags & {"r", "R", "recursive"})
        if recursive and any(_ROOT_TARGETS.match(o) for o in operands):
            raise PolicyError("refusing a recursive rm of / or the home directory")
        if "no-preserve-root" in flags:
            raise PolicyError("refusing rm --no-preserve-root")
    elif prog.startswith("mkfs") or prog in ("mke2fs", "wipefs"):
        raise PolicyError(f"refusing {prog}: it formats a filesystem")
    elif prog == "dd":
        for a in args:
            if a.startswith("of=/dev/") and not _SAFE_DEVICES.match(a[3:]):
                raise PolicyError("refusing dd onto a device file")
    elif prog in ("chmod", "chown", "chgrp"):
        flags, operands = _flags(args)
        if flags & {"R", "recursive"} and any(_ROOT_TARGETS.match(o) for o in operands):
            raise PolicyError(f"refusing a recursive {prog} of / or the home directory")
    elif prog in _INTERPRETERS and prev_download and _runs_stdin(prog, args):
        raise PolicyError(f"refusing to pipe a download into {prog}: it runs unreviewed remote code")
    if prog in _SHELLS and depth < 4:
        for i, a in enumerate(args[:-1]):
            if a.startswith("-") and not a.startswith("--") and "c" in a:
                _check(args[i + 1], depth + 1)
                break


def _check(command: str, depth: int) -> None:
    why = _raw_refusal(command)
    if why is not None:
        raise PolicyError(f"refusing the command: {why}")
    tokens = _tokens(command)
    if tokens is None:
        return
    for i, tok in enumerate(tokens[:-1]):
        if tok in _REDIRECTS or (tok == ">" and i + 1 < len(tokens)):
            target = tokens[i + 1]
            if target.startswith("/dev/") and not _SAFE_DEVICES.match(target):
                raise PolicyError("refusing to write to a device file")
    prev_download = False
    for argv, piped in _simple_commands(tokens):
        _check_simple(argv, piped, prev_download, depth)
        prog = (_strip_wrappers(argv) or [""])[0].rsplit("/", 1)[-1]
        prev_download = piped and (prog in _DOWNLOADERS or (prev_download and prog not in _INTERPRETERS))


def check_command(command: str) -> None:
    """Refuse a command on the blocklist.

    Raises PolicyError, whose message starts with "Safety violation".
    """
    if len(command) > _MEMO_MAX_CHARS:
        _check(command, 0)
        return
    refusal = _verdict(command)
    if refusal is not None:
        raise PolicyError(refusal)


#: Agents run the same commands again and again (tests, status, listings): verdicts of
#: commands up to this size are remembered (the check is a pure function of the text).
_MEMO_MAX_CHARS = 2048


@functools.lru_cache(maxsize=1024)
def _verdict(command: str) -> str | None:
    try:
        _check(command, 0)
    except PolicyError as e:
        return e.message
    return None
