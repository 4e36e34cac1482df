"""The packaged fake server's own send log (`--log`): the truth a test compares the client with.

A paced server on a loaded host writes late, and a loaded client reads late; a test that
compares the client's rate with the *nominal* rate fails whenever the host is busy. The
server's log has two clocks that load cannot blur together:
- `due_ns`, the schedule: exact whatever the load, so it proves which rate the server
  was told (a flag, an env var, an arm);
- `t_ns`, when each write returned: what was really sent, the truth the client's
  figure is checked against (bench/fidelity does the same with a tolerance of its own,
  on an idle host, and reports the error: that is where precision is checked).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tokrecord.metrics import Chunk, RowMetrics, row_metrics

# How far the client's median row rate may sit from the send log's. A 5-row median needs
# three rows each delayed by a tenth of the window at one end and not the other before
# this fails; the fidelity bench measures the real error (well under 1 % when idle).
LOAD_PROOF_REL = 0.25


def _records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _rows(log: Path, clock: str) -> list[RowMetrics]:
    starts: dict[int, int] = {}
    chunks: dict[int, list[Chunk]] = {}
    for rec in _records(log):
        req = int(rec["req"])  # type: ignore[call-overload]
        if rec["kind"] == "request":
            starts[req] = int(rec["t_ns"])  # type: ignore[call-overload]
        elif rec["kind"] == "chunk":
            chunks.setdefault(req, []).append(
                Chunk(t_ns=int(rec[clock]), n=int(rec["n"])))  # type: ignore[call-overload]
    return [row_metrics(starts[req], chunks[req]) for req in sorted(chunks)]


def sent_rows(log: Path) -> list[RowMetrics]:
    """Each streamed request's figures on the server's write times (what was sent)."""
    return _rows(log, "t_ns")


def scheduled_rows(log: Path) -> list[RowMetrics]:
    """Each streamed request's figures on its due times (what the server was told to do)."""
    return _rows(log, "due_ns")


def median_rate(rows: list[RowMetrics], chunk_aware: bool = False) -> float:
    rates = [r.rate_chunk_aware if chunk_aware else r.rate_conventional for r in rows]
    return float(statistics.median(r for r in rates if r is not None))
