"""`tokrecord reaccount` end to end: a sealed leg and sealed experiments from the fake
server, re-accounted from their raw events into a sealed addendum; every refusal."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_support import cli_in_process
from plan_support import SLEEPING_FAKE, plan_toml, write_plan
from probes_support import FAST_IDLE_ARGS
from tokrecord.cli.reaccount import reaccount_dir
from tokrecord.evidence import read_jsonl
from tokrecord.evidence.seal import load_or_create_key, seal
from tokrecord.experiment.runner import run_experiment
from tokrecord.identity import sha256_file
from tokrecord.metrics import Convention
from tokrecord.record.build import build_record, finish
from tokrecord.record.verify import verify_dir
from tokrecord.report import load_report

CLI = [sys.executable, "-m", "tokrecord"]
FAKE_CMD = (f"{sys.executable} -m tokrecord.server.fake --host {{host}} --port {{port}} "
            "--model {model} --tok-s 2000 --ttft-ms 10")
DISPOSITION = "Preserve the receipt as submitted evidence; qualify the score; do not resubmit."


def cli_env() -> dict[str, str]:
    return {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb",
            "TOKRECORD_CONFIG_DIR": os.environ["TOKRECORD_CONFIG_DIR"], **SLEEPING_FAKE}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # In process (tests/cli_support.py): what `reaccount` writes, prints and exits with.
    return cli_in_process(list(args), cli_env())


def said(proc: subprocess.CompletedProcess[str]) -> str:
    """stderr with the console's line wrapping undone."""
    return " ".join(proc.stderr.split())


def reaccount(directory: Path, convention: str = "conventional",
              disposition: str = DISPOSITION) -> subprocess.CompletedProcess[str]:
    return run("reaccount", str(directory), "--convention", convention,
               "--disposition", disposition)


def addendum(directory: Path, n: int = 1) -> dict[str, Any]:
    path = directory.with_name(directory.name + ".addenda") / f"{n:03d}-re-accounting"
    return json.loads((path / "addendum.json").read_text())  # type: ignore[no-any-return]


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


@pytest.fixture(scope="module")
def sealed_leg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("leg") / "leg"
    proc = run("leg", "--server-cmd", FAKE_CMD, "--model", "m", "--rows", "3",
               "--headline", "legacy-inclusive-events", "--out", str(out), *FAST_IDLE_ARGS)
    assert proc.returncode == 3, proc.stderr  # sealed; not valid without a teacher (exit 3)
    return out


def _experiment(root: Path, design: str, prior: str, headline: str) -> Path:
    path, plan = write_plan(root, plan_toml(
        design, design=design, control=None if design == "single" else 1000, candidate=1050,
        rows=3, idle=0, prior=prior, extra=f'headline = "{headline}"', telemetry=False))
    exp = root / "exp"
    finish(exp, build_record(plan, exp, run_experiment(plan, exp, plan_text=path.read_bytes())))
    return exp


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prior = 'value_tok_s = 950\nid = "prev"\nbest_exact_tok_s = 1000\ngoal_tok_s = 1055'
    return _experiment(tmp_path_factory.mktemp("single"), "single", prior,
                       "legacy-inclusive-events")


@pytest.fixture(scope="module")
def abba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _experiment(tmp_path_factory.mktemp("abba"), "abba", "value_tok_s = 1000",
                       "conventional")


