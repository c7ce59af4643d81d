"""The changelog's required behaviour on the real engine (Docker, runc).

The scenarios are the unit-tier ones (imported below, so both tiers run the same
assertions), with ``box`` now a real container sandbox: every before-image read and
every undo write goes through the in-container agent over the bind-mounted workspace.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.base import ExecRequest, Sandbox
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
from tests.unit.test_changelog_exact_undo import (
    test_a_dry_run_touches_nothing,
    test_a_file_made_then_rewritten_in_an_ignored_dir_needs_no_before_image,
    test_a_file_over_the_cap_is_the_only_loss,
    test_a_git_session_is_undone_exactly,
    test_a_made_node_modules_is_one_entry_and_undone,
    test_creations_under_an_existing_ignored_dir_are_one_group,
    test_modes_symlinks_and_changes_of_kind_are_undone,
    test_undo_of_one_command_removes_only_its_creations,
)
from tests.unit.test_changelog_shell import (
    test_a_command_after_a_tool_write_runs_at_once,
    test_a_directory_that_was_there_stays,
    test_a_made_directory_stays_with_what_later_calls_put_in_it,
    test_dir_swapped_for_symlink_before_undo_writes_nothing_outside,
    test_directories_a_command_made_are_undone,
    test_directories_a_command_removed_come_back,
    test_directories_a_tool_write_made_are_not_taken_for_a_command,
    test_noop_command_records_nothing,
    test_outside_change_between_commands_is_not_the_commands,
    test_oversized_and_ignored_are_recorded_not_restorable,
    test_planted_symlink_before_write_reads_nothing_outside,
    test_rename_by_mv_is_one_rename_entry,
    test_same_size_rewrite_within_a_tick_is_caught,
    test_scan_travels_with_the_command_when_watched,
    test_separate_scans_record_the_same,
    test_shell_create_modify_delete_and_undo_exact_bytes,
    test_symlinks_recorded_by_target,
    test_tampered_entry_path_is_refused,
    test_undone_deletion_gets_its_permissions_back,
    test_what_a_command_does_to_a_tool_written_file_is_recorded,
)
from worker.changelog import Changelog, Limits

pytestmark = pytest.mark.docker

__all__ = [
    "test_a_command_after_a_tool_write_runs_at_once",
    "test_a_directory_that_was_there_stays",
    "test_a_dry_run_touches_nothing",
    "test_a_file_made_then_rewritten_in_an_ignored_dir_needs_no_before_image",
    "test_a_file_over_the_cap_is_the_only_loss",
    "test_a_git_session_is_undone_exactly",
    "test_a_made_directory_stays_with_what_later_calls_put_in_it",
    "test_a_made_node_modules_is_one_entry_and_undone",
    "test_binary_bytes_restored_exactly",
    "test_conflict_refused_then_forced",
    "test_create_modify_delete_then_undo_all_leaves_absent",
    "test_create_modify_records_before_image_and_undo_restores",
    "test_creations_under_an_existing_ignored_dir_are_one_group",
    "test_cumulative_diff_and_summary",
    "test_dir_swapped_for_symlink_before_undo_writes_nothing_outside",
    "test_directories_a_command_made_are_undone",
    "test_directories_a_command_removed_come_back",
    "test_directories_a_tool_write_made_are_not_taken_for_a_command",
    "test_dry_run_returns_diff_and_changes_nothing",
    "test_failed_write_marks_entry_failed_and_file_unchanged",
    "test_ids_monotonic_across_reopen",
    "test_modes_symlinks_and_changes_of_kind_are_undone",
    "test_noop_command_records_nothing",
    "test_outside_change_between_commands_is_not_the_commands",
    "test_oversized_and_ignored_are_recorded_not_restorable",
    "test_planted_symlink_before_write_reads_nothing_outside",
    "test_rename_by_mv_is_one_rename_entry",
    "test_same_size_rewrite_within_a_tick_is_caught",
    "test_scan_travels_with_the_command_when_watched",
    "test_separate_scans_record_the_same",
    "test_shell_create_modify_delete_and_undo_exact_bytes",
    "test_storage_outside_workspace",
    "test_subtask_undo_touches_only_its_files",
    "test_symlinks_recorded_by_target",
    "test_tampered_entry_path_is_refused",
    "test_to_entry_reverts_only_later_entries",
    "test_undo_is_itself_recorded_and_redo_by_entry",
    "test_undo_of_one_command_removes_only_its_creations",
    "test_undo_twice_is_noop",
    "test_undone_deletion_gets_its_permissions_back",
    "test_what_a_command_does_to_a_tool_written_file_is_recorded",
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
    module = request.function.__module__
    cap = 1000 if module.endswith("test_changelog_shell") else 4096 if module.endswith("exact_undo") else None
    c = Changelog.open(data_dir, workspace, limits=Limits(max_file_bytes=cap) if cap else None)
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


async def test_change_scan_is_event_driven_for_an_ordinary_user(docker_backend, user_workspace: Path) -> None:
    """inotify works inside the hardened container for a non-root uid with every
    capability dropped (the agent watches its directories through /proc/self/fd)."""
    for i in range(50):
        (user_workspace / f"d{i % 5}").mkdir(exist_ok=True)
        (user_workspace / f"d{i % 5}" / f"f{i}").write_text("x")
    for p in [user_workspace, *user_workspace.rglob("*")]:
        os.chown(p, 1000, 1000)
    box = await docker_backend.get(user_workspace)
    first = await box.scan(".", snapshot="k")
    assert first.full and first.watched
    r = await box.exec(ExecRequest("echo y > d3/new && rm d1/f1"))
    assert r.exit_code == 0
    second = await box.scan(".", snapshot="k", since=first.generation)
    assert second.from_events and not second.full
    assert [e.path for e in second.entries] == ["d3/new"] and second.removed == ["d1/f1"]


async def test_gvisor_scans_by_stat_walk_and_still_records(runtime_backend, tmp_path: Path, workspace: Path) -> None:
    """Under gVisor host-side edits of the bind mount raise no event in the sandbox, so
    the agent never relies on inotify there: the worker scans the workspace on the host
    instead (sandbox/hostscan.py), where both the sandbox's writes and outside edits
    raise events. Shell changes and outside edits are recorded either way."""
    box = await runtime_backend.get(workspace)
    (workspace / "a").write_text("1")
    cl = Changelog.open(tmp_path / "data", workspace)
    try:
        from worker.workspace import Workspace

        ws = Workspace(workspace, box, cl)
        await ws.run_shell(ExecRequest("true"))
        (workspace / "a").write_text("host")  # an outside edit between commands
        r, changed = await ws.run_shell(
            ExecRequest("echo 2 > a && echo n > b && mkdir -p m/n && echo f > m/n/f"), call_id="c"
        )
        assert r.exit_code == 0 and sorted(changed) == ["a", "b", "m/n/f"]
        scan = await box.scan(".", snapshot="probe")
        assert scan.watched is (runtime_backend.spec.runtime == "runc")
        # Event-driven on both runtimes: gVisor's through the host's inotify.
        await box.exec(ExecRequest("echo 3 > c"))
        again = await box.scan(".", snapshot="probe", since=scan.generation)
        assert again.from_events and [e.path for e in again.entries] == ["c"]
        await box.exec(ExecRequest("rm c"))
        await cl.undo(box, call_id="c")
        assert (workspace / "a").read_text() == "host" and not (workspace / "b").exists()
        assert not (workspace / "m").exists()  # the directories the command made are gone too
    finally:
        await cl.aclose()
