"""A :class:`~worker.result.ToolResult` as each surface's content: the text a model reads,
and its images (``ToolResult.images``) where the format has image content.

==========================  ===============================  ==================================
surface                     text                             each image of ``result.images``
==========================  ===============================  ==================================
MCP ``tools/call``          a ``TextContent``                an ``ImageContent`` (``data``,
                                                             ``mimeType``) after the text
Anthropic ``tool_result``   a ``text`` block                 an ``image`` block (``source``:
                                                             base64, ``media_type``, ``data``)
OpenAI tool message         the text                         none: a Chat Completions tool
(``.../tool_calls``)                                         message is text; the text names
                                                             each image (``[image/png 640x480]``)
HTTP ``.../execute``,       ``output``, ``error``            ``images``: ``{mime_type, data,
SSE ``result``, CLI JSON                                     width, height}`` (when any)
==========================  ===============================  ==================================

The text is :func:`tool_text` everywhere (the output, with the error first when the output
does not already say it). Every surface builds its content here, so an image reaches each
the same way.
"""

from __future__ import annotations

from typing import Any

from .result import ToolResult


def tool_text(result: ToolResult) -> str:
    """The text a model reads for one result: the output, with the error first when the
    output does not already say it."""
    if result.success or not result.error:
        return result.output
    if result.error in result.output:
        return result.output
    return f"Error: {result.error}\n{result.output}".rstrip("\n")


def mcp_content(result: ToolResult, text: str | None = None) -> list[dict[str, Any]]:
    """The ``content`` of an MCP ``CallToolResult`` in its wire form: the text
    (``text``, default :func:`tool_text`), then one ``image`` per image."""
    out: list[dict[str, Any]] = [{"type": "text", "text": tool_text(result) if text is None else text}]
    out.extend({"type": "image", "data": i.data, "mimeType": i.mime_type} for i in result.images)
    return out


def anthropic_content(result: ToolResult, text: str | None = None) -> list[dict[str, Any]]:
    """The ``content`` of an Anthropic ``tool_result`` block: a ``text`` block (``text``,
    default :func:`tool_text`; none when empty), then one base64 ``image`` block per image."""
    body = tool_text(result) if text is None else text
    out: list[dict[str, Any]] = [{"type": "text", "text": body}] if body else []
    out.extend(
        {"type": "image", "source": {"type": "base64", "media_type": i.mime_type, "data": i.data}}
        for i in result.images
    )
    return out


def anthropic_tool_result(tool_use_id: str, result: ToolResult, text: str | None = None) -> dict[str, Any]:
    """The ``tool_result`` block answering ``tool_use_id`` (``is_error`` when it failed),
    images included (:func:`anthropic_content`)."""
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": anthropic_content(result, text),
        "is_error": not result.success,
    }


__all__ = ["anthropic_content", "anthropic_tool_result", "mcp_content", "tool_text"]
