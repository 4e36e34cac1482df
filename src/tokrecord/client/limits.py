"""How long and how large one row may be before the client gives up on it.

`request_timeout_s` bounds each wait on the socket, not a row: a server that streams
forever, or one that sends one line of 100 MB, never trips it, and the client kept
every byte in memory and in raw-reads.bin. A row's limits follow from its `max_tokens`
(a floor plus an allowance per token), generous enough that no real server meets them
and configurable in the plan (`[row_limits]`) and the leg config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.errors import StreamError

KIB = 1024
MIB = 1024 * KIB


class RowLimitError(StreamError):
    """A row went past one of its limits; what it received up to then is kept."""


class RowLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # 2 tokens/s on top of two minutes: far below any engine this project measures.
    deadline_floor_s: float = Field(default=120.0, gt=0)
    deadline_per_token_s: float = Field(default=0.5, ge=0)
    # A token's event with its ids, text and usage is well under 1 KiB; logprobs with
    # many alternatives stay under 16 KiB.
    bytes_floor: int = Field(default=4 * MIB, gt=0)
    bytes_per_token: int = Field(default=16 * KIB, ge=0)
    max_event_bytes: int = Field(default=4 * MIB, gt=0)
    max_line_bytes: int = Field(default=4 * MIB, gt=0)
    # Events a row may carry: a token per event plus a few role and usage events, twice
    # over. Each decoded event costs memory well above its bytes, so a server that
    # streams small events without end is stopped by their count, not only by bytes.
    events_floor: int = Field(default=64, gt=0)
    events_per_token: float = Field(default=2.0, ge=0)

    def deadline_s(self, max_tokens: int) -> float:
        return self.deadline_floor_s + self.deadline_per_token_s * max_tokens

    def row_bytes(self, max_tokens: int) -> int:
        return self.bytes_floor + self.bytes_per_token * max_tokens

    def max_events(self, max_tokens: int) -> int:
        return self.events_floor + int(self.events_per_token * max_tokens)

    def explain_deadline(self, max_tokens: int) -> str:
        return (f"{self.deadline_s(max_tokens):g} s = {self.deadline_floor_s:g} s + "
                f"{max_tokens} max_tokens x {self.deadline_per_token_s:g} s "
                "(row_limits.deadline_floor_s, deadline_per_token_s)")

    def explain_bytes(self, max_tokens: int) -> str:
        return (f"{self.row_bytes(max_tokens)} bytes = {self.bytes_floor} + {max_tokens} "
                f"max_tokens x {self.bytes_per_token} (row_limits.bytes_floor, bytes_per_token)")


DEFAULT_LIMITS = RowLimits()
