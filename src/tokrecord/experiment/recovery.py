"""What a resume recovers from a hard-killed attempt: its raw reads, decoded.

A SIGKILL leaves an attempt with no summary. Its raw log (`raw-reads.bin`, see
`tokrecord.client.rawlog`) still holds every read that arrived. Each row that has no
`end` in events.jsonl is decoded from it exactly as the live client would have, into
`recovered-events.jsonl` (events.jsonl itself is never touched), followed by an `end`
with ok false: the row was cut by the kill, or its stream was complete on the wire
but the kill came before it was recorded. Either way it is marked incomplete and is
never counted: the attempt is interrupted, and only a complete attempt counts.
`recovery.json` says what was found. Both files are written whole or not at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from tokrecord.client.rawlog import read_raw
from tokrecord.client.stream import decode_raw_row
from tokrecord.engines import Endpoint, EngineName, engine_for
from tokrecord.evidence import canonical_json, layout, scan_jsonl, write_exclusive

SCHEMA = "tokrecord.raw-recovery/v1"


class RecoveredRow(TypedDict):
    row: int
    tokens: int
    reads: int
    complete_on_wire: bool


def recover_attempt(run_dir: Path) -> dict[str, Any] | None:
    """Decode a killed attempt's raw reads; None when there is nothing to recover (no
    raw log, no configuration) or it was recovered before."""
    raw_path = run_dir / layout.RAW_READS
    if not raw_path.exists() or (run_dir / layout.RECOVERY).exists():
        return None
    try:
        config = json.loads((run_dir / layout.CONFIG).read_text(encoding="utf-8"))
        engine = engine_for(EngineName(config["engine"]["name"]))
        endpoint = Endpoint(config["leg"]["endpoint"])
    except (OSError, ValueError, KeyError) as exc:
        return {"recovered_rows": [], "note": f"not decoded: no usable config.json ({exc})"}
    rows, torn_bytes = read_raw(raw_path)
    events_path = run_dir / layout.EVENTS
    kept = scan_jsonl(events_path)[0] if events_path.exists() else []
    ended = {r.get("row") for r in kept if r.get("kind") == "end"}
    out: list[dict[str, Any]] = []
    summary: list[RecoveredRow] = []
    for index, raw in sorted(rows.items()):
        if index in ended:
            continue  # the live client recorded this row, its end included
        records, complete, tokens, why = decode_raw_row(raw, endpoint, engine)
        for record in records:
            record["recovered"] = True
        out += records
        error = ("incomplete: the run was killed after the whole stream arrived, before the "
                 "row was recorded" if complete else f"incomplete: the run was killed mid-row "
                 f"({why})")
        out.append({"kind": "end", "row": index, "t_ns": raw.stamps[-1] if raw.stamps else 0,
                    "ok": False, "error": error, "recovered": True,
                    "complete_on_wire": complete})
        summary.append({"row": index, "tokens": tokens, "reads": len(raw.reads),
                        "complete_on_wire": complete})
    found = {"schema": SCHEMA, "recovered_rows": summary, "raw_torn_bytes": torn_bytes,
             "source": layout.RAW_READS, "file": layout.RECOVERED_EVENTS if out else None}
    if out:
        write_exclusive(run_dir / layout.RECOVERED_EVENTS,
                        b"".join(canonical_json(r) + b"\n" for r in out))
    write_exclusive(run_dir / layout.RECOVERY, canonical_json(found) + b"\n")
    return {k: v for k, v in found.items() if k != "schema"}
