"""``python -m worker.cli``: the same as the ``loom-worker`` command."""

from . import main

raise SystemExit(main())
