"""``python -P -m worker.localworker --key K``: a local worker, as the CLI starts one."""

from .server import main

raise SystemExit(main())
