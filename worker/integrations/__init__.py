"""Optional extras that speak another project's API, each installed with its own extra:
:mod:`.ray`, workspaces spread over a Ray cluster (``pip install 'loom-worker[ray]'``);
:mod:`.inspect`, loom-worker as an inspect_ai sandbox (``pip install 'loom-worker[inspect]'``).

The core never imports this package (``tests/unit/test_import_graph.py`` checks it): a
core command that offers an integration (``loom-worker serve --ray``, ``loom-worker
cluster``) finds it by its entry point (group ``loom_worker.integrations``, see
:func:`worker.plugins.integration`), and inspect_ai finds its provider by its own entry
point (group ``inspect_ai``), so nothing of one, nor the project it speaks to, is imported
unless it is used.
"""
