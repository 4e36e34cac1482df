"""What a person should know before submitting a record: said first, not found later."""

from __future__ import annotations

from tokrecord.record.schema import AnyRecord


def record_cautions(record: AnyRecord) -> list[str]:
    """Warnings about the record as a claim: no record, or a candidate slower than its
    control. Neither stops a submission (a measured speed is still a measurement)."""
    out: list[str] = []
    gate = record.record_gate  # None: a single-leg record, with no control to compare
    if record.status == "no_record":
        why = ""
        if gate is not None and gate.reasons:
            why = f" ({'; '.join(gate.reasons)})"
        out.append(f"the record's status is no_record{why}: the leaderboard would list a "
                   "measured speed, not a record")
    if gate is None:
        return out
    analysis = record.verdict_analysis
    if analysis is not None and analysis.ratio is not None:
        if analysis.ratio < 1:
            out.append(f"the candidate was {100 * (1 - analysis.ratio):.1f} % slower than the "
                       f"control (ratio {analysis.ratio:.4f}, verdict {analysis.verdict.value}): "
                       "the headline is the candidate's speed")
        return out
    cand, ctrl = gate.candidate_lower_start_tok_s, gate.control_lower_start_tok_s
    if cand is not None and ctrl is not None and cand < ctrl:
        out.append(f"the candidate's lower leg ({cand:.2f} tok/s) was slower than the control's "
                   f"lower leg ({ctrl:.2f} tok/s) by {100 * (1 - cand / ctrl):.1f} %")
    return out
