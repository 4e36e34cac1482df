"""The record forms' schema ids, in a module of their own: the schema, the writers and
the migration module all name them, and none of those may import the package
`tokrecord.record` for them (it imports the experiment and metric stages; the schema
importing it back was a cycle)."""

from __future__ import annotations

from typing import Final

# v2: k blocks, the A/A design, the leg-level verdict (`verdict_analysis`) and the
# preregistered power. v1 (one ABBA block, the paired bootstrap) is still built
# exactly as it was, so that records made before v2 verify.
SCHEMA_ABBA: Final = "tokrecord.experiment-record/v2"
SCHEMA_ABBA_V1: Final = "tokrecord.experiment-record/v1"
SCHEMA_SINGLE: Final = "tokrecord.single-leg-record/v1"
