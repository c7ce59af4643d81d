"""Errors raised on a node reach the driver as they were raised there.

Ray (and the node's call channel, :mod:`.channel`) pickle what a node raises. Python
pickles an exception by calling its class again with ``args``, which fails for the
errors whose ``__init__`` takes other arguments than the message (``SettingsError(field,
message)``, ``UndoConflictError(message, conflicts)``, ``SnapshotInUseError(message,
forks)``...): Ray then hands the driver an ``UnserializableException`` instead, and the
front door would answer 500 where the local service answers 422 or 409. :func:`portable`
registers, once per such class and only in the node's process, a reducer that rebuilds
the error from its ``args`` and attributes without calling ``__init__``; the driver needs
nothing but this module to unpickle it.
"""

from __future__ import annotations

import copyreg
import pickle
from typing import Any

_checked: set[type[BaseException]] = set()


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    e = cls.__new__(cls, *args)
    e.args = args
    e.__dict__.update(state)
    return e


def _reduce(e: BaseException) -> tuple[Any, ...]:
    return _rebuild, (type(e), e.args, dict(e.__dict__))


def portable(e: BaseException) -> BaseException:
    """``e``, its class made picklable first when pickle cannot rebuild it as it is."""
    cls = type(e)
    if cls not in _checked:
        _checked.add(cls)
        try:
            back = pickle.loads(pickle.dumps(e))
            same = type(back) is cls and back.args == e.args and vars(back) == vars(e)
        except Exception:
            same = False
        if not same:
            copyreg.pickle(cls, _reduce)
    return e
