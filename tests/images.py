"""Throwaway images of a test: removed afterwards without touching anyone else's.

A throwaway tag often names the same image as a shared one (the classic builder's cache
gives an unchanged build the same id): ``docker rmi`` then only removes the tag. Only when
it deleted the image itself is the agent runtime volume the worker made from it removed too.
"""

from __future__ import annotations

import subprocess


def remove_image(tag: str) -> None:
    """Remove ``tag`` (nothing when it is not there); see the module's docstring."""
    image_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True
    ).stdout.strip()
    if not image_id:
        return
    out = subprocess.run(["docker", "rmi", tag], capture_output=True, text=True).stdout
    if f"Deleted: {image_id}" in out:
        volume = "loom-agent-runtime-" + image_id.split(":")[-1][:12]
        subprocess.run(["docker", "volume", "rm", volume], capture_output=True)
