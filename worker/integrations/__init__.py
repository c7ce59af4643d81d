"""Optional extras that speak another project's API (the inspect_ai sandbox provider).

Nothing in the core imports this package (a test holds that): each extra depends on its
project's package, installed with its extra (``pip install 'loom-worker[inspect]'``),
and is found by that project through its own entry point.
"""
