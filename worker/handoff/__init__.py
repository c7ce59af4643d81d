"""Hand-off of a workspace session to the next step of a pipeline (issue 43, item 4).

:mod:`.state` reads the session's net changes from the changelog (before-images) and the
sandbox (the files now); :mod:`.gitpatch` renders them as a ``git am``-able patch;
:mod:`.export` commits them on a new branch with the host's git after checking the
repository was not tampered with; :mod:`.report` summarizes the session in Markdown.
"""

from .errors import HandoffError, TamperedError

__all__ = ["HandoffError", "TamperedError"]
