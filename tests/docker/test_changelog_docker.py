"""The changelog's required behaviour on the real engine (Docker, runc).

The scenarios are the unit-tier ones (imported below, so both tiers run the same
assertions), with ``box`` now a real container sandbox: every before-image read and
every undo write goes through the in-container agent over the bind-mounted workspace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.base import Sandbox
from tests.unit.test_changelog import (
    test_binary_bytes_restored_exactly,
    test_conflict_refused_then_forced,
    test_create_modify_delete_then_undo_all_leaves_absent,
    test_create_modify_records_before_image_and_undo_restores,
    test_cumulative_diff_and_summary,
    test_dry_run_returns_diff_and_changes_nothing,
    test_failed_write_marks_entry_failed_and_file_unchanged,
    test_ids_monotonic_across_reopen,
    test_storage_outside_workspace,
    test_subtask_undo_touches_only_its_files,
    test_to_entry_reverts_only_later_entries,
    test_undo_is_itself_recorded_and_redo_by_entry,
    test_undo_twice_is_noop,
)
from tests.unit.test_changelog_shell import (
    test_dir_swapped_for_symlink_before_undo_writes_nothing_outside,
    test_noop_command_records_nothing,
    test_oversized_and_ignored_are_recorded_not_restorable,
    test_planted_symlink_before_write_reads_nothing_outside,
    test_rename_by_mv_is_one_rename_entry,
    test_same_size_rewrite_within_a_tick_is_caught,
    test_shell_create_modify_delete_and_undo_exact_bytes,
    test_symlinks_recorded_by_target,
    test_tampered_entry_path_is_refused,
)
from worker.changelog import Changelog, Limits

pytestmark = pytest.mark.docker

__all__ = [
    "test_binary_bytes_restored_exactly",
    "test_conflict_refused_then_forced",
    "test_create_modify_delete_then_undo_all_leaves_absent",
    "test_create_modify_records_before_image_and_undo_restores",
    "test_cumulative_diff_and_summary",
    "test_dir_swapped_for_symlink_before_undo_writes_nothing_outside",
    "test_dry_run_returns_diff_and_changes_nothing",
    "test_failed_write_marks_entry_failed_and_file_unchanged",
    "test_ids_monotonic_across_reopen",
    "test_noop_command_records_nothing",
    "test_oversized_and_ignored_are_recorded_not_restorable",
    "test_planted_symlink_before_write_reads_nothing_outside",
    "test_rename_by_mv_is_one_rename_entry",
    "test_same_size_rewrite_within_a_tick_is_caught",
    "test_shell_create_modify_delete_and_undo_exact_bytes",
    "test_storage_outside_workspace",
    "test_subtask_undo_touches_only_its_files",
    "test_symlinks_recorded_by_target",
    "test_tampered_entry_path_is_refused",
    "test_to_entry_reverts_only_later_entries",
    "test_undo_is_itself_recorded_and_redo_by_entry",
    "test_undo_twice_is_noop",
]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def box(docker_backend, workspace: Path) -> Sandbox:
    return await docker_backend.get(workspace)


@pytest.fixture
async def cl(request: pytest.FixtureRequest, data_dir: Path, workspace: Path) -> AsyncIterator[Changelog]:
    # The shell scenarios expect a 1000-byte per-file cap (see the unit shell module).
    shell = request.function.__module__.endswith("test_changelog_shell")
    c = Changelog.open(data_dir, workspace, limits=Limits(max_file_bytes=1000) if shell else None)
    yield c
    await c.aclose()


async def test_restarted_container_changes_found_by_full_diff(docker_backend, cl, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    (workspace / "a").write_text("1")
    token = await cl.before_shell(box)
    await docker_backend.stop(workspace)  # container and agent gone: the next scan is a full one
    (workspace / "a").write_text("2")
    (workspace / "b").write_text("new")
    box2 = await docker_backend.get(workspace)
    assert sorted(await cl.after_shell(box2, token, command="(restart)")) == ["a", "b"]
    await cl.undo(box2, all=True)
    assert (workspace / "a").read_text() == "1" and not (workspace / "b").exists()