def test_leg_is_reaccounted_from_its_events(sealed_leg: Path) -> None:
    manifest = sha256_file(sealed_leg / "manifest.sha256")
    proc = reaccount(sealed_leg)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((sealed_leg / "summary.json").read_text())["summary"]
    doc = addendum(sealed_leg)
    assert doc["kind"] == "re-accounting" and doc["parent_manifest_sha256"] == manifest
    p = doc["payload"]
    assert p["schema"] == "tokrecord.reaccount/v1" and p["record_schema"] == "tokrecord.leg-summary/v1"
    assert p["original"]["convention"] == "legacy-inclusive-events"
    assert p["original"]["headline_tok_s"] == summary["tok_s_out"] == summary["tok_s_out_legacy"]
    assert p["reaccounted"]["convention"] == "conventional"
    assert p["reaccounted"]["headline_tok_s"] == summary["tok_s_out_conventional"]
    assert p["original"]["margins"] == {} == p["reaccounted"]["margins"]  # a bare leg has no goal
    rows = json.loads((sealed_leg / "rows.json").read_text())["rows"]
    (leg,) = p["legs"].values()
    assert leg["run_dir"] == "."
    assert [(r["row"], r["id"], r["original_tok_s"], r["reaccounted_tok_s"]) for r in leg["rows"]] \
        == [(r["trace"]["row"], r["trace"]["row_id"], r["metrics"]["rate_legacy"],
             r["metrics"]["rate_conventional"]) for r in rows]
    assert p["events_sha256"] == {"leg": sha256_file(sealed_leg / "events.jsonl")}
    assert p["disposition"] == DISPOSITION and p["tokrecord_version"]
    legacy, conv = p["original"]["headline_tok_s"], p["reaccounted"]["headline_tok_s"]
    assert proc.stdout.splitlines() == [
        f"legacy-inclusive-events  {legacy:.3f} tok/s  [100 / (timestamp[100] - timestamp[1])]",
        f"conventional             {conv:.3f} tok/s  [99 / (timestamp[100] - timestamp[1])]",
        f"disposition: {DISPOSITION}",
        f"re-accounting sealed: {sealed_leg}.addenda/001-re-accounting",
    ]
    # the record never changes; the addendum is sealed and verifies against it
    assert sha256_file(sealed_leg / "manifest.sha256") == manifest
    assert verify_dir(sealed_leg) == []
    assert verify_dir(sealed_leg.with_name("leg.addenda") / "001-re-accounting") == []
    # a second re-accounting is a new addendum, never a replacement
    assert reaccount(sealed_leg, "chunk-aware").returncode == 0
    assert addendum(sealed_leg, 2)["payload"]["reaccounted"]["convention"] == "chunk-aware"
    assert addendum(sealed_leg, 1) == doc


def test_single_leg_experiment_margins_in_both_conventions(single: Path) -> None:
    proc = reaccount(single)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((single / "record.json").read_text())
    acc, rec = record["metric_accounting"], record["record"]
    p = addendum(single)["payload"]
    before, after = p["original"], p["reaccounted"]
    assert p["record_schema"] == "tokrecord.single-leg-record/v2"  # a record written today
    assert before["headline_tok_s"] == rec["value_tok_s"] == acc["published_value_tok_s"]
    assert after["headline_tok_s"] == acc["conventional_interval_value_tok_s"]
    assert before["margins"]["goal"] == {
        "reference_tok_s": 1055, "margin_tok_s": rec["margin_over_goal_tok_s"],
        "margin_pct": pytest.approx(100 * (rec["value_tok_s"] / 1055 - 1), rel=1e-12)}
    assert after["margins"]["goal"]["margin_tok_s"] == acc["conventional_margin_to_goal_tok_s"]
    assert before["margins"]["prior_approved"]["margin_tok_s"] == rec["delta_vs_approved_tok_s"]
    assert before["margins"]["prior_best_exact"]["margin_pct"] == pytest.approx(
        rec["delta_vs_prior_best_exact_pct"], rel=1e-12)
    assert list(p["legs"]) == ["B1"] and p["legs"]["B1"]["run_dir"] == "B1/attempt-1"
    assert p["events_sha256"]["B1"] == sha256_file(single / "B1" / "attempt-1" / "events.jsonl")
    assert "vs goal 1055: " in proc.stdout
    # the report lists it, with its one-line text
    shown = [a for a in load_report(single, verify=False).addenda if a.kind == "re-accounting"]
    assert [a.name for a in shown] == ["001-re-accounting"]
    assert shown[0].text == p["text"]
    assert shown[0].text.startswith(
        f"re-accounted legacy-inclusive-events {before['headline_tok_s']:.3f} tok/s -> "
        f"conventional {after['headline_tok_s']:.3f} tok/s (goal 1055: margin ")
    assert shown[0].text.endswith(f"; disposition: {DISPOSITION}")


