"""Submission end to end: a sealed fake-server ABBA record against the LocalMaxxing stand-in.

One real experiment (fake server, about 10 s) is sealed once per module; every test
works on its own copy, its own stand-in process and its own ledger, so receipts and
ledger entries of one test never meet another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from cli_support import cli_in_process
from paths import FIXTURES as FIXTURES_DIR
from plan_support import MAX_TOKENS, SUITE_ROWS, TOPICS, plan_toml, suite_jsonl, write_plan
from tokrecord.evidence import canonical_json, read_jsonl
from tokrecord.evidence.seal import signer_fingerprint, verify_seal
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.server.fake import output_token_ids, prompt_token_ids
from tokrecord.submit import standin as standin_module
from tokrecord.submit.facts import SubmitError, load_facts
from tokrecord.submit.flow import check, dry_run, send
from tokrecord.submit.ledger import Ledger
from tokrecord.submit.localmaxxing import LocalMaxxing
from tokrecord.submit.standin import StandinServer
from tokrecord.submit.standin import config_from_args as standin_config
from tokrecord.submit.target import ApiKey, Built, PayloadOptions

PY = sys.executable
KEY = "bhk_" + "c3" * 20
OTHER_KEY = "bhk_" + "d4" * 20
OPTS = PayloadOptions(hf_id="tokrecord/fake-model", quantization="fp32")


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("submit-record")
    path, plan = write_plan(root, plan_toml("submit-me", control=1000, candidate=1050))
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    return exp


@pytest.fixture
def record(sealed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "rec"
    shutil.copytree(sealed, copy)
    return copy


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "cfg" / "submissions.jsonl")


@contextlib.contextmanager
def _standin_thread(tmp_path: Path, args: tuple[str, ...]) -> Iterator[SimpleNamespace]:
    log = tmp_path / f"standin-{time.monotonic_ns()}.jsonl"
    server = StandinServer(standin_config(["--port", "0", "--log", str(log), *args]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(url=server.url, log=log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def standin(tmp_path: Path, *args: str) -> Iterator[SimpleNamespace]:
    """The packaged stand-in in this process (a thread, the real clock): a stand-in process
    costs some 1.5 s of CPU in imports, and these tests start about twenty. The one test
    of the packaged command (`python -m tokrecord.submit.standin`) uses standin_process."""
    with _standin_thread(tmp_path, args) as s:
        yield s


@contextlib.contextmanager
def standin_process(tmp_path: Path, *args: str) -> Iterator[SimpleNamespace]:
    log = tmp_path / f"standin-{time.monotonic_ns()}.jsonl"
    proc = subprocess.Popen([PY, "-m", "tokrecord.submit.standin", "--port", "0", "--log", str(log),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield SimpleNamespace(url=line.split()[-1], log=log, proc=proc)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _StandinClock:
    """The stand-in's rate-limit clock, frozen at its start: it moves only when the
    client's `sleep` moves it, so a window neither expires under a busy host's delays nor
    needs real seconds to pass."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def standin_on_a_fake_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str
                            ) -> Iterator[SimpleNamespace]:
    """The stand-in in this process (a thread), its window on a _StandinClock."""
    clock = _StandinClock()
    # Only take_slot reads the stand-in module's `time`: its window, nothing else.
    monkeypatch.setattr(standin_module, "time", clock)
    with _standin_thread(tmp_path, args) as s:
        yield SimpleNamespace(url=s.url, log=s.log, clock=clock)


def posts(log: Path, path: str) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(log) if e["method"] == "POST" and e["path"] == path]


def addendum(path: Path) -> dict[str, Any]:
    assert verify_seal(path) == [], path
    return json.loads((path / "addendum.json").read_text())  # type: ignore[no-any-return]


def _utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------- payload


