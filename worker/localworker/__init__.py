"""The CLI's local worker: a per-user process that keeps the registry, the changelogs and
the agents' connections warm between ``loom-worker call`` invocations.

::

    loom-worker call ──(unix socket, 0600, in a 0700 directory of this uid)──► local worker
        client.py: connect, or start one and wait      server.py: the same registry as
        for it; on any doubt before the request is     in-process, one task per call,
        sent, the call runs in-process (calls.py)      exits when idle or out of date

- :mod:`.identity` the key: uid, groups, umask, the code's identity and the settings'
  environment; two invocations share a worker only when they would behave the same;
- :mod:`.rundir` the private directory of this user's workers (``$XDG_RUNTIME_DIR`` when
  it is ours, else ``/tmp/loom-worker-<uid>``), created and checked without following links;
- :mod:`.wire` newline-delimited JSON frames, several per request (logs, then a result);
- :mod:`.calls` how a CLI call runs against a registry, shared by both paths;
- :mod:`.client` the CLI side (standard library only: it runs on every call);
- :mod:`.server` and :mod:`.daemon_logs` the worker itself.

The worker is never needed for correctness: whatever keeps it from starting or answering
before the request is sent, the CLI runs the call itself. Nothing here is imported by
library code.
"""
