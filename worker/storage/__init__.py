"""The worker's own files on the host, written the one safe way: :mod:`.sqlite_wal` (a
SQLite connection switched to WAL mode, for the changelog, the snapshots' index and the
tool catalog).

Nothing is imported here: each caller imports the module it uses.
"""