# No speed figure's size is asserted (the payload carries the record's own figures,
# checked exactly), so it runs in the parallel group.
def test_payload_from_a_sealed_fake_record(record: Path) -> None:
    facts = load_facts(record)
    built = LocalMaxxing("http://127.0.0.1:9").build(facts, OPTS)
    p = built.payload
    rec = json.loads((record / "record.json").read_text())
    leg = rec["metric_accounting"]["headline_leg"]
    assert leg in ("B1", "B2")
    assert p["tokSOut"] == rec["metric_accounting"]["published_value_tok_s"] > 0
    assert p["ttftMs"] == rec["runs"][leg]["ttft_median_ms"]
    hw = rec["hardware"]
    assert p["hardware"] == {"hwClass": hw["hw_class"], "cpu": hw["cpu"], "ramGb": hw["ram_gb"],
                             "os": hw["os"]}
    assert p["engineName"] == "tokrecord-fake" and p["engineVersion"] == "0.1.0"
    assert p["engineFlags"]["specDecoding"] is False and p["engineFlags"]["temperature"] == 0
    assert p["engineFlags"]["commandSnippet"] == (
        "TOKRECORD_FAKE_TOK_S=1050 python -m tokrecord.server.fake --host '{host}' --port '{port}' "
        "--model '{model}'")
    # Independently of tokrecord's record: the suite's prompts and the fake server's
    # deterministic outputs (ids from crc32 of the prompt, see server/fake.py).
    prompts = [json.loads(line)["prompt"] for line in suite_jsonl().splitlines()][:SUITE_ROWS]
    assert len(prompts) == SUITE_ROWS <= len(TOPICS)
    assert p["promptSha256"] == hashlib.sha256(
        json.dumps(prompts, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
    outputs = [output_token_ids(prompt, MAX_TOKENS) for prompt in prompts]
    outputs_json = json.dumps(outputs, separators=(",", ":"))
    assert p["outputSha256"] == hashlib.sha256(outputs_json.encode()).hexdigest()
    assert p["promptTokens"] == sorted(len(prompt_token_ids(x)) for x in prompts)[(len(prompts) - 1) // 2]
    assert p["outputTokens"] == MAX_TOKENS and p["batchSize"] == 1
    assert facts.manifest_sha256 == hashlib.sha256((record / "manifest.sha256").read_bytes()).hexdigest()
    assert facts.manifest_sha256 in p["notes"]
    assert f"every row token-exact ({SUITE_ROWS}/{SUITE_ROWS})" in p["notes"]


def test_altered_or_unsealed_records_are_refused(record: Path, tmp_path: Path) -> None:
    log = record / "B1" / "attempt-1" / "server.log"
    log.chmod(0o644)
    with open(log, "a") as fh:
        fh.write("one more line\n")
    with pytest.raises(SubmitError, match="does not verify"):
        load_facts(record)
    with pytest.raises(SubmitError, match="not sealed"):
        load_facts(record / "A1" / "attempt-1")


# -------------------------------------------------------------------------- dry run


def test_dry_run_unreachable_falls_back_to_the_local_schema(record: Path) -> None:
    target = LocalMaxxing(f"http://127.0.0.1:{closed_port()}", connect_timeout_s=1)
    t0 = time.monotonic()
    result = dry_run(record, target, OPTS)
    assert time.monotonic() - t0 < 10
    assert result.valid and result.local_issues == () and result.remote is None
    assert not result.discovery.reachable
    assert any("local schema only" in n for n in result.notes)
    queue = result.prepared.queue_path
    assert queue.parent == record.parent and queue.name.startswith("rec.localmaxxing-")
    assert queue.read_bytes() == canonical_json(result.prepared.built.payload) + b"\n"
    assert json.loads(queue.read_bytes()) == result.prepared.built.payload
    # A second dry run rebuilds the same bytes and finds its own file.
    assert dry_run(record, target, OPTS).prepared.queue_path == queue
    with pytest.raises(SubmitError, match="not reachable"):
        send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=Ledger(record.parent / "l.jsonl"))
    assert not record.with_name("rec.addenda").exists()


def test_dry_run_against_the_standin(record: Path, tmp_path: Path) -> None:
    with standin(tmp_path) as s:
        target = LocalMaxxing(s.url)
        without_key = dry_run(record, target, OPTS)
        assert without_key.remote is not None and without_key.remote.status == 401
        assert without_key.remote_valid is None and without_key.valid
        assert any("needs an API key" in n for n in without_key.notes)
        result = dry_run(record, target, OPTS, key=ApiKey(KEY, "$K"))
        assert result.remote is not None and result.remote.status == 200 and result.remote_valid is True
        assert result.discovery.submit_path == "/api/speed-tests"
        assert "openapi.json declares /api/speed-tests" in result.discovery.notes
        dry = posts(s.log, "/api/speed-tests/dry-run")
        assert [d["status"] for d in dry] == [401, 200]
        assert dry[1]["body"] == json.loads(result.prepared.queue_path.read_bytes())
        assert posts(s.log, "/api/speed-tests") == []  # a dry run never submits


def test_standin_contract_directly(tmp_path: Path, record: Path) -> None:
    payload = json.loads(dry_run(record, LocalMaxxing(f"http://127.0.0.1:{closed_port()}"), OPTS)
                         .prepared.queue_path.read_bytes())
    # The packaged command, as a process: its main, its flags, its "listening on" line.
    with standin_process(tmp_path, "--key-sha256", hashlib.sha256(KEY.encode()).hexdigest()) as s, \
            httpx.Client(base_url=s.url) as client:
        auth = {"Authorization": f"Bearer {KEY}"}
        assert client.post("/api/speed-tests", json=payload).status_code == 401
        wrong = client.post("/api/speed-tests", json=payload,
                            headers={"Authorization": f"Bearer {OTHER_KEY}"})
        assert wrong.status_code == 401
        bad = client.post("/api/speed-tests", json={**payload, "tokSOut": -1}, headers=auth)
        assert bad.status_code == 400
        assert any(i.startswith("tokSOut:") for i in bad.json()["issues"])
        ok = client.post("/api/speed-tests", json=payload, headers=auth)
        # The fake's vLLM dialect reports no timing of its own: no engineTimingsRaw.
        assert ok.status_code == 201 and ok.json()["verifiedRun"] is False
        assert ok.json()["verificationIssues"] == ["engineTimingsRaw missing"]
        row = client.get(f"/api/speed-tests/{ok.json()['id']}").json()
        assert {k: row[k] for k in payload} == payload and row["status"] == "PENDING"
        limited = client.post("/api/speed-tests", json=payload, headers=auth)
        assert limited.status_code == 429 and 299_000 < limited.json()["retryAfterMs"] <= 300_000
        assert client.get("/api/speed-tests/nope").status_code == 404
    assert [e["auth"] for e in read_jsonl(s.log) if e["method"] == "POST"] == [
        "none", "unknown", "bearer", "bearer", "bearer"]
    assert KEY not in s.log.read_text()


# ----------------------------------------------------------------------------- send


def test_send_seals_a_receipt_and_refuses_a_duplicate(record: Path, tmp_path: Path,
                                                      ledger: Ledger) -> None:
    with standin(tmp_path) as s:
        target = LocalMaxxing(s.url)
        with pytest.raises(SubmitError, match=r"calls this run unverified \(engineTimingsRaw missing\); "
                                              "nothing was sent"):
            send(record, target, OPTS, ApiKey(KEY, "$LOCALMAXXING_API_KEY"), ledger=ledger)
        assert posts(s.log, "/api/speed-tests") == [] and ledger.entries() == []
        result = send(record, target, OPTS, ApiKey(KEY, "$LOCALMAXXING_API_KEY"), ledger=ledger,
                      allow_unverified=True)
        assert result.acceptance.accepted and result.acceptance.status == "PENDING"
        sid = result.acceptance.submission_id
        assert sid is not None and sid.startswith("st_")
        sent = posts(s.log, "/api/speed-tests")
        assert [p["status"] for p in sent] == [201]
        assert sent[0]["body"] == json.loads(result.prepared.queue_path.read_bytes())
        row = httpx.get(f"{s.url}/api/speed-tests/{sid}").json()
        assert row["tokSOut"] == result.prepared.built.payload["tokSOut"]

        assert result.receipt_dir == record.with_name("rec.addenda") / "001-submission-receipt"
        doc = addendum(result.receipt_dir)
        assert doc["kind"] == "submission-receipt"
        assert doc["parent_manifest_sha256"] == load_facts(record).manifest_sha256
        r = doc["payload"]
        assert (r["accepted"], r["http_status"], r["submission_id"]) == (True, 201, sid)
        assert r["queue"] == result.prepared.built.payload
        assert r["queue_sha256"] == hashlib.sha256(result.prepared.queue_path.read_bytes()).hexdigest()
        assert r["rate_limit"]["x-ratelimit-remaining"] == "0"
        assert int(r["rate_limit"]["x-ratelimit-reset"]) > time.time() + 200
        assert r["exchanges"][0]["body"] == {"id": sid, "status": "PENDING", "verifiedRun": False,
                                             "verificationIssues": ["engineTimingsRaw missing"]}
        assert (r["verified_run"], r["verification_issues"]) == (False, ["engineTimingsRaw missing"])
        assert r["dry_run"]["verification"] == {"verified": False,
                                                "issues": ["engineTimingsRaw missing"]}
        assert r["dry_run"]["allow_unverified"] is True
        entries = ledger.entries()
        assert [(e["event"], e["submission_id"]) for e in entries] == [("submitted", sid)]

        with pytest.raises(SubmitError, match=f"already submitted to {s.url}: id {sid}"):
            send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger, allow_unverified=True)
        # Another machine's ledger is empty, but the receipt beside the record still says so.
        with pytest.raises(SubmitError, match=f"id {sid}"):
            send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=Ledger(tmp_path / "other.jsonl"),
                 allow_unverified=True)
        assert len(posts(s.log, "/api/speed-tests")) == 1


