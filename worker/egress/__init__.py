"""Network egress by allowlist: a sandbox reaches the hosts its workspace may reach, and
nothing else, through a gateway on the host.

Modules: :mod:`.policy` (the allowlist: patterns, presets, matching), :mod:`.authority`
(``host[:port]``, parsed once for every place the gateway meets one), :mod:`.addresses`
(addresses never dialled), :mod:`.upstream` (resolve, check, connect), :mod:`.tls` (the
server name of a ClientHello), :mod:`.dns` (the sandbox's stub resolver), :mod:`.pump`
(moving an allowed connection's bytes, counted and rate-limited), :mod:`.decide` (every
decision about a connection, from bytes and policy, without a socket), :mod:`.handler`
(one connection from a sandbox: the loop that performs them), :mod:`.gateway` (serving
the workspaces' sockets), :mod:`.log` (the record of every attempt), :mod:`.setup` (wiring
them from the settings).

Secrets (docs/secrets.md): :mod:`.secrets` (what one is: name, value, hosts, template,
placeholder), :mod:`.secretstore` (their files on the host), :mod:`.provision` (what a
sandbox gets for them: placeholders, the trust bundle; each workspace's CA), :mod:`.ca`
(the CA, leaf certificates, the upstream trust store), :mod:`.intercept` (TLS terminated
for the hosts of a workspace's secrets), :mod:`.session` (the HTTP/1.1 of one intercepted
connection, request by request), :mod:`.rewrite` (what is put in a request and masked in
its answer), :mod:`.tlsio` (TLS over a socket with memory BIOs).

Exceptions: :class:`~.policy.EgressPatternError` (a refused allowlist entry, a
``ValueError``), :class:`~.secrets.SecretError` (a refused secret, a ``ValueError``;
never quoting its value), :class:`~.secrets.SecretUnavailable` (a value file unreadable).
Nothing else here raises to the caller: a refused or failed connection is answered to the
sandbox and logged.

Why a gateway of our own and not Squid (Debian's) or a proxy library: the work is in
decisions no proxy makes for us, per connection and per workspace. The resolved address
of every destination is checked against the address policy and then dialled as checked
(no second lookup: no DNS rebinding); DNS is answered only for allowed names and never
forwarded (no exfiltration through lookups); a ClientHello's server name must equal the
CONNECT name; programs that ignore the proxy variables are caught by address on the stub's
loopback addresses; each workspace has its own unix socket (which names the workspace),
allowlist changed live, connection and byte budgets, and a log the API reads. Squid would
need ssl-bump peek-and-splice, external ACL helpers for the address checks, a DNS relay
beside it and a process (or a port) per workspace, and would still dial a name it resolved
itself. What is generic is taken from libraries and the kernel: h11 parses HTTP, the
Public Suffix List bounds wildcards (publicsuffixlist), and bytes move by ``splice``.

Nothing is imported here: the settings need only the policy, and a CLI call that never
opens a networked workspace should not pay for the gateway's imports.
"""
