"""Two real records from the fake server, made with every feature the seeds use: an ABBA
experiment with components, a declared source tree, native modules, a local model, log
facts, log rules and speculative counters; and a single-leg record against a goal, then
re-accounted into the conventional convention with a disposition."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokrecord.record.verify import verify_dir

HF_ID = "tokrecord/audit-target"
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "fixtures" / "components" / "h200-rmsnorm"
FAKE = [sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--ttft-ms", "20"]

SUITE = "".join(json.dumps({"id": f"row-{i}", "prompt": f"Explain topic {i} in depth, with "
                            f"worked examples (case {i}).", "max_tokens": 160}) + "\n"
                for i in range(6))


def _plan(name: str, design: str, root: Path) -> str:
    model = snapshot(root, "target")
    single = design == "single"
    lines = [
        f'name = "{name}"', f'design = "{design}"', 'suite = "suite.jsonl"',
        'teacher = "capture"', "idle_gap_s = 0.5",
        'headline = "legacy-inclusive-events"' if single else "",
        "[idle]", "interval_s = 0.05", "consecutive = 2", "timeout_s = 60",
        "host_cpu_max_pct = 100", "device_util_max_pct = 100",
        # Boundaries the sequence gates test (the fake's prompts are about 10 tokens).
        "[gates]", "long_context_threshold = 9", "rollover_boundary = 64",
        "[server]", f"argv = {json.dumps(FAKE)}", 'model = "fake-model"',
        "ready_timeout_s = 30", "stop_grace_s = 3",
        "[identity]", f'model_path = "{model}"',
        'native_globs = { harness = ["pydantic_core/*.so"] }',
        "[identity.sources.main]", f'path = "{REPO}"', f'public_base = "{_base_commit()}"',
        "[[log_facts]]", 'name = "listening_port"', 'pattern = "listening on http://[^:]+:(\\\\d+)"',
        'reduce = "last"', 'value = "int"',
    ]
    if not single:
        lines += ["[arms.control]", 'env = { TOKRECORD_FAKE_TOK_S = "2000", '
                  'TOKRECORD_FAKE_TOKENS_PER_CHUNK = "2" }']
    spec = json.dumps({"method": "draft_model", "model": str(snapshot(root, "draft")),
                       "num_speculative_tokens": 2, "draft_sample_method": "greedy",
                       "rejection_sample_method": "standard"})
    lines += ["[arms.candidate]", 'env = { TOKRECORD_FAKE_TOK_S = "2400", '
              'TOKRECORD_FAKE_TOKENS_PER_CHUNK = "2" }',
              f"extra_args = {json.dumps(['--speculative-config', spec])}",
              "[[arms.candidate.log_rules]]", 'claim = "fake_server_listening"',
              'pattern = "fake server listening on"',
              "[[arms.candidate.log_rules]]", 'claim = "draft_lm_head_prepared"',
              'pattern = "draft lm head prepared"',
              "[prior]", 'id = "prior-row"', "value_tok_s = 2100.0"]
    if single:
        lines += ["best_exact_tok_s = 2200.0", "goal_tok_s = 2300.0"]
    else:
        lines += ["[[components]]", 'name = "rmsnorm"',
                  'kernels = ["pow_tensor_scalar", "MeanOps", "CUDAFunctorOnSelf_add", '
                  '"rsqrt_kernel", "MulFunctor", "_rmsnorm_kernel"]',
                  'control_traces = ["traces/control.trace.json"]',
                  'candidate_traces = ["traces/candidate.trace.json"]',
                  'check = "traces/check.json"']
    return "\n".join(lines) + "\n"


def snapshot(root: Path, name: str) -> Path:
    """A model directory laid out as the Hugging Face cache lays out a download, so that
    identity reads its hub id and revision as it would for a real one."""
    rev = hashlib.sha1(name.encode()).hexdigest()
    return root / "hub" / f"models--tokrecord--audit-{name}" / "snapshots" / rev


def _base_commit() -> str:
    """The public commit the checkout builds on, for the source's bundle and patch: here
    the parent of HEAD (any commit an auditor can fetch would do)."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD~1"], check=True,
                          capture_output=True, text=True).stdout.strip()


def make_records(root: Path) -> dict[str, Path]:
    """The experiment directories, sealed, verified, rechecked against and submitted to the
    LocalMaxxing stand-in, and (single leg) re-accounted: {"abba": ..., "single": ...}."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TRACES, root / "traces", dirs_exist_ok=True)
    model = snapshot(root, "target")
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 16)
    draft = snapshot(root, "draft")
    draft.mkdir(parents=True, exist_ok=True)
    (draft / "config.json").write_text('{"num_hidden_layers": 1}\n')
    (draft / "model.safetensors").write_bytes(bytes(range(128)) * 8)
    (root / "suite.jsonl").write_text(SUITE)
    (root / "rows.json").write_text(json.dumps([{"id": "prior-row", "status": "APPROVED",
                                                  "tokSOut": 2100.0, "hfId": HF_ID,
                                                  "createdAt": "2026-11-30T10:00:00.000Z"}]))
    env = {**os.environ, "TOKRECORD_CONFIG_DIR": str(root / "config"), "COLUMNS": "200",
           # A key made for this run, in the environment only (the stand-in takes any).
           "LOCALMAXXING_API_KEY": "bhk_" + secrets.token_hex(20)}
    out = {}
    with _standin(root) as url:
        for kind, design in (("abba", "abba"), ("single", "single")):
            path = root / f"{kind}.toml"
            path.write_text(_plan(f"seed-audit-{kind}", design, root))
            exp = root / kind
            _cli(env, "run", str(path), "--out", str(exp), "--prior-url", url)
            problems = verify_dir(exp)
            if problems:
                raise SystemExit(f"{exp}: does not verify: {problems[:3]}")
            submit = [str(exp), "--url", url, "--hf-id", HF_ID, "--quantization", "fp32"]
            # The fake vLLM exposes no engine timings, so the service calls the run
            # unverified: the audit sends it anyway, as the flag allows.
            _cli(env, "submit", *submit, "--send", "--allow-unverified")
            _cli(env, "submit", str(exp), "--url", url, "--check", "--wait", "--poll-s", "0.2")
            out[kind] = exp
    # The single-leg seed's correction, as tokrecord makes it: an addendum.
    _cli(env, "reaccount", str(out["single"]), "--convention", "conventional",
         "--disposition", "Keep the submitted receipt; qualify the value in the "
         "conventional convention.")
    return out


def _cli(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tokrecord", *args], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tokrecord {args[0]} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


@contextlib.contextmanager
def _standin(root: Path) -> Iterator[str]:
    """The LocalMaxxing stand-in, approving a row on its second look, serving the prior."""
    proc = subprocess.Popen([sys.executable, "-m", "tokrecord.submit.standin", "--port", "0",
                             "--approve-after", "2", "--rate-limit", "5",
                             "--rows", str(root / "rows.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"the stand-in did not start: {line!r}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def load(exp: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((exp / "record.json").read_text())
    return data
