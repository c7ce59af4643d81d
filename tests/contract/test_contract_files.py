"""read_file, write_file, edit_file through the sandbox (local and Docker backends)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from worker import ToolRegistry


async def test_read_file_whole_and_line_range(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    r = await registry.execute("read_file", {"path": "a.txt"}, workspace)
    assert r.success, r.error
    assert r.output == "one\ntwo\nthree\nfour\n"
    assert r.data is not None and r.data["content"] == r.output and r.data["truncated"] is False
    r = await registry.execute("read_file", {"path": "a.txt", "line_range": [2, 3]}, workspace)
    assert r.success and r.output == "two\nthree\n"
    assert r.data is not None and r.data["total_lines"] == 4
    r = await registry.execute("read_file", {"path": "a.txt", "line_range": [9, 12]}, workspace)
    assert r.success and r.data is not None and r.data["content"] == ""
    assert "has 4 lines" in r.output


async def test_read_file_accepts_absolute_path_inside(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "f.txt").write_text("x")
    r = await registry.execute("read_file", {"path": str(workspace / "d" / "f.txt")}, workspace)
    assert r.success and r.output == "x"
    r = await registry.execute("read_file", {"path": "/workspace/d/f.txt"}, workspace)
    assert r.success and r.output == "x"


async def test_read_file_max_bytes_truncates(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "big.txt").write_text("abcdefghij" * 10)
    r = await registry.execute("read_file", {"path": "big.txt", "max_bytes": 25}, workspace)
    assert r.success and r.data is not None
    assert r.data["truncated"] is True and r.data["content"] == ("abcdefghij" * 3)[:25]
    assert "truncated at 25 bytes of 100" in r.output


async def test_read_file_invalid_utf8_is_replaced(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes(b"caf\xe9 ok\n")
    r = await registry.execute("read_file", {"path": "latin1.txt"}, workspace)
    assert r.success and r.output == "caf\ufffd ok\n"


async def test_read_file_binary_reports_size(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02" + bytes(range(256)) * 4)
    r = await registry.execute("read_file", {"path": "blob.bin"}, workspace)
    assert r.success and r.data is not None
    assert r.data["binary"] is True and r.data["size"] == 7 + 1024
    assert "binary" in r.output and "1031 bytes" in r.output and "\x00" not in r.output


async def test_read_file_errors(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    r = await registry.execute("read_file", {"path": "missing.txt"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error
    r = await registry.execute("read_file", {"path": "nodir/missing.txt"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error
    r = await registry.execute("read_file", {"path": "sub"}, workspace)
    assert not r.success and r.error is not None and "Not a file" in r.error
    r = await registry.execute("read_file", {"path": "."}, workspace)
    assert not r.success and r.error is not None and "Not a file" in r.error


async def test_read_file_empty(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "empty").write_bytes(b"")
    r = await registry.execute("read_file", {"path": "empty"}, workspace)
    assert r.success and r.output == "(empty file)" and r.data is not None and r.data["content"] == ""


async def test_write_file_creates_parents_and_counts_utf8_bytes(registry: ToolRegistry, workspace: Path) -> None:
    content = "héllo → wörld ✓\n"
    r = await registry.execute("write_file", {"path": "new/deep/dir/f.txt", "content": content}, workspace)
    assert r.success, r.error
    assert r.data is not None and r.data["bytes_written"] == len(content.encode()) and r.data["created"] is True
    assert r.files_changed == ["new/deep/dir/f.txt"]
    assert (workspace / "new/deep/dir/f.txt").read_bytes() == content.encode()
    r = await registry.execute("write_file", {"path": "./new/deep/dir/f.txt", "content": "x"}, workspace)
    assert r.success and r.data is not None and r.data["created"] is False
    assert (workspace / "new/deep/dir/f.txt").read_text() == "x"
    leftovers = [p.name for p in (workspace / "new/deep/dir").iterdir()]
    assert leftovers == ["f.txt"]  # the atomic write left no temp file


async def test_write_file_refuses_directory_and_root(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "d").mkdir()
    r = await registry.execute("write_file", {"path": "d", "content": "x"}, workspace)
    assert not r.success and r.error is not None and "Not a file" in r.error
    r = await registry.execute("write_file", {"path": ".", "content": "x"}, workspace)
    assert not r.success and r.error is not None and "Not a file" in r.error
    assert (workspace / "d").is_dir()


async def test_write_file_size_cap(registry: ToolRegistry, workspace: Path) -> None:
    from worker.tools.files import MAX_WRITE_BYTES

    r = await registry.execute("write_file", {"path": "huge", "content": "x" * (MAX_WRITE_BYTES + 1)}, workspace)
    assert not r.success and r.error is not None
    assert "too large" in r.error and str(MAX_WRITE_BYTES) in r.error
    assert not (workspace / "huge").exists()


async def test_edit_file_single_replacement_with_context(registry: ToolRegistry, workspace: Path) -> None:
    lines = [f"line {i}" for i in range(1, 21)]
    (workspace / "m.py").write_text("\n".join(lines) + "\n")
    r = await registry.execute("edit_file", {"path": "m.py", "old_str": "line 10\n", "new_str": "TEN\n"}, workspace)
    assert r.success, r.error
    assert r.files_changed == ["m.py"]
    assert "TEN" in r.output and "line 9" in r.output and "line 11" in r.output and "line 1\n" not in r.output
    assert (workspace / "m.py").read_text().splitlines()[9] == "TEN"


async def test_edit_file_not_found_and_ambiguous(registry: ToolRegistry, workspace: Path) -> None:
    f = workspace / "a.txt"
    f.write_text("foo bar foo\n")
    r = await registry.execute("edit_file", {"path": "a.txt", "old_str": "baz", "new_str": "x"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error
    r = await registry.execute("edit_file", {"path": "a.txt", "old_str": "foo", "new_str": "x"}, workspace)
    assert not r.success and r.error is not None and "appears 2 times" in r.error
    assert f.read_text() == "foo bar foo\n"
    r = await registry.execute(
        "edit_file",
        {"path": "a.txt", "edits": [{"old_str": "foo", "new_str": "x", "replace_all": True}]},
        workspace,
    )
    assert r.success and f.read_text() == "x bar x\n"
    r = await registry.execute("edit_file", {"path": "missing.txt", "old_str": "a", "new_str": "b"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error


async def test_edit_file_edits_apply_in_order(registry: ToolRegistry, workspace: Path) -> None:
    f = workspace / "a.txt"
    f.write_text("alpha\n")
    edits = [{"old_str": "alpha", "new_str": "beta"}, {"old_str": "beta", "new_str": "gamma"}]
    r = await registry.execute("edit_file", {"path": "a.txt", "edits": edits}, workspace)
    assert r.success, r.error
    assert f.read_text() == "gamma\n" and r.data is not None and r.data["edits_applied"] == 2


async def test_edit_file_batch_is_all_or_nothing(registry: ToolRegistry, workspace: Path) -> None:
    f = workspace / "a.txt"
    original = "x = 1\r\ny = 2\r\nnaïve ☃\r\n".encode() + b"\xff\xfe raw\n"
    f.write_bytes(original)
    edits = [
        {"old_str": "x = 1", "new_str": "x = 10"},
        {"old_str": "does not exist", "new_str": "?"},
        {"old_str": "y = 2", "new_str": "y = 20"},
    ]
    r = await registry.execute("edit_file", {"path": "a.txt", "edits": edits}, workspace)
    assert not r.success and r.error is not None and "edit 2" in r.error and "not found" in r.error
    assert f.read_bytes() == original
    assert r.files_changed == []


async def test_edit_file_preserves_crlf_unicode_and_invalid_bytes(registry: ToolRegistry, workspace: Path) -> None:
    f = workspace / "w.txt"
    original = "first\r\nnaïve café ☃ 𝄞\r\nthird\r\n".encode() + b"tail \xc3\x28 invalid\r\n"
    f.write_bytes(original)
    r = await registry.execute("edit_file", {"path": "w.txt", "old_str": "café ☃", "new_str": "CAFÉ ❄"}, workspace)
    assert r.success, r.error
    assert f.read_bytes() == original.replace("café ☃".encode(), "CAFÉ ❄".encode())
    r = await registry.execute("edit_file", {"path": "w.txt", "old_str": "CAFÉ ❄", "new_str": "café ☃"}, workspace)
    assert r.success and f.read_bytes() == original


async def test_edit_file_empty_old_str_creates_missing_file(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("edit_file", {"path": "pkg/new.py", "old_str": "", "new_str": "print(1)\n"}, workspace)
    assert r.success, r.error
    assert r.data is not None and r.data["created"] is True and r.files_changed == ["pkg/new.py"]
    assert (workspace / "pkg/new.py").read_text() == "print(1)\n"


async def test_edit_file_refuses_binary(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "b.bin").write_bytes(b"a\x00b")
    r = await registry.execute("edit_file", {"path": "b.bin", "old_str": "a", "new_str": "c"}, workspace)
    assert not r.success and r.error is not None and "binary" in r.error
    assert (workspace / "b.bin").read_bytes() == b"a\x00b"


async def test_edit_file_keeps_file_mode(registry: ToolRegistry, workspace: Path) -> None:
    f = workspace / "run.sh"
    f.write_text("echo a\n")
    f.chmod(0o755)
    r = await registry.execute("edit_file", {"path": "run.sh", "old_str": "a", "new_str": "b"}, workspace)
    assert r.success and f.stat().st_mode & 0o777 == 0o755


async def test_write_then_read_sha_matches(registry: ToolRegistry, workspace: Path) -> None:
    content = "z" * 5000 + "\n"
    r = await registry.execute("write_file", {"path": "z.txt", "content": content}, workspace)
    assert r.success and r.data is not None
    assert r.data["sha256"] == hashlib.sha256(content.encode()).hexdigest()
    r = await registry.execute("read_file", {"path": "z.txt"}, workspace)
    assert r.data is not None and r.data["sha256"] == hashlib.sha256(content.encode()).hexdigest()
