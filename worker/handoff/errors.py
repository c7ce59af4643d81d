"""Errors of the hand-off commands."""

from __future__ import annotations


class HandoffError(Exception):
    """A hand-off cannot be made (a message says why)."""


class TamperedError(HandoffError):
    """The repository's hooks or config changed during the session: the host's git is not
    run there. ``changes`` names each change found."""

    def __init__(self, changes: list[str]) -> None:
        self.changes = changes
        super().__init__(
            "the repository was changed where git on the host would run what it says, during the session: "
            + "; ".join(changes)
        )
