"""The record forms' schema ids, in a module of their own: the schema, the writers and
the migration module all name them, and none of those may import the package
`tokrecord.record` for them (it imports the experiment and metric stages; the schema
importing it back was a cycle).

A record is written in a current form only (SCHEMA_ABBA, SCHEMA_SINGLE); every other id
here is an older form that record.migrate upgrades in memory when it is read.
"""

from __future__ import annotations

from typing import Final

# v3: v2 with every key required (the keys added to v2 without a new id are required
# from v3 on; a v2 record lacking one reads it as None through record.migrate).
SCHEMA_ABBA: Final = "tokrecord.experiment-record/v3"
# v2: k blocks, the A/A design, the leg-level verdict (`verdict_analysis`) and the
# preregistered power.
SCHEMA_ABBA_V2: Final = "tokrecord.experiment-record/v2"
# v1: one ABBA block, the paired bootstrap. A design of its own, with no later version:
# still built exactly as it was (record.abba), so that records made before v2 verify.
SCHEMA_ABBA_V1: Final = "tokrecord.experiment-record/v1"
# v2: v1 with every key required, as SCHEMA_ABBA.
SCHEMA_SINGLE: Final = "tokrecord.single-leg-record/v2"
SCHEMA_SINGLE_V1: Final = "tokrecord.single-leg-record/v1"
