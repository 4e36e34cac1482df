"""The one name for JSON whose shape tokrecord does not own: a server's or a service's
wire payload, or a file read back from evidence before it is validated. What tokrecord
builds itself has a typed model (a pydantic model, a dataclass or a TypedDict) instead."""

from __future__ import annotations

from typing import Any, TypeAlias

JSONObject: TypeAlias = dict[str, Any]
