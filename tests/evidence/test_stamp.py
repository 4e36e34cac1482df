"""The one UTC-stamp helper (issue 30): every form tokrecord writes, from one instant."""

from __future__ import annotations

import datetime as dt

from tokrecord.evidence.stamp import Stamp, utc_stamp

AT = dt.datetime(2026, 7, 23, 9, 22, 48, 67891, tzinfo=dt.timezone(dt.timedelta(hours=2)))


def test_every_form_of_one_instant_in_utc() -> None:
    assert {form.name: utc_stamp(form, AT) for form in Stamp} == {
        "SECONDS": "2026-07-23T07:22:48Z",
        "MICROSECONDS": "2026-07-23T07:22:48.067891Z",
        "MILLISECONDS": "2026-07-23T07:22:48.067Z",
        "DATE": "2026-07-23",
        "COMPACT": "20260723T072248Z",
    }


def test_now_is_utc() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    stamped = dt.datetime.strptime(utc_stamp(), Stamp.SECONDS.value).replace(tzinfo=dt.UTC)
    assert before <= stamped <= dt.datetime.now(dt.UTC)
