"""The history of a workspace's tool calls: a journal on the host that every process
using the workspace appends to (:mod:`.journal`), the short redacted record of one call
(:mod:`.brief`; an execution of code's outputs, bounded: :mod:`.outputs`), and its
readers, by page and live (:mod:`.reader`)."""

from .brief import brief_args, call_record, mask_secrets
from .journal import DEFAULT_BYTES, CallJournal, journal_dir
from .outputs import brief_outputs
from .reader import Tail, end_cursor, page

__all__ = [
    "DEFAULT_BYTES",
    "CallJournal",
    "Tail",
    "brief_args",
    "brief_outputs",
    "call_record",
    "end_cursor",
    "journal_dir",
    "mask_secrets",
    "page",
]
