"""The H200 example's exactness recounted from its raw events under both rules: rule 1
(as sealed) compared every row by text; rule 2 compares every id the stream gave, by
position, and names the held-back ones (found by hand in the teacher leg's events.jsonl:
row 0's tokens_predicted jumps 138 -> 140, 179 -> 181, 211 -> 213, 225 -> 227 with one
id each)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from paths import ROOT
from tokrecord.gates import GateStatus
from tokrecord.record.recount import recount


def test_exp_graphs_recount(tmp_path: Path) -> None:
    with tarfile.open(ROOT / "examples" / "h200" / "exp-graphs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    counts = {c.leg: c for c in recount(tmp_path / "exp-graphs")}
    assert sorted(counts) == ["A1", "A2", "B1", "B2"]
    for c in counts.values():
        assert c.before.status is GateStatus.PASS and c.after.status is GateStatus.PASS
        assert c.before.evidence["compared_by"] == ["text"] and c.by_ids_before == 0
        assert c.by_ids_after == 0 and c.ids_held_back == 74
        assert c.ids_total == 13 * 512 and c.ids_compared_after == 13 * 512 - 74
        first = c.after.evidence["rows_by_text"][0]
        assert first["why"] == ("4 ids held back at tokens 138, 179, 211, 225 at the same "
                                "tokens in the teacher")
