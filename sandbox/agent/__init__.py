"""loom-worker sandbox agent: the one program that runs inside every sandbox container.

Standard library only, Python >= 3.8, one piece on the wire: the host bundles this package
(``sandbox.bundle``) and sends it over the container's attached stream when it opens a
connection (see ``sandbox.connection``), so any image can be a sandbox image (the agent
runs on the mounted runtime's interpreter) and agent and worker always match.

Wire format: newline-delimited JSON on stdin/stdout. The first line is a config object;
then each request ``{"id": N, "op": "...", ...}`` gets exactly one response
``{"id": N, "ok": true, "result": {...}}`` or ``{"id": N, "ok": false, "code": "...",
"error": "..."}``. Bytes travel base64-encoded. Requests are served concurrently (slow ops
on threads); at most one ``exec`` runs at a time per agent, because the agent is the
*child subreaper* of everything the command starts and kills that whole subtree when the
command ends or times out (that is how ``setsid``, double forks and ``nohup &`` are
caught: their orphans are re-parented to this process, never to PID 1).

Paths are resolved here, component by component from an O_PATH descriptor of the
workspace root, never following ``..`` or a symlink out of it; FIFOs, sockets and devices
are refused *before* any open that could block.

Importing this package does nothing: the host imports single modules of it (the scan code,
for gVisor's host-side scans in ``sandbox.hostscan``), and the agent runs ``main``.
"""
