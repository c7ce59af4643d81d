"""tinycalc: evaluate arithmetic expressions safely (no eval)."""

from .ops import add, div, mul, sub
from .parser import evaluate

__all__ = ["add", "div", "evaluate", "mul", "sub"]
__version__ = "1.2.0"
