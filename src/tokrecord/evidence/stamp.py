"""UTC wall-clock stamps: the one place their forms are spelled.

Timings in evidence come from the monotonic clock (leg.CLOCK_SOURCE); these stamps only
say when something happened, for a reader.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum


class Stamp(StrEnum):
    """The forms tokrecord writes, as strftime patterns."""

    SECONDS = "%Y-%m-%dT%H:%M:%SZ"  # sealed_utc, a teacher's created_utc
    MICROSECONDS = "%Y-%m-%dT%H:%M:%S.%fZ"  # experiment.jsonl, submission receipts
    MILLISECONDS = "%Y-%m-%dT%H:%M:%S.{ms}Z"  # JavaScript's toISOString (the stand-in service)
    DATE = "%Y-%m-%d"  # a record's date
    COMPACT = "%Y%m%dT%H%M%SZ"  # a default run directory's name


def utc_stamp(form: Stamp = Stamp.SECONDS, now: dt.datetime | None = None) -> str:
    """`now` (default: this instant) in UTC, in the given form."""
    at = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return at.strftime(form.value).replace("{ms}", f"{at.microsecond // 1000:03d}")
