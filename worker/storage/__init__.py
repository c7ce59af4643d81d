"""The worker's own files on the host, written the one safe way: :mod:`.atomic` (a small
file replaced whole, in one step: settings, secrets, keys, records, caches) and
:mod:`.sqlite_wal` (a SQLite connection switched to WAL mode, for the changelog, the
snapshots' index and the tool catalog).

Nothing is imported here: each caller imports the module it uses.
"""
