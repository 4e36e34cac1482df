"""Issue 31 item 5: secret-looking env values and flag values are recorded as
`<redacted: sha256 …>` in config.json, server.json, a teacher and the record; the names
stay, and the plan's hash is the plan's own (unchanged)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from tokrecord.evidence.redact import is_secret_env, redact_argv, redact_env, redacted
from tokrecord.experiment.leg import LegConfig, ServerSpec, _resolved_config
from tokrecord.experiment.plan import load_plan
from tokrecord.record import redacted_arm, unchanged_stack
from tokrecord.suite import load_suite

HF = "hf_" + "s3cr3t" * 5
SK = "sk-" + "live" * 6


def sha12(value: str) -> str:
    return f"<redacted: sha256 {hashlib.sha256(value.encode()).hexdigest()[:12]}>"


def test_which_names_and_flags_are_secret() -> None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD",
                 "AWS_SECRET_ACCESS_KEY", "hf_token", "MY-APIKEY"):
        assert is_secret_env(name), name
    for name in ("TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "VLLM_USE_V1", "KEYBOARD"):
        assert not is_secret_env(name), name
    argv = ["vllm", "serve", "m", "--api-key", SK, f"--hf-token={HF}", "--max-tokens", "9",
            "--num-speculative-tokens", "3"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", sha12(SK),
                                 f"--hf-token={sha12(HF)}", "--max-tokens", "9",
                                 "--num-speculative-tokens", "3"]
    # Read back from evidence and redacted again, a value keeps its hash.
    assert redacted(redacted(SK)) == sha12(SK)
    assert redact_env({"HF_TOKEN": HF, "A": "1"}) == {"HF_TOKEN": sha12(HF), "A": "1"}


def test_config_json_keeps_names_not_values() -> None:
    argv = (sys.executable, "-m", "tokrecord.server.fake", "--port", "{port}", "--api-key", SK)
    config = LegConfig(server=ServerSpec(argv=argv, env={"HF_TOKEN": HF, "FLAG": "1"}, model="m"),
                       suite=load_suite(None).head(1))
    resolved = _resolved_config(config, [*argv[:4], "8000", "--api-key", SK], 8000, epoch_ns=0)
    text = json.dumps(resolved)
    assert HF not in text and SK not in text
    assert resolved["leg"]["server"]["env"] == {"HF_TOKEN": sha12(HF), "FLAG": "1"}
    assert resolved["leg"]["server"]["argv"][-2:] == ["--api-key", sha12(SK)]
    assert resolved["resolved_argv"][-2:] == ["--api-key", sha12(SK)]
    # verify rebuilds the leg from config.json: the redacted form is a valid config.
    assert LegConfig.model_validate({**resolved["leg"], "suite": config.suite}).server.env[
        "HF_TOKEN"] == sha12(HF)


def test_the_record_keeps_names_not_values_and_the_plan_hash_is_unchanged(
        tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(f"""\
name = "secrets"

[server]
argv = ["vllm", "serve", "{{model}}", "--port", "{{port}}", "--api-key", "{SK}"]
model = "m"
env = {{ HF_TOKEN = "{HF}", VLLM_USE_V1 = "1" }}

[arms.control]
[arms.candidate]
env = {{ OPENAI_API_KEY = "{SK}" }}
extra_args = ["--hf-token", "{HF}"]
""")
    plan = load_plan(path)
    stack = unchanged_stack(plan)
    assert stack.env == {"HF_TOKEN": sha12(HF), "VLLM_USE_V1": "1"}
    assert stack.argv[-2:] == ["--api-key", sha12(SK)]
    arm = redacted_arm(plan.arms["candidate"])
    assert arm.env == {"OPENAI_API_KEY": sha12(SK)} and list(arm.extra_args) == ["--hf-token",
                                                                                 sha12(HF)]
    # The plan's hash is over the plan as written: redaction is only in what is recorded.
    assert HF in plan.canonical().decode() and plan.sha256 == hashlib.sha256(
        plan.canonical()).hexdigest()
