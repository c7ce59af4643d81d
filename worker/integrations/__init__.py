"""Optional extras that speak another project's API, each installed with its own extra
(``pip install 'loom-worker[ray]'``): :mod:`.ray`, workspaces spread over a Ray cluster.

The core never imports this package (``tests/unit/test_import_graph.py`` checks it): a
core command that offers an integration (``loom-worker serve --ray``, ``loom-worker
cluster``) finds it by its entry point (group ``loom_worker.integrations``, see
:func:`worker.plugins.integration`), so nothing of it, nor the project it speaks to, is
imported unless it is used.
"""
