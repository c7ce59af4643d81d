"""Network egress by allowlist: a sandbox reaches the hosts its workspace may reach, and
nothing else, through a gateway on the host.

Modules: :mod:`.policy` (the allowlist: patterns, presets, matching), :mod:`.addresses`
(addresses never dialled), :mod:`.upstream` (resolve, check, connect), :mod:`.tls` (the
server name of a ClientHello), :mod:`.dns` (the sandbox's stub resolver), :mod:`.pump`
(moving an allowed connection's bytes, counted and rate-limited), :mod:`.handler` (one
connection from a sandbox), :mod:`.gateway` (serving the workspaces' sockets), :mod:`.log`
(the record of every attempt), :mod:`.setup` (wiring them from the settings).

Exceptions: :class:`~.policy.EgressPatternError` (a refused allowlist entry, a
``ValueError``). Nothing else here raises to the caller: a refused or failed connection is
answered to the sandbox and logged.

Nothing is imported here: the settings need only the policy, and a CLI call that never
opens a networked workspace should not pay for the gateway's imports.
"""
