"""Issue 17 against the stand-in: verified-run evidence, the approval lifecycle, the prior
rechecked, and errors a person can act on.

Two fake-server records are sealed once per module: one in the fake's llama.cpp dialect
(its stream ends with llama.cpp's ``timings``, so the run is verifiable) and one in its
vLLM dialect (no timing report of its own: the dry run names the issue). Every test
works on its own copy, its own stand-in and its own ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from test_submit_flow import KEY, OPTS, addendum, posts, standin

from cli_support import cli_in_process
from plan_support import (
    FAKE_ARGV,
    MAX_TOKENS,
    SLEEPING_FAKE,
    SUITE_ROWS,
    TOPICS,
    plan_toml,
    write_plan,
)
from tokrecord.evidence import read_jsonl
from tokrecord.evidence.seal import parse_manifest, signer_fingerprint
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.report import load_report, render_markdown
from tokrecord.submit.contract import OUTPUT_SAMPLE_MAX
from tokrecord.submit.facts import SubmitError, load_facts
from tokrecord.submit.flow import Bounds, WaitPolicy, check, dry_run, send
from tokrecord.submit.ledger import Ledger
from tokrecord.submit.localmaxxing import LocalMaxxing
from tokrecord.submit.target import ApiKey


def _seal(root: Path, name: str, dialect: str | None, rows: int = SUITE_ROWS,
          max_tokens: int = MAX_TOKENS) -> Path:
    # No sampler: the submission lifecycle is not about telemetry (test_submit_flow's
    # `sealed` record submits one that has it).
    text = plan_toml(name, control=1000, candidate=1050, rows=rows, idle=0, telemetry=False)
    if dialect is not None:
        text = text.replace(json.dumps(FAKE_ARGV), json.dumps([*FAKE_ARGV, "--dialect", dialect]))
    path, plan = write_plan(root, text, max_tokens)
    exp = root / "exp"
    finish(exp, build_record(plan, exp, run_experiment(plan, exp, plan_text=path.read_bytes())))
    return exp


@pytest.fixture(scope="module")
def sealed_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Every topic's row, of 150 tokens: their outputs, as the JSON array the payload samples,
    # run past the 4000 characters kept, so the sample is cut to head and tail end to end.
    return _seal(tmp_path_factory.mktemp("llama-record"), "verified-llama", "llama.cpp",
                 rows=len(TOPICS), max_tokens=150)


@pytest.fixture
def record(sealed_llama: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "rec"
    shutil.copytree(sealed_llama, copy)
    return copy


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "cfg" / "submissions.jsonl")


def _env(tmp_path: Path, trust: Path | None = None, **extra: str) -> dict[str, str]:
    config = tmp_path / "cli-config"
    if trust is not None:  # --send sends only evidence whose key is pinned: trust the record's
        config.mkdir(exist_ok=True)
        (config / "trusted_keys").write_text(f"{signer_fingerprint(trust)} the test's record\n")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "220", "TERM": "dumb",
            "TOKRECORD_CONFIG_DIR": str(config), **SLEEPING_FAKE, **extra}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # In process (tests/cli_support.py): these tests are about what the commands print,
    # write and exit with, and run up to seven of them each.
    return cli_in_process(list(args), env)


# ------------------------------------------------------------------------ evidence


def test_verified_run_evidence_comes_from_the_sealed_record(record: Path, tmp_path: Path) -> None:
    facts = load_facts(record)
    leg_dir = record / facts.leg / "attempt-1"
    # By hand, from the raw events: each row's last event carries llama.cpp's timings.
    events = read_jsonl(leg_dir / "events.jsonl")
    rows = [json.loads(line)["id"] for line in (leg_dir / "suite.jsonl").read_text().splitlines()]
    expected = []
    for i, row_id in enumerate(rows):
        last = [e for e in events if e["row"] == i and e["kind"] == "chunk"][-1]
        expected.append({"row": row_id, "timings": json.loads(last["data"])["timings"]})
    with standin(tmp_path) as s:
        result = dry_run(record, LocalMaxxing(s.url), OPTS, key=ApiKey(KEY, "$K"))
    p = result.prepared.built.payload
    assert p["engineTimingsRaw"]["rows"] == expected and p["engineTimingsRaw"]["leg"] == facts.leg
    assert expected[0]["timings"]["predicted_n"] == 150  # the fake's schedule: a whole row
    texts = [r["trace"]["text"] for r in json.loads((leg_dir / "rows.json").read_text())["rows"]]
    sample = json.dumps(texts, separators=(",", ":"))
    assert len(sample) > OUTPUT_SAMPLE_MAX
    assert p["outputSample"] == sample[:2997] + "\n…\n" + sample[-1000:]
    assert p["engineBuild"] == "b0-fake"  # the fake llama-server's /props build_info
    assert p["engineFlags"]["concurrency"] == 1 and p["batchSize"] == 1
    assert result.verification is not None
    assert (result.verification.verified, result.verification.issues) == (True, ())
    assert not result.unverified


def test_dry_run_issues_then_send_verified(record: Path, tmp_path: Path, ledger: Ledger,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    # 2 rows: only its verification issues are read, and its 5 legs stream in real time.
    vllm = _seal(tmp_path_factory.mktemp("vllm-record"), "unverified-vllm", None, rows=2)
    with standin(tmp_path, "--min-output-tokens", "256") as s:
        target = LocalMaxxing(s.url)
        bad = dry_run(vllm, target, OPTS, key=ApiKey(KEY, "$K"))
        assert bad.valid and bad.unverified and bad.verification is not None
        assert bad.verification.issues == ("engineTimingsRaw missing",
                                           f"outputTokens {MAX_TOKENS} below 256")
        refused = ("calls this run unverified \\(engineTimingsRaw missing; "
                   f"outputTokens {MAX_TOKENS} below 256\\)")
        with pytest.raises(SubmitError, match=refused):
            send(vllm, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        assert posts(s.log, "/api/speed-tests") == []
    with standin(tmp_path) as s:
        target = LocalMaxxing(s.url)
        sent = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        assert sent.verification is not None and sent.verification.verified
        receipt = addendum(sent.receipt_dir)["payload"]
        assert (receipt["verified_run"], receipt["verification_issues"]) == (True, [])
        assert receipt["dry_run"]["verification"] == {"verified": True, "issues": []}
        row = httpx.get(f"{s.url}/api/speed-tests/{sent.acceptance.submission_id}").json()
        assert row["verifiedRun"] is True


# ----------------------------------------------------------------------- lifecycle


def test_check_wait_until_approved_seals_every_observation(record: Path, tmp_path: Path,
                                                           ledger: Ledger) -> None:
    with standin(tmp_path, "--approve-after", "3") as s:
        target = LocalMaxxing(s.url)
        sent = send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        sid = sent.acceptance.submission_id
        slept: list[float] = []
        waited = check(record, target, ledger=ledger, wait=True, sleep=slept.append,
                       policy=WaitPolicy(first_s=10, factor=1.5, max_s=12, total_s=600))
        assert waited.stopped == "final" and slept == [10, 12]
        assert [o.public_status for o in waited.observations] == ["PENDING", "PENDING", "APPROVED"]
        assert [o.check_dir.name for o in waited.observations] == [
            "002-submission-check", "003-submission-check", "004-submission-check"]
        created = httpx.get(f"{s.url}/api/speed-tests/{sid}").json()["createdAt"]
        for n, o in enumerate(waited.observations, start=1):
            c = addendum(o.check_dir)["payload"]
            assert (c["observation"], c["wait"], c["match"], c["public_created_at"]) == (n, True, True,
                                                                                       created)
        lc = waited.lifecycle
        assert lc is not None and lc.status == "APPROVED" and lc.submission_id == sid
        assert [o.status for o in lc.observations] == ["PENDING", "PENDING", "PENDING", "APPROVED"]
        assert [e.get("status") for e in ledger.entries()] == ["PENDING", "PENDING", "PENDING",
                                                               "APPROVED"]
    report = load_report(record, verify=False)
    assert report.submissions == (lc.text(),)
    assert f"- **Submission:** APPROVED at {s.url} (id {sid}; 3 checks): submitted " in \
        render_markdown(report)


def test_check_wait_rejected_time_bound_and_rate_limits(record: Path, tmp_path: Path,
                                                        ledger: Ledger) -> None:
    with standin(tmp_path, "--reject-after", "2", "--reject-reason", "not reproducible") as s:
        target = LocalMaxxing(s.url)
        send(record, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        rejected = check(record, target, ledger=ledger, wait=True, sleep=lambda _s: None)
        assert rejected.stopped == "final" and rejected.last.public_status == "REJECTED"
        assert rejected.last.exchange.body["rejectionReason"] == "not reproducible"

    # Never approved: polling stops within the total time (a fake clock moved by the pauses).
    other = tmp_path / "other"
    shutil.copytree(record, other)
    now = [0.0]

    def tick(seconds: float) -> None:
        now[0] += seconds

    with standin(tmp_path) as s:
        target = LocalMaxxing(s.url)
        send(other, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        timed = check(other, target, ledger=ledger, wait=True, sleep=tick, clock=lambda: now[0],
                      policy=WaitPolicy(first_s=5, factor=2, max_s=8, total_s=20))
        assert timed.stopped == "time" and now[0] == 13
        assert [o.public_status for o in timed.observations] == ["PENDING"] * 3

    # The public row's route is rate limited: the 429 is waited out as asked, and kept.
    third = tmp_path / "third"
    shutil.copytree(record, third)
    with standin(tmp_path, "--approve-after", "2", "--poll-rate-limit", "1", "--poll-window-s",
                 "0.5") as s:
        target = LocalMaxxing(s.url)
        send(third, target, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            # Real elapsed time, on purpose: the stand-in server (another process) opens
            # its rate-limit window on its own clock, so only a real wait gets past it.
            slept.append(seconds)
            time.sleep(seconds)

        limited = check(third, target, ledger=ledger, wait=True, sleep=sleep,
                        policy=WaitPolicy(first_s=0.01), bounds=Bounds(3, 5.0))
        assert limited.stopped == "final" and limited.last.public_status == "APPROVED"
        kept = addendum(limited.last.check_dir)["payload"]["rate_limited"]
        assert [e["http_status"] for e in kept] == [429] and 0 < kept[0]["body"]["retryAfterMs"] <= 500
        assert slept[0] == 0.01 and slept[1] == kept[0]["body"]["retryAfterMs"] / 1000


# -------------------------------------------------------------------------- errors


def test_cdn_403_401_and_400_are_explained(record: Path, tmp_path: Path, ledger: Ledger) -> None:
    with standin(tmp_path, "--block-user-agent", "python-httpx",
                 "--unknown-hf-id", "tokrecord/fake-model=tokrecord/fake-model-base",
                 "--key-sha256", hashlib.sha256(KEY.encode()).hexdigest()) as s:
        blocked = LocalMaxxing(s.url, user_agent=f"python-httpx/{httpx.__version__}")
        with pytest.raises(SubmitError, match="HTTP 403 from the CDN in front of the service "
                                              r"\(cloudflare\), not from the API"):
            send(record, blocked, OPTS, ApiKey(KEY, "$K"), ledger=ledger)
        result = dry_run(record, LocalMaxxing(s.url), OPTS, key=ApiKey(KEY, "$K"))
        assert result.remote_valid is False and result.remote_error is not None
        assert result.remote_error.endswith(
            "HTTP 400, the service refused the payload: Unknown model; field errors: hfId: "
            "tokrecord/fake-model is not a known Hugging Face model; the service suggests hfId "
            "'tokrecord/fake-model-base' (give it with --hf-id)")
        env = _env(tmp_path, trust=record, LOCALMAXXING_API_KEY="bhk_" + "0f" * 20)
        wrong = _cli(env, "submit", str(record), "--url", s.url, "--hf-id", "tokrecord/other",
                     "--quantization", "fp32", "--send")
        assert wrong.returncode == 1
        assert "HTTP 401, the API key is missing or wrong (the key from $LOCALMAXXING_API_KEY was " \
               "refused" in " ".join(wrong.stderr.split())
        assert "0f0f0f0f" not in wrong.stdout + wrong.stderr
        cdn = _cli({**env, "LOCALMAXXING_USER_AGENT": "python-httpx/0.28.1"}, "submit", str(record),
                   "--url", s.url, "--hf-id", "tokrecord/other", "--quantization", "fp32")
        assert "HTTP 403 from the CDN in front of the service" in " ".join(cdn.stderr.split())
    assert not record.with_name("rec.addenda").exists() and ledger.entries() == []


# --------------------------------------------------------------------------- prior


def _prior_plan(root: Path, value: float) -> Path:
    text = plan_toml("with-prior", design="single", control=None, candidate=1050, rows=2, idle=0,
                     prior=f'value_tok_s = {value!r}\nid = "cmprior0001"')
    return write_plan(root, text)[0]


def _prior_rows(path: Path, status: str, tok_s: float) -> Path:
    path.write_text(json.dumps([{"id": "cmprior0001", "status": status, "tokSOut": tok_s,
                                 "createdAt": "2026-07-20T10:00:00.000Z", "hfId": "tokrecord/fake"}]))
    return path


def test_the_prior_is_rechecked_at_preregistration(tmp_path: Path) -> None:
    plan = _prior_plan(tmp_path / "plan", 1000.25)
    env = _env(tmp_path)
    with standin(tmp_path, "--rows", str(_prior_rows(tmp_path / "rows-ok.json", "APPROVED", 1000.25))) as s:
        ok = _cli(env, "run", str(plan), "--out", str(tmp_path / "exp"), "--prior-url", s.url)
        assert ok.returncode in (0, 3), ok.stdout + ok.stderr
        assert f"prior cmprior0001 rechecked on {s.url} at " in ok.stderr
        assert "APPROVED, tokSOut 1000.25 = the plan's value_tok_s" in ok.stderr
    check_doc = json.loads((tmp_path / "exp" / "prior-check.json").read_text())
    assert (check_doc["rechecked"], check_doc["status"], check_doc["tok_s_out"], check_doc["match"]) == (
        True, "APPROVED", 1000.25, True)
    assert check_doc["created_at"] == "2026-07-20T10:00:00.000Z"
    entries, _ = parse_manifest((tmp_path / "exp" / "manifest.sha256").read_bytes())
    assert "prior-check.json" in {name for name, _ in entries}  # sealed with the record
    verified = _cli(env, "verify", str(tmp_path / "exp"))
    assert verified.returncode == 0, verified.stdout

    for status, tok_s, message in (("APPROVED", 1001.0, "the prior no longer matches"),
                                   ("PENDING", 1000.25, "is PENDING, not APPROVED")):
        rows = _prior_rows(tmp_path / f"rows-{status}-{tok_s}.json", status, tok_s)
        with standin(tmp_path, "--rows", str(rows)) as s:
            out = tmp_path / f"refused-{status}"
            refused = _cli(env, "run", str(plan), "--out", str(out), "--prior-url", s.url)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "the plan is refused" in refused.stderr and message in " ".join(refused.stderr.split())
        assert not out.exists()  # nothing was preregistered
    with standin(tmp_path) as s:  # no such row at all
        missing = _cli(env, "run", str(plan), "--out", str(tmp_path / "missing"), "--prior-url", s.url)
    assert missing.returncode == 2 and "was not found" in missing.stderr

    offline = _cli(env, "run", str(plan), "--out", str(tmp_path / "offline"), "--offline-prior",
                   "--prior-url", "http://127.0.0.1:9")
    assert offline.returncode in (0, 3), offline.stdout + offline.stderr
    doc = json.loads((tmp_path / "offline" / "prior-check.json").read_text())
    assert doc["rechecked"] is False and doc["reason"] == "not rechecked: tokrecord run --offline-prior"


# ------------------------------------------------------------------------- the key


def test_the_cli_lifecycle_and_the_key_in_zero_files(record: Path, tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    env = _env(tmp_path, trust=record, LOCALMAXXING_API_KEY=KEY)
    outputs: list[str] = []

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = _cli(env, "submit", str(record), *args)
        outputs.append(proc.stdout + proc.stderr)
        return proc

    with standin(tmp_path, "--approve-after", "3") as s:
        common = ("--url", s.url, "--hf-id", "tokrecord/fake-model", "--quantization", "fp32")
        dry = cli(*common)
        assert dry.returncode == 0 and "verification: verified" in dry.stdout, dry.stdout + dry.stderr
        sent = cli(*common, "--send")
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert '"verified_run": true' in sent.stdout
        waited = cli("--url", s.url, "--check", "--wait", "--poll-s", "0.1")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        text = waited.stdout
        assert "submission status: APPROVED at " in text and "(status APPROVED, created " in text
        assert "  001-submission-receipt  " in text and "  004-submission-check  " in text
        assert [line.split()[2] for line in text.splitlines()
                if line.startswith("  00")] == ["PENDING", "PENDING", "PENDING", "APPROVED"]
    needle = KEY.encode()
    scanned: list[Path] = []
    for path in tmp_path_factory.getbasetemp().rglob("*"):
        if path.is_file() and not path.is_symlink():
            scanned.append(path)
            assert needle not in path.read_bytes(), path
    names = {p.name for p in scanned}
    assert {"addendum.json", "submissions.jsonl", "events.jsonl", "record.json"} <= names
    assert len(scanned) > 100
    assert all(KEY not in out for out in outputs)

