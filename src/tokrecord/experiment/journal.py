"""The entries of an experiment's state log (experiment.jsonl), one model per `event`.

The runner builds an entry as its model (so mypy catches a missing or misspelled field),
and reads the log back as a union discriminated by `event`: it matches on the types,
never on the string. Each line also carries the stamps the writer adds (`utc`, `unix`,
and, since crash safety, `monotonic_ns` and `boot_id`: absent from older logs, read as
None). A line written with only some of its fields keeps exactly those: the writer
dumps the fields it was given, so the bytes are what they always were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tokrecord.errors import ConfigError

# A figure as it was logged: an int stays an int and a float a float (bytes unchanged).
Number = int | float


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event: str  # each entry narrows it to its own name (the union's tag)
    utc: str | None = None
    unix: float | None = None
    monotonic_ns: int | None = None  # absent from logs written before crash safety
    boot_id: str | None = None

    def line_fields(self) -> Mapping[str, Any]:
        """The fields the writer gave, with the event: what goes on the line before stamps."""
        # `event` holds its default, so it is never "set": it is added here.
        return {**self.model_dump(mode="json", exclude_unset=True), "event": self.event}


class Preregistered(_Entry):
    event: Literal["preregistered"] = "preregistered"
    plan_sha256: str
    name: str
    design: str
    legs: list[str]


class Resumed(_Entry):
    event: Literal["resumed"] = "resumed"
    plan_sha256: str


class PowerComputed(_Entry):
    event: Literal["power_computed"] = "power_computed"
    path: str
    min_effect_pct: Number | None
    power: Number | None
    blocks: int


class IdentityCollected(_Entry):
    event: Literal["identity_collected"] = "identity_collected"
    path: str


class PortableManifestsWritten(_Entry):
    event: Literal["portable_manifests_written"] = "portable_manifests_written"
    paths: list[str]


class ComponentsCopied(_Entry):
    event: Literal["components_copied"] = "components_copied"
    paths: list[str]


class TeacherCaptured(_Entry):
    event: Literal["teacher_captured"] = "teacher_captured"
    path: str
    sha256: str
    arm: str


class LegIdentity(_Entry):
    event: Literal["leg_identity"] = "leg_identity"
    leg: str
    attempt: int | None
    identity_sha256: str
    matches_preregistered: bool
    changed: list[str]


class LegStart(_Entry):
    event: Literal["leg_start"] = "leg_start"
    leg: str
    arm: str
    attempt: int | None
    run_dir: str


class LegEnd(_Entry):
    event: Literal["leg_end"] = "leg_end"
    leg: str
    attempt: int | None
    run_dir: str
    status: str
    valid: bool
    error: str | None = None
    headline: Number | None = None
    # A complete attempt whose end a kill kept from the log, written from its summary.
    written_on_resume: bool | None = None


class OrphanServerStopped(_Entry):
    event: Literal["orphan_server_stopped"] = "orphan_server_stopped"
    leg: str
    attempt: int | None


class RawRecovered(_Entry):
    # Carries recovery.json's own keys (experiment.recovery), whose set is that file's.
    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal["raw_recovered"] = "raw_recovered"
    leg: str
    attempt: int | None


class TornJsonl(_Entry):
    event: Literal["torn_jsonl"] = "torn_jsonl"
    file: str
    line: int


class InterimLook(_Entry):
    event: Literal["interim_look"] = "interim_look"
    look: str
    statistic: Number | None
    boundary: Number | None
    df: Number | None
    verdict: str
    action: str


class SequentialStop(_Entry):
    event: Literal["sequential_stop"] = "sequential_stop"
    at: str | None
    verdict: str
    legs: int
    max_legs: int


class IdleGap(_Entry):
    event: Literal["idle_gap"] = "idle_gap"
    before: str
    seconds: Number
    minimum: Number
    clock: Literal["monotonic", "wall"] | None = None  # absent before crash safety


class Complete(_Entry):
    event: Literal["complete"] = "complete"
    record: str


Entry = Annotated[
    Preregistered | Resumed | PowerComputed | IdentityCollected | PortableManifestsWritten
    | ComponentsCopied | TeacherCaptured | LegIdentity | LegStart | LegEnd
    | OrphanServerStopped | RawRecovered | TornJsonl | InterimLook | SequentialStop | IdleGap
    | Complete,
    Field(discriminator="event")]
_ADAPTER: TypeAdapter[Entry] = TypeAdapter(Entry)


def parse_entry(obj: Mapping[str, Any], source: str) -> Entry:
    """One line of the log as its model; ConfigError naming the file, the entry and the key
    when it is not one this tokrecord writes."""
    try:
        return _ADAPTER.validate_python(dict(obj))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"{source}: key '{_key(obj, first['loc'][1:])}': "
                          f"{first['msg']}") from exc


def _key(obj: Any, loc: Sequence[int | str]) -> str:
    """The error's place as keys of the line: the union's tags and members are not keys."""
    path: list[str] = []
    for part in loc:
        in_list = isinstance(obj, list) and isinstance(part, int) and 0 <= part < len(obj)
        if in_list or (isinstance(obj, Mapping) and part in obj):
            obj = obj[part]
        elif path or not isinstance(part, str) or not part.isidentifier():
            break
        path.append(str(part))
    return ".".join(path) or "event"


def parse_entries(objs: Sequence[Mapping[str, Any]], path: Path) -> list[Entry]:
    return [parse_entry(obj, f"{path}: entry {i}") for i, obj in enumerate(objs, start=1)]
