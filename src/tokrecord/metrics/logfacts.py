"""Log facts: named extractions from a server's log, per process rank.

A fact is a regular expression (its first capture group is the value), a type,
and a reduction over every matching line: count, sum, max, min, list, first or
last. Engines ship default facts (their graph-capture and speculative lines) and
plans add their own. A line's rank is the process label vLLM-style servers put in
front of it, `(Worker_TP1 pid=123) ...`, or, for servers that name the device in the line
itself (llama.cpp's `CUDA1 model buffer size = ...`), the pattern's named group `rank`;
lines with neither have rank "-". The
reduction is kept over all lines and per rank, with the number of lines found,
so a `count` fact keeps what was actually found and a claim such as "31 per rank"
is a fact, not a reading of the log by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, model_validator

NO_RANK = "-"
# "(Worker_TP1 pid=123) INFO ...", "(EngineCore_DP0 pid=212) ...": the label is the rank.
_RANK = re.compile(r"^\((?P<label>[A-Za-z][\w-]*) pid=\d+\)")


def compile_pattern(pattern: str) -> Any:
    """A fact's pattern compiled by RE2, which matches in time linear in the line.

    Patterns travel inside evidence (a plan's facts are in config.json), and `verify`
    runs them again over server.log: with a backtracking engine a pattern such as
    `(a+)+$` from a stranger would hang the verifier. Writer and verifier compile
    through here, so both see the same matches. RE2 has no backreferences or
    lookaround; such a pattern is refused when the plan is loaded."""
    options = re2.Options()
    options.log_errors = False  # the refusal is raised with the fact's name, not logged
    return re2.compile(pattern, options)


class Reduction(StrEnum):
    COUNT = "count"
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    LIST = "list"
    FIRST = "first"
    LAST = "last"


ValueType = Literal["str", "int", "float", "ints"]


class LogExtractor(BaseModel):
    """One declared fact. `value = "ints"` reads a comma-separated list of integers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    pattern: str
    reduce: Reduction = Reduction.COUNT
    value: ValueType = "str"

    @model_validator(mode="after")
    def _valid(self) -> LogExtractor:
        try:
            rx = compile_pattern(self.pattern)
        except re2.error as exc:
            raise ValueError(f"invalid regular expression {self.pattern[:200]!r} (RE2 syntax: "
                             f"no backreferences or lookaround): {exc}") from exc
        # The rank group names where, not what.
        groups = rx.groups - ("rank" in rx.groupindex)
        if self.reduce is not Reduction.COUNT and groups < 1:
            raise ValueError(f"fact {self.name!r}: a {self.reduce.value} reduction needs a "
                             "capture group holding the value")
        if self.reduce in (Reduction.SUM, Reduction.MAX, Reduction.MIN) and \
                self.value not in ("int", "float"):
            raise ValueError(f"fact {self.name!r}: {self.reduce.value} needs value int or float")
        return self


class LogFactValue(BaseModel):
    """A fact as found: the reduction over all lines, per rank, and the lines found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    value: Any
    found: int
    per_rank: dict[str, Any]


def _convert(raw: str, kind: ValueType) -> Any:
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "ints":
        return [int(x) for x in re.findall(r"-?\d+", raw)]
    return raw


def _reduce(values: Sequence[Any], how: Reduction) -> Any:
    if how is Reduction.COUNT:
        return len(values)
    if not values:
        return None
    if how is Reduction.SUM:
        return sum(values)
    if how is Reduction.MAX:
        return max(values)
    if how is Reduction.MIN:
        return min(values)
    if how is Reduction.FIRST:
        return values[0]
    if how is Reduction.LAST:
        return values[-1]
    return list(values)


def extract_log_facts(text: str, extractors: Sequence[LogExtractor]) -> tuple[LogFactValue, ...]:
    """Every declared fact in `text` (a server log), in declaration order."""
    lines = text.splitlines()
    ranks = [m.group("label") if (m := _RANK.match(line)) else NO_RANK for line in lines]
    out = []
    for ex in extractors:
        rx = compile_pattern(ex.pattern)
        rank_group = rx.groupindex.get("rank")
        # The value is the first capture group that is not the rank's.
        value_group = next((g for g in range(1, rx.groups + 1) if g != rank_group), None)
        found: dict[str, list[Any]] = {}
        everything: list[Any] = []
        for line, prefix_rank in zip(lines, ranks, strict=True):
            m = rx.search(line)
            if m is None:
                continue
            rank = m.group("rank") if rank_group is not None and m.group("rank") else prefix_rank
            value = _convert(m.group(value_group), ex.value) if value_group else None
            found.setdefault(rank, []).append(value)
            everything.append(value)
        out.append(LogFactValue(
            name=ex.name, value=_reduce(everything, ex.reduce), found=len(everything),
            per_rank={rank: _reduce(v, ex.reduce) for rank, v in sorted(found.items())}))
    return tuple(out)


def merge_extractors(defaults: Sequence[LogExtractor], own: Sequence[LogExtractor]
                     ) -> tuple[LogExtractor, ...]:
    """The engine's defaults, then the plan's own; a plan's fact replaces a default of
    the same name."""
    names = {e.name for e in own}
    return (*(e for e in defaults if e.name not in names), *own)
