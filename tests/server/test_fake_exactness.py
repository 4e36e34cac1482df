"""Which ids each engine's stream gives the teacher-exact gate, on the fake server in
that engine's dialect: vLLM's `token_ids`, SGLang's `output_ids` and llama.cpp's
`tokens` give every id; a plain OpenAI server gives none; llama.cpp with a held-back
token (its UTF-8 hold-back) gives every id but that one, at known positions.

Each row goes through the real client (`stream_row`) and is compared with a teacher
row holding every id, as a leg's row is.
"""
# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from test_fake_server import Running, StartServer, start_server  # noqa: F401

from tokrecord.client.stream import RowTrace, stream_row
from tokrecord.engines import Endpoint, engine_for
from tokrecord.gates import GateStatus, RowOutcome, row_comparison, teacher_exact
from tokrecord.gates.teacher import Teacher, TeacherRow
from tokrecord.server.fake import output_token_ids
from tokrecord.suite import SuiteRow

ROW = SuiteRow(id="r0", prompt="the quick brown fox", max_tokens=9)
IDS = output_token_ids(ROW.prompt, ROW.max_tokens)


class _Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


def _trace(server: Running, engine: str, endpoint: Endpoint) -> RowTrace:
    adapter = engine_for(engine)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        return stream_row(http, row_index=0, row=ROW,
                          body=adapter.build_body(endpoint, "tokrecord-fake", ROW),
                          endpoint=endpoint, sink=_Sink(), engine=adapter)


def _outcome(t: RowTrace) -> RowOutcome:
    return RowOutcome(row=0, row_id=t.row_id, prompt_sha256=t.prompt_sha256,
                      max_tokens=ROW.max_tokens, token_ids=t.token_ids, text=t.text,
                      finish_reason=t.finish_reason, n_tokens=t.n_tokens,
                      completion_tokens=t.completion_tokens, prompt_tokens=t.prompt_tokens,
                      cached_tokens=t.cached_tokens, t_send_ns=t.t_send_ns, t_end_ns=t.t_end_ns,
                      gapped_token_ids=t.gapped_token_ids)


def _teacher(text: str) -> Teacher:
    return Teacher(created_utc="2026-12-01T00:00:00Z", suite_name="s", suite_sha256="s" * 64,
                   model="m", model_manifest=None, arm={}, source_run="x",
                   rows=(TeacherRow(row=0, row_id=ROW.id, prompt_sha256=ROW.prompt_sha256,
                                    token_ids=tuple(IDS), text=text, finish_reason="length",
                                    n_tokens=len(IDS), compare_by="token_ids"),))


def _text() -> str:
    return "".join(f" t{t}" for t in IDS)


def test_vllm_gives_every_id(start_server: StartServer) -> None:
    trace = _trace(start_server("--ttft-ms", "1", "--tokens-per-chunk", "4"), "vllm",
                   Endpoint.COMPLETIONS)
    assert trace.token_ids == tuple(IDS) and trace.gapped_token_ids is None
    gate = teacher_exact([_outcome(trace)], _teacher(_text()))
    assert gate.status is GateStatus.PASS and gate.evidence["rows_by_token_ids"] == 1
    assert gate.reason == "every row matches the teacher: 1/1 by ids"


def test_sglang_native_gives_every_id(start_server: StartServer) -> None:
    server = start_server("--dialect", "sglang", "--ttft-ms", "1", "--tokens-per-chunk", "3",
                          "--skip-server-warmup")
    trace = _trace(server, "sglang", Endpoint.NATIVE)
    assert trace.token_ids == tuple(IDS) and trace.gapped_token_ids is None
    assert row_comparison(_outcome(trace), _teacher(_text()).rows[0]).mode == "token_ids"


def test_plain_openai_gives_no_id_and_says_so(start_server: StartServer) -> None:
    server = start_server("--dialect", "openai", "--ttft-ms", "1")
    trace = _trace(server, "openai", Endpoint.COMPLETIONS)
    assert trace.token_ids is None and trace.gapped_token_ids is None
    gate = teacher_exact([_outcome(trace)], _teacher(_text()))
    assert gate.status is GateStatus.PASS
    assert gate.evidence["rows_by_text"] == [
        {"row": 0, "row_id": "r0", "why": "the server sent no token ids", "ids_checked": 0}]
    assert gate.reason == ("every row matches the teacher: 0/1 by ids, 1 by text "
                           "(row 0: the server sent no token ids)")


def test_llamacpp_gives_every_id(start_server: StartServer) -> None:
    trace = _trace(start_server("--dialect", "llama.cpp", "--ttft-ms", "1"), "llama.cpp",
                   Endpoint.NATIVE)
    assert trace.token_ids == tuple(IDS) and trace.gapped_token_ids is None


def test_llamacpp_hold_back_loses_an_id_at_a_known_position(start_server: StartServer) -> None:
    # Every 4th token held back: tokens 3 and 7 (0-based) arrive with the next event's
    # text, their ids never.
    server = start_server("--dialect", "llama.cpp", "--ttft-ms", "1", "--hold-back-every", "4")
    trace = _trace(server, "llama.cpp", Endpoint.NATIVE)
    assert trace.n_tokens == 9 and trace.text == _text()
    assert trace.token_ids is None
    assert trace.gapped_token_ids == (*IDS[:3], None, *IDS[4:7], None, IDS[8])
    outcome = _outcome(trace)
    gate = teacher_exact([outcome], _teacher(_text()))
    assert gate.status is GateStatus.PASS
    assert gate.evidence["rows_by_text"] == [
        {"row": 0, "row_id": "r0", "why": "2 ids held back at tokens 3, 7", "ids_checked": 7}]
    # The ids it did give are still compared: a wrong one fails the row, same text or not.
    wrong = outcome.model_copy(update={"gapped_token_ids": (IDS[0] + 1, *IDS[1:3], None,
                                                            *IDS[4:7], None, IDS[8])})
    failed = teacher_exact([wrong], _teacher(_text()))
    assert failed.status is GateStatus.FAIL
    assert failed.evidence["divergences"][0]["mode"] == "token_ids"
    assert failed.evidence["divergences"][0]["index"] == 0
