"""``report``'s Markdown: an agent run's fields as a reader wants them."""

from __future__ import annotations

from worker.handoff.report import markdown


def _report(run: dict[str, object]) -> dict[str, object]:
    return {
        "run": run,
        "files": [],
        "skipped": [],
        "commands": [],
        "hosts_reached": [],
        "hosts_refused": [],
        "secrets_used": [],
    }


def test_run_times_are_utc_iso_and_the_cost_in_dollars() -> None:
    text = markdown(
        _report(
            {
                "run_id": "run-1",
                "agent": "claude",
                "exit_code": 3,
                "outcome": "cost",
                "started": 1795931447.4156678,
                "ended": 1795931450.6,
                "turns": 21,
                "cost_usd": 1.199872,
            }
        )
    )
    assert "- **started**: 2026-11-29T05:50:47+00:00\n" in text
    assert "- **ended**: 2026-11-29T05:50:50+00:00\n" in text
    assert "- **cost usd**: $1.1999\n" in text
    assert "- **outcome**: cost\n" in text and "- **exit code**: 3\n" in text


def test_fields_a_run_did_not_have_are_left_out() -> None:
    text = markdown(_report({"run_id": "run-2", "agent": "sh", "cost_usd": None, "version": None}))
    assert "cost" not in text and "version" not in text and "- **agent**: sh\n" in text
