"""Which engine a plan or leg names, or the argv implies; and the endpoint that follows."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from plan_support import plan_toml
from tokrecord.engines import Endpoint, EngineName, engine_for, fill_endpoint, infer_engine
from tokrecord.experiment.leg import LegConfig, ServerSpec
from tokrecord.experiment.plan import parse_plan
from tokrecord.suite import load_suite


@pytest.mark.parametrize(("argv", "engine"), [
    (["/e/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
    (["vllm", "serve", "meta-llama/Llama-3.2-1B"], "vllm"),
    (["llama-server", "-m", "x.gguf", "--port", "{port}"], "llama.cpp"),
    (["/opt/llama.cpp/build/bin/llama-server", "-m", "x.gguf"], "llama.cpp"),
    (["/v/bin/python", "/pkg/tokrecord/data/llama_server.py", "-m", "x.gguf"], "llama.cpp"),
    (["python", "-m", "tokrecord.server.fake", "--port", "{port}"], "vllm"),
    (["python", "-m", "tokrecord.server.fake", "--dialect", "llama.cpp"], "llama.cpp"),
    (["./my-server", "--listen", "{port}"], "openai"),
    # A vLLM command serving a model with "llama-server" in its name is still vLLM.
    (["vllm", "serve", "org/llama-server-distill"], "vllm"),
])
def test_infer_engine(argv: list[str], engine: str) -> None:
    assert infer_engine(argv) == EngineName(engine)


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown engine 'llamacpp'; known engines: 'vllm'"):
        engine_for("llamacpp")


def test_endpoint_defaults_to_the_engine_s_own() -> None:
    assert fill_endpoint({"engine": "llama.cpp"}, None)["endpoint"] == "native"
    assert fill_endpoint({}, ["llama-server", "-m", "x"])["endpoint"] == "native"
    assert fill_endpoint({}, ["vllm", "serve", "m"])["endpoint"] == "completions"
    assert fill_endpoint({"endpoint": "chat"}, ["llama-server"])["endpoint"] == "chat"


def plan_dict() -> dict[str, Any]:
    return tomllib.loads(plan_toml("engines"))


def test_a_vllm_plan_hashes_as_before_engines_existed() -> None:
    data = plan_dict()
    omitted = parse_plan(data, "plan")
    explicit = parse_plan({**data, "endpoint": "completions"}, "plan")
    assert omitted.endpoint is Endpoint.COMPLETIONS
    assert omitted.sha256 == explicit.sha256
    assert '"engine":' not in omitted.canonical().decode()


def test_a_named_engine_is_in_the_plan_hash() -> None:
    data = plan_dict()
    assert parse_plan({**data, "engine": "vllm"}, "p").sha256 != parse_plan(data, "p").sha256


def test_leg_config_infers_and_says_so() -> None:
    suite = load_suite(None).head(1)
    config = LegConfig(server=ServerSpec(argv=("llama-server", "-m", "{model}"), model="x.gguf"),
                       suite=suite)
    assert config.engine is None and config.engine_name is EngineName.LLAMA_CPP
    assert config.endpoint is Endpoint.NATIVE
    # config.json written before engines existed: no engine key, an explicit endpoint.
    old = LegConfig.model_validate({"server": {"argv": ["vllm", "serve"], "model": "m"},
                                    "suite": suite, "endpoint": "completions"})
    assert old.engine_name is EngineName.VLLM and old.endpoint is Endpoint.COMPLETIONS
