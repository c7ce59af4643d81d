"""What a tool call may ask for, judged on the host before it reaches the sandbox (the
registry's "policy" step): :mod:`.paths` (the lexical path check, a fast first filter;
the agent resolves every path again in the container) and :mod:`.shell` (the blocklist of
commands that are almost always a model's mistake: a courtesy, not the boundary), over
:mod:`.shellwords` (its linear-time tokenizer).

Nothing is imported here: each caller imports the module it uses.
"""