def test_abba_experiment_headline_leg_per_convention(abba: Path) -> None:
    result, path = reaccount_dir(abba, Convention.CHUNK_AWARE, "note the chunk-aware figure")
    record = json.loads((abba / "record.json").read_text())
    acc = record["metric_accounting"]
    assert result.original.headline_leg == acc["headline_leg"]
    assert result.original.headline_tok_s == acc["published_value_tok_s"]
    chunk = {n: r["chunk_aware_tok_s"] for n, r in record["runs"].items()
             if r["treatment"] == "candidate"}
    assert result.reaccounted.headline_tok_s == min(chunk.values())
    assert result.reaccounted.headline_leg == min(chunk, key=chunk.__getitem__)
    assert set(result.legs) == {"A1", "B1", "B2", "A2"}
    assert [n for n, leg in result.legs.items() if leg.candidate] == ["B1", "B2"]
    assert result.original.margins["prior_approved"].reference_tok_s == 1000
    assert "goal" not in result.original.margins  # an ABBA record has no goal
    assert path.name == "001-re-accounting" and verify_dir(path) == []


# --------------------------------------------------------------------------- refusals


def test_unknown_convention(sealed_leg: Path) -> None:
    proc = reaccount(sealed_leg, "inclusive")
    assert proc.returncode == 2
    assert "'inclusive' is not one of" in said(proc) and "chunk-aware" in said(proc)


def test_same_convention_is_refused(sealed_leg: Path) -> None:
    before = sorted(p.name for p in sealed_leg.parent.iterdir())
    proc = reaccount(sealed_leg, "legacy-inclusive-events")
    assert proc.returncode == 2
    assert "already publishes its headline in the legacy-inclusive-events convention" in said(proc)
    assert sorted(p.name for p in sealed_leg.parent.iterdir()) == before


def test_unsealed_directory_is_refused(sealed_leg: Path, single: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed_leg, tmp_path / "copy")
    (copy / "manifest.sha256").unlink()
    proc = reaccount(copy)
    assert proc.returncode == 2 and "is not sealed" in said(proc)
    proc = reaccount(single / "B1" / "attempt-1")
    assert proc.returncode == 2
    assert "sealed with the experiment: re-account the experiment directory" in said(proc)
    assert not (tmp_path / "copy.addenda").exists()


def test_altered_evidence_is_refused(sealed_leg: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed_leg, tmp_path / "altered")
    (copy / "server.log").write_text("changed\n")
    proc = reaccount(copy)
    assert proc.returncode == 2
    assert "does not verify" in said(proc) and "server.log" in said(proc)


def _resealed_with(src: Path, dst: Path, change: Any) -> Path:
    """A copy whose events.jsonl is changed, then sealed again: the seal holds, the events
    no longer recompute to what the leg recorded."""
    copy = writable_copy(src, dst)
    events = read_jsonl(copy / "events.jsonl")
    change(events)
    (copy / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for name in ("manifest.sha256", "manifest.sig.json"):
        (copy / name).unlink()
    seal(copy, load_or_create_key())
    return copy


def test_events_that_do_not_parse_name_the_row(sealed_leg: Path, tmp_path: Path) -> None:
    def miscount(events: list[dict[str, Any]]) -> None:
        next(e for e in events if e["kind"] == "chunk" and e["row"] == 1)["n"] = 2

    copy = _resealed_with(sealed_leg, tmp_path / "bad", miscount)
    proc = reaccount(copy)
    assert proc.returncode == 1
    assert "row 1: the raw events do not recompute" in said(proc)
    assert "recorded n=2 but its payload carries 1 tokens" in said(proc)
    assert not (tmp_path / "bad.addenda").exists()


def test_events_that_recompute_otherwise_name_the_row(sealed_leg: Path, tmp_path: Path) -> None:
    def delay(events: list[dict[str, Any]]) -> None:
        for e in events:
            if e["kind"] == "chunk" and e["row"] == 2 and e["seq"] >= 50:
                e["t_ns"] += 1_000_000

    copy = _resealed_with(sealed_leg, tmp_path / "late", delay)
    proc = reaccount(copy)
    assert proc.returncode == 1
    assert "row 2: the raw events do not recompute (rows.json: rows[2]" in said(proc)
