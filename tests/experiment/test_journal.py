"""experiment.journal: every line of the state logs sealed so far reads as its typed entry,
and an entry written back gives the same bytes; what is not an entry is refused by name."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json
from tokrecord.experiment.journal import (
    IdleGap,
    LegEnd,
    Preregistered,
    TornJsonl,
    parse_entries,
    parse_entry,
)


def _logs() -> dict[str, list[dict[str, Any]]]:
    logs = {"v1-record": [json.loads(line) for line in (
        ROOT / "tests" / "fixtures" / "v1-record" / "abba" / "experiment.jsonl").read_text(
            encoding="utf-8").splitlines() if line]}
    for name in ("exp-draft", "exp-graphs"):
        with tarfile.open(ROOT / "examples" / "h200" / f"{name}.tar.gz") as tar:
            member = tar.extractfile(f"{name}/experiment.jsonl")
            assert member is not None
            logs[name] = [json.loads(line) for line in member.read().splitlines() if line]
    return logs


LOGS = _logs()


@pytest.mark.parametrize("name", sorted(LOGS))
def test_sealed_logs_read_as_entries_and_write_back_the_same_bytes(name: str) -> None:
    lines = LOGS[name]
    entries = parse_entries(lines, Path(name))
    assert isinstance(entries[0], Preregistered)
    ends = [e for e in entries if isinstance(e, LegEnd)]
    assert ends and all(e.status == "complete" for e in ends)
    for line, entry in zip(lines, entries, strict=True):
        assert canonical_json(entry.line_fields()) == canonical_json(line)


def test_old_lines_lack_the_crash_safety_stamps() -> None:
    # Logs sealed before crash safety have no monotonic clock, no boot id and no gap clock:
    # they read as None (and are written back without them, above).
    old = 0
    for name, lines in LOGS.items():
        for line, entry in zip(lines, parse_entries(lines, Path(name)), strict=True):
            assert (entry.monotonic_ns is None) == ("monotonic_ns" not in line)
            assert (entry.boot_id is None) == (line.get("boot_id") is None)
            if isinstance(entry, IdleGap):
                assert (entry.clock is None) == ("clock" not in line)
            old += "monotonic_ns" not in line
    assert old > 0


def test_a_written_entry_keeps_only_the_fields_it_was_given() -> None:
    end = LegEnd(leg="A1", attempt=1, run_dir="A1/attempt-1", status="complete", valid=True,
                 headline=101.5)
    assert end.line_fields() == {"event": "leg_end", "leg": "A1", "attempt": 1, "valid": True,
                                 "run_dir": "A1/attempt-1", "status": "complete",
                                 "headline": 101.5}
    assert TornJsonl(file="x.jsonl", line=3).line_fields()["event"] == "torn_jsonl"


@pytest.mark.parametrize(("line", "key"), [
    ({"event": "leg_teleported", "leg": "A1"}, "event"),
    ({"leg": "A1"}, "event"),
    ({"event": "leg_end", "leg": "A1", "attempt": 1, "run_dir": "d", "status": "complete",
      "valid": True, "headlien": 3.0}, "headlien"),
    ({"event": "idle_gap", "before": "B1", "seconds": "ten", "minimum": 60}, "seconds"),
])
def test_what_is_not_an_entry_is_refused_naming_the_key(line: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^exp/experiment.jsonl: entry 2: key '{key}'"):
        parse_entry(line, "exp/experiment.jsonl: entry 2")
