"""loom-worker sandbox agent: the one program that runs inside every sandbox container.

Standard library only, Python >= 3.8, one piece on the wire: the host bundles this package
(``sandbox.bundle``) and sends it over the container's attached stream when it opens a
connection (see ``sandbox.connection``), so any image can be a sandbox image (the agent
runs on the mounted runtime's interpreter) and agent and worker always match.

Wire format: newline-delimited JSON on stdin/stdout. The first line is a config object;
then each request ``{"id": N, "op": "...", ...}`` gets exactly one response
``{"id": N, "ok": true, "result": {...}}`` or ``{"id": N, "ok": false, "code": "...",
"error": "..."}``; a notification (an op of ``main.NOTIFY_OPS`` sent without an id) gets
none. Events the host did not ask for one by one (a spawned process's output, a
streamed command's output, a tunnel's bytes) are ``{"event": ..., ...}`` lines naming
what they belong to (``proc``, ``req``, ``tunnel``). Bytes travel base64-encoded, but
large ones (a tunnel's, a write's content or a command's stdin, a read's data or a
command's output when the host asks): raw, after a line announcing them (``"raw": N``,
see ``channel``).
Requests are served concurrently (slow ops on threads); at most one ``exec`` runs at a
time per agent, because the agent is the *child subreaper* of everything the command
starts and kills that whole subtree when the command ends or times out (that is how
``setsid``, double forks and ``nohup &`` are caught: their orphans are re-parented to
this process, never to PID 1).

Paths are resolved here, component by component from an O_PATH descriptor of the
workspace root, never following ``..`` or a symlink out of it; FIFOs, sockets and devices
are refused *before* any open that could block.

The modules, each importing only those above it (no cycles)::

    state      the config line's values and process-wide facts (read as ``state.X``)
    modeguard  the agent's own seccomp filter: no setuid/setgid bit, no device node
    errors     Refused, and how any exception becomes an error answer
    activity   the idle clock: touch on requests, the keeper that ends an idle container
    channel    framing (JSON lines with the secret, base64) and where answers go: stdout,
               or the direct unix socket once the host takes it
    paths      resolution from the root's descriptor, never leaving the workspace
    dirstack   the open directories of an iterative walk (any depth, bounded descriptors)
    tidy       the thread that does what may wait until after an answer
    disk       the workspace disk's reserve, and DiskWatch for commands
    files      read, stat, hash
    write      atomic and staged writes (their content in pieces: append), commit, abort
    sysfiles   a harness's files anywhere in the sandbox, as its user: fs_read, fs_write
    tree       remove, remove_tree, mkdir, chmod, symlink
    fsops      a harness's directories anywhere: fs_stat, fs_list, fs_mkdir, fs_move, fs_remove
    listing    list
    scanwalk   the stat-only walk of change scans;  snapshot: inotify-backed snapshots
    scan       scan (also run on the host for gVisor, see ``sandbox.hostscan``)
    cgroup     CPU quota and use, OOM kills
    environ    the environment and cwd of processes started for the host
    proctree   finding and killing what a command started; helpers spared from it
    output     Capped: a stream's head and tail within a bound
    search     ripgrep or Python
    launch     what a command needs around Popen: a long one's script file, stdin, a
               start that failed
    command    exec
    spawn      long-lived processes with streamed stdio
    supervisor the program that owns one background process or terminal (run apart from the agent)
    processes  background processes: start (on a pty: a terminal), output, input, kill, signal,
               resize, list, attach (via supervisors)
    relay      the egress relay: the sandbox's loopback doors to the host's gateway socket
    handover   the fd channel: a tunnel's socket handed to the host itself (runc)
    tunnel     TCP connections to the sandbox's loopback, relayed over the channel
    fswatch    a directory watched with inotify, its events streamed to the host
    main       the hello, dispatch, worker threads, the serve loop, the end of the agent

Values that ``main`` used to rebind as globals live in ``state`` and are read at call
time, never copied with ``from .state import X``; what belongs to one concern (staged
writes, snapshots, spawned processes, the output target) stays in its module.

Importing this package does nothing: the host imports single modules of it (the scan and
tree code for ``sandbox.hostscan``; the tests), and in a sandbox the bundle runs ``main``.
``python3 -m sandbox.agent ROOT`` runs an agent by hand, requests on stdin.
"""