def test_wrong_key_gets_401_and_does_not_block_a_later_send(record: Path, tmp_path: Path,
                                                             ledger: Ledger) -> None:
    with standin(tmp_path, "--key-sha256", hashlib.sha256(KEY.encode()).hexdigest()) as s:
        target = LocalMaxxing(s.url)
        # The dry run before the send already gets the 401: nothing is sent, and the message
        # says what to do without the key in it.
        with pytest.raises(SubmitError) as info:
            send(record, target, OPTS, ApiKey(OTHER_KEY, "$K"), ledger=ledger, allow_unverified=True)
        message = str(info.value)
        assert "HTTP 401, the API key is missing or wrong (the key from $K was refused" in message
        assert "nothing was sent" in message and OTHER_KEY not in message and OTHER_KEY[4:] not in message
        assert posts(s.log, "/api/speed-tests") == [] and ledger.entries() == []
        assert not record.with_name("rec.addenda").exists()
        accepted = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger, allow_unverified=True)
        assert accepted.acceptance.accepted
        assert accepted.receipt_dir.name == "001-submission-receipt"


class _Tampering(LocalMaxxing):
    """A target whose payload breaks the contract but which skips local validation:
    what the service's 400 looks like once it gets that far."""

    def build(self, facts: Any, options: PayloadOptions) -> Built:
        built = super().build(facts, options)
        return Built({**built.payload, "tokSOut": -1.0}, built.derivation)

    def validate(self, payload: Any) -> list[str]:
        return []


