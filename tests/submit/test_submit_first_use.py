"""Submit as a first user meets it: every missing input at once, the quantisation read
from the model the record identified, cautions before the payload, samples cut in the
terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_submit_payload import OPTS, V1, demo_facts, demo_identity, demo_record, record_of

from tokrecord.cli.submit import CELL_CHARS, _cell
from tokrecord.demo.gguf import build_demo_gguf
from tokrecord.identity.model import model_manifest
from tokrecord.record.schema import validate_record
from tokrecord.submit.cautions import record_cautions
from tokrecord.submit.facts import SubmitError
from tokrecord.submit.localmaxxing import build_payload
from tokrecord.submit.quant import config_quantization, gguf_file_type_name, model_quantization
from tokrecord.submit.target import PayloadOptions

LLAMA_ARGV = ("llama-server", "-m", "{model}", "--port", "{port}")


def test_every_missing_input_is_listed_at_once() -> None:
    with pytest.raises(SubmitError) as err:
        build_payload(demo_facts(server_argv=("./my-server", "--port", "{port}")),
                      PayloadOptions())
    text = str(err.value)
    assert text.startswith("3 inputs the record cannot supply; give:")
    assert [line.split(":")[0].strip() for line in text.splitlines()[1:]] == [
        "--hf-id ORG/NAME", "--engine-name", "--quantization"]


def test_quantisation_from_the_gguf_header(tmp_path: Path) -> None:
    gguf = build_demo_gguf(tmp_path)  # written ALL_F32
    identity = demo_identity().model_copy(update={"model": model_manifest(gguf)})
    built = build_payload(demo_facts(identity=identity, server_argv=LLAMA_ARGV), OPTS)
    assert built.payload["quantization"] == "F32"
    assert any("general.file_type in the GGUF header" in d for d in built.derivation)


def test_a_changed_model_file_is_not_read_as_the_records(tmp_path: Path) -> None:
    gguf = build_demo_gguf(tmp_path)
    model = model_manifest(gguf)
    changed = model.model_copy(update={"files": {gguf.name: "0" * 64}})
    quant, why = model_quantization(changed)
    assert quant is None and "has changed since the run" in why
    with pytest.raises(SubmitError, match="--quantization: neither the server argv"):
        build_payload(demo_facts(identity=demo_identity().model_copy(update={"model": changed}),
                                 server_argv=LLAMA_ARGV), OPTS)


def test_quantisation_from_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert model_quantization(model_manifest(tmp_path)) == (
        "bf16", f"config.json's quantization_config or torch_dtype of {tmp_path / 'config.json'} "
        "(sha256 as identified in the record)")
    assert config_quantization({"quantization_config": {"quant_method": "awq"},
                                "torch_dtype": "float16"}) == "awq"
    assert config_quantization({"torch_dtype": "auto"}) is None
    assert gguf_file_type_name(15) == "Q4_K_M" and gguf_file_type_name(1) == "F16"
    assert gguf_file_type_name(9999) is None


def test_cautions_no_record_and_a_slower_candidate() -> None:
    assert record_cautions(demo_record())[0].startswith("the record's status is no_record")
    raw = record_of(V1)
    raw["record_gate"].update({"candidate_lower_start_tok_s": 100.0,
                               "control_lower_start_tok_s": 130.0})
    cautions = record_cautions(validate_record(raw, older_form_ok=True))
    assert any("slower than the control's lower leg (130.00 tok/s) by 23.1 %" in c
               for c in cautions)


def test_long_values_are_cut_in_the_terminal() -> None:
    assert _cell("short") == "short"
    assert _cell({"a": 1}) == '{"a": 1}'
    cut = _cell("x" * 5000)
    assert cut.startswith("x" * CELL_CHARS + "…")
    assert cut.endswith("(5,000 characters; all of it in the queue file)")
