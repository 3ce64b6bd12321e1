"""A run's outcome carries its exit code: one map, used by the leader, metrics.json, the API
and the CLI, and the one docs/faults.md documents (fast tier)."""

from __future__ import annotations

import json
import signal

from hogwild import Status
from hogwild.errors import EXIT_FAILED, EXIT_FAULT, EXIT_WRITE
from tests.conftest import REPO


def test_each_outcome_has_its_documented_exit_code() -> None:
    assert {s.value: s.exit_code for s in Status} == {
        "ok": 0, "SIGINT": 130, "SIGTERM": 143, "failed": 3, "training_failed": 4, "write_failed": 5}
    rows = [line.split("|")[1].strip() for line in (REPO / "docs" / "faults.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()]
    documented = {int(code) for row in rows for code in row.split(" / ")}
    assert {s.exit_code for s in Status} <= documented, documented


def test_a_signal_wins_over_a_fault_and_a_fault_is_named_by_its_code() -> None:
    assert Status.of(signal.SIGTERM, "a worker died") is Status.SIGTERM
    assert Status.of(signal.SIGINT, None) is Status.SIGINT
    assert Status.of(None, None) is Status.OK
    assert Status.of(None, "lost a peer", EXIT_FAULT) is Status.FAILED
    assert Status.of(None, "diverged", EXIT_FAILED) is Status.TRAINING_FAILED
    assert Status.of(None, "disk full", EXIT_WRITE) is Status.WRITE_FAILED


def test_metrics_json_and_callers_read_the_plain_word() -> None:
    assert json.loads(json.dumps({"status": Status.TRAINING_FAILED})) == {"status": "training_failed"}
    assert Status.OK == "ok" and str(Status.SIGTERM) == "SIGTERM"