def test_bad_payload_gets_400_and_local_validation_stops_it_first(record: Path, tmp_path: Path,
                                                                    ledger: Ledger) -> None:
    with standin(tmp_path) as s:
        # The service's dry run refuses it first, with its field errors: nothing is sent.
        with pytest.raises(SubmitError, match=r"HTTP 400, the service refused the payload: Validation "
                                              r"failed; field errors: tokSOut: Input should be "
                                              r"greater than 0"):
            send(record, _Tampering(s.url), OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        assert [d["status"] for d in posts(s.log, "/api/speed-tests/dry-run")] == [400]
        assert posts(s.log, "/api/speed-tests") == [] and ledger.entries() == []

        class _Honest(_Tampering):
            def validate(self, payload: Any) -> list[str]:
                return LocalMaxxing.validate(self, payload)

        with pytest.raises(SubmitError, match="breaks the localmaxxing schema: tokSOut"):
            send(record, _Honest(s.url), OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        assert posts(s.log, "/api/speed-tests") == []  # the honest target sent nothing either


# The stand-in's window runs on a clock that only the client's sleep moves (no real wait,
# and no window that a busy host lets expire early): parallel group.
def test_429_waits_retry_after_ms_then_succeeds(record: Path, tmp_path: Path, ledger: Ledger,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with standin_on_a_fake_clock(tmp_path, monkeypatch, "--rate-limit", "1",
                                 "--window-s", "1.5") as s:
        target = LocalMaxxing(s.url)
        body = dry_run(record, target, OPTS).prepared.queue_path.read_bytes()
        # Another submission with the same key uses up the window first.
        first = httpx.post(f"{s.url}/api/speed-tests", content=body,
                           headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        assert first.status_code == 201
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            # The wait moves the stand-in's clock: only a wait of the whole retry-after
            # opens its window, so the 201 below proves the client waited long enough.
            waits.append(seconds)
            s.clock.sleep(seconds)

        result = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger, sleep=sleep,
                      allow_unverified=True)
        assert [e.status for e in result.exchanges] == [429, 201]
        retry_ms = result.exchanges[0].body["retryAfterMs"]
        assert retry_ms == 1500  # the window opened by the first post, on a frozen clock
        assert waits == [retry_ms / 1000] and result.exchanges[1].waited_s == retry_ms / 1000
        logged = posts(s.log, "/api/speed-tests")
        assert [e["status"] for e in logged] == [201, 429, 201]
        receipt = addendum(result.receipt_dir)["payload"]
        assert receipt["accepted"] and receipt["retry_after_ms"] == [retry_ms]
        assert [e["http_status"] for e in receipt["exchanges"]] == [429, 201]


# On the frozen clock the retry-after is the whole 300 s window however slow the host
# (a real one lost up to a second between the two posts): parallel group.
def test_429_past_the_wait_budget_is_recorded_not_retried(record: Path, tmp_path: Path,
                                                          ledger: Ledger,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with standin_on_a_fake_clock(tmp_path, monkeypatch, "--rate-limit", "1",
                                 "--window-s", "300") as s:
        target = LocalMaxxing(s.url)
        body = dry_run(record, target, OPTS).prepared.queue_path.read_bytes()
        httpx.post(f"{s.url}/api/speed-tests", content=body,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        waits: list[float] = []
        result = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger, sleep=waits.append,
                      max_retries=3, max_wait_s=60, allow_unverified=True)
        assert waits == [] and [e.status for e in result.exchanges] == [429]
        receipt = addendum(result.receipt_dir)["payload"]
        assert receipt["accepted"] is False and receipt["http_status"] == 429
        assert 299_000 < receipt["retry_after_ms"][0] <= 300_000
        assert receipt["exchanges"][0]["headers"]["x-ratelimit-remaining"] == "0"
        assert ledger.entries() == []


def test_older_benchmarks_endpoint_found_through_openapi(record: Path, tmp_path: Path,
                                                         ledger: Ledger) -> None:
    with standin(tmp_path, "--api", "benchmarks") as s:
        result = send(record, LocalMaxxing(s.url), OPTS, ApiKey(KEY, "$K"), ledger=ledger,
                      allow_unverified=True)
        assert result.acceptance.accepted and result.discovery.submit_path == "/api/benchmarks"
        assert [p["status"] for p in posts(s.log, "/api/benchmarks")] == [201]


# ---------------------------------------------------------------------------- check


def test_check_records_match_then_mismatch(record: Path, tmp_path: Path, ledger: Ledger) -> None:
    with standin(tmp_path, "--allow-edits") as s:
        target = LocalMaxxing(s.url)
        with pytest.raises(SubmitError, match="nothing to check"):
            check(record, target, ledger=ledger)
        sent = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger, allow_unverified=True)
        sid = sent.acceptance.submission_id
        once = check(record, target, ledger=ledger)
        assert once.stopped == "once" and len(once.observations) == 1
        good = once.last
        assert good.found and good.match and good.submission_id == sid
        doc = addendum(good.check_dir)
        assert doc["kind"] == "submission-check"
        c = doc["payload"]
        assert c["match"] is True and c["mismatches"] == [] and c["public_status"] == "PENDING"
        assert c["schema"] == "tokrecord.submission-check/v2" and c["observation"] == 1
        assert c["public_created_at"] == httpx.get(f"{s.url}/api/speed-tests/{sid}").json()["createdAt"]
        leaves = {f["field"] for f in c["fields"]}
        assert {"tokSOut", "hardware.cpu", "engineFlags.commandSnippet", "outputSha256"} <= leaves
        assert c["fields_compared"] == len(leaves)
        assert abs(_utc(c["checked_utc"]) - time.time()) < 60

        patched = httpx.patch(f"{s.url}/api/speed-tests/{sid}", json={"tokSOut": 1.0})
        assert patched.status_code == 200
        bad = check(record, target, ledger=ledger).last
        assert bad.found and not bad.match
        assert bad.mismatches == [{"field": "tokSOut", "sent": sent.prepared.built.payload["tokSOut"],
                                   "public": 1.0, "match": False}]
        assert addendum(bad.check_dir)["payload"]["match"] is False
        assert [(e["event"], e.get("match")) for e in ledger.entries()] == [
            ("submitted", None), ("checked", True), ("checked", False)]

        # The record and its addenda move; the ledger's receipt path goes stale and the
        # receipt is found beside the record instead.
        moved = tmp_path / "elsewhere" / "rec"
        shutil.copytree(record, moved)
        shutil.copytree(record.with_name("rec.addenda"), moved.with_name("rec.addenda"))
        old = record.with_name("rec.addenda")
        for path in [old, *old.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(old)
        again = check(moved, target, ledger=ledger).last
        assert again.found and not again.match and again.submission_id == sid
        assert again.check_dir == moved.with_name("rec.addenda") / "004-submission-check"


# ------------------------------------------------------------------------------ CLI


def test_cli_dry_run_send_check_and_the_key_is_in_no_file(
        record: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    config = tmp_path / "cli-config"
    # --send sends only evidence whose key is pinned: this config trusts the record's key.
    config.mkdir()
    (config / "trusted_keys").write_text(f"{signer_fingerprint(record)} the test's record\n")
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200", "TERM": "dumb",
                "TOKRECORD_CONFIG_DIR": str(config)}
    keyed = {**base_env, "LOCALMAXXING_API_KEY": KEY}
    outputs: list[str] = []

    def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        # In process (tests/cli_support.py): ten commands, about what they print and exit with.
        proc = cli_in_process(["submit", str(record), *args], env)
        outputs.append(proc.stdout + proc.stderr)
        return proc

    with standin(tmp_path, "--allow-edits") as s:
        common = ("--url", s.url, "--hf-id", "tokrecord/fake-model", "--quantization", "fp32")
        missing = cli(base_env, "--url", s.url)
        assert missing.returncode == 1 and "--hf-id ORG/NAME" in missing.stderr
        dry = cli(base_env, *common)
        assert dry.returncode == 0, dry.stderr
        assert "local schema: valid" in dry.stdout and "needs an API key" in dry.stderr
        assert "nothing was submitted" in dry.stdout
        dry_keyed = cli(keyed, *common)
        assert "dry-run endpoint /api/speed-tests/dry-run: HTTP 200, valid" in dry_keyed.stdout
        assert "verification: NOT verified (1 issue)" in dry_keyed.stdout
        assert "  verification issue: engineTimingsRaw missing" in dry_keyed.stdout
        assert "--send refuses it unless --allow-unverified" in dry_keyed.stdout
        no_key = cli(base_env, *common, "--send")
        assert no_key.returncode == 1 and "$LOCALMAXXING_API_KEY" in no_key.stderr
        refused = cli(keyed, *common, "--send")
        assert refused.returncode == 1 and "calls this run unverified" in refused.stderr
        sent = cli(keyed, *common, "--send", "--allow-unverified")
        assert sent.returncode == 0, sent.stderr
        receipt = addendum(record.with_name("rec.addenda") / "001-submission-receipt")["payload"]
        sid = receipt["submission_id"]
        assert f'"submission_id": "{sid}"' in sent.stdout and "HTTP 201" in sent.stdout
        again = cli(keyed, *common, "--send", "--allow-unverified")
        assert again.returncode == 1 and f"already submitted to {s.url}: id {sid}" in again.stderr
        checked = cli(base_env, "--url", s.url, "--check")
        assert checked.returncode == 0, checked.stderr
        assert f"public row {sid} (status PENDING, created " in checked.stdout
        assert "all match" in checked.stdout
        httpx.patch(f"{s.url}/api/speed-tests/{sid}", json={"quantization": "int4"})
        changed = cli(base_env, "--url", s.url, "--check")
        assert changed.returncode == 3 and "quantization: sent 'fp32', public 'int4'" in changed.stdout
        ledger = [json.loads(line) for line in (config / "submissions.jsonl").read_text().splitlines()]
        assert [e["event"] for e in ledger] == ["submitted", "checked", "checked"]
        assert len(posts(s.log, "/api/speed-tests")) == 1

    # The key: in no file this test or any earlier one wrote (records, queues, addenda,
    # ledgers, stand-in logs, pytest's tmp dirs), and in no output.
    needle = KEY.encode()
    scanned = 0
    for root in {tmp_path_factory.getbasetemp()}:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                scanned += 1
                assert needle not in path.read_bytes(), path
    assert scanned > 50
    assert all(KEY not in text for text in outputs)


# ------------------------------------------------------------ k blocks, A/A, v1 records

FIXTURES = FIXTURES_DIR


@pytest.fixture(scope="module")
def sealed_blocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-block ABBA record (8 legs): the headline may come from any block."""
    root = tmp_path_factory.mktemp("submit-blocks")
    # 3 rows, not 5, and no sampler: the test is about which leg is chosen, and 9 legs stream
    # in real time (the `sealed` record above keeps telemetry in a submission).
    path, plan = write_plan(root, plan_toml("submit-blocks", control=1000, candidate=1050,
                                            rows=3, idle=0, extra="blocks = 2",
                                            telemetry=False))
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    return exp


def test_dry_run_of_a_two_block_record_uses_every_candidate_leg(sealed_blocks: Path,
                                                                 tmp_path: Path) -> None:
    record = tmp_path / "blocks"
    shutil.copytree(sealed_blocks, record)
    rec = json.loads((record / "record.json").read_text())
    cands = {n: rec["runs"][n]["headline_tok_s"] for n in ("B1", "B2", "B3", "B4")}
    lowest = min(cands, key=cands.__getitem__)
    result = dry_run(record, LocalMaxxing(f"http://127.0.0.1:{closed_port()}", connect_timeout_s=1),
                     OPTS)
    assert result.valid, result.local_issues
    facts = result.prepared.facts
    assert (facts.leg, facts.candidate_legs, facts.blocks) == (lowest, ("B1", "B2", "B3", "B4"), 2)
    p = result.prepared.built.payload
    assert p["tokSOut"] == cands[lowest] == min(cands.values())
    assert p["ttftMs"] == rec["runs"][lowest]["ttft_median_ms"]
    a = rec["verdict_analysis"]
    assert (f"leg {lowest}, the lowest of the 4 candidate legs of ABBA experiment submit-blocks "
            f"(2 blocks); verdict {rec['verdict']} (candidate/control {a['ratio']:.4f}, 95 % CI "
            f"[{a['ci_low']:.4f}, {a['ci_high']:.4f}], leg-level t interval, df 5)") in p["notes"]
    assert any(f"leg {lowest} rows.json" in d for d in result.prepared.built.derivation)


def test_a_v1_record_still_submits_as_before(tmp_path: Path) -> None:
    from dataclasses import replace

    from tokrecord.submit.localmaxxing import build_payload

    record = tmp_path / "v1"
    shutil.copytree(FIXTURES / "v1-record" / "abba", record)
    facts = load_facts(record)  # it verifies: a v1 record is accepted as it is
    assert (facts.form, facts.leg, facts.candidate_legs, facts.blocks) == ("abba", "B1",
                                                                           ("B1", "B2"), 1)
    # Its legs fail token_count_integrity by design (see the fixture's README): refused.
    with pytest.raises(SubmitError, match="headline leg B1 is not valid"):
        build_payload(facts, OPTS)
    notes = build_payload(replace(facts, leg_valid=True), OPTS).payload["notes"]
    assert ("leg B1, the lower of the two candidate legs of ABBA experiment v1-abba; verdict "
            "FASTER; record status no_record.") in notes
    assert "leg-level" not in notes and "blocks" not in notes


def test_cli_refuses_an_aa_record(tmp_path: Path) -> None:
    record = tmp_path / "aa"
    shutil.copytree(FIXTURES / "report" / "v2-aa", record)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "300", "TERM": "dumb",
           "TOKRECORD_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = cli_in_process(["submit", str(record), "--url", f"http://127.0.0.1:{closed_port()}",
                           "--hf-id", "x/y"], env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "tokrecord: error: this is an A/A experiment (design 'aa'" in err
    assert "makes no speed claim, so there is nothing to submit" in err
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("aa.localmaxxing-*.queue.json"))  # nothing was queued
