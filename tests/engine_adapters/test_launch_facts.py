"""Engine.launch_facts (issue 30): each adapter reads its own server's flags, so submit/
and the gates never parse an argv themselves."""

from __future__ import annotations

from tokrecord.engines import ENGINES, EngineName

VLLM, LLAMA, SGLANG, OPENAI = (ENGINES[n] for n in (EngineName.VLLM, EngineName.LLAMA_CPP,
                                                     EngineName.SGLANG, EngineName.OPENAI))


def test_vllm_reads_its_flags() -> None:
    argv = ["vllm", "serve", "m", "--quantization", "awq", "--dtype", "half", "-tp", "2",
            "--max-model-len", "4096", "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching",
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']
    f = VLLM.launch_facts(argv, {})
    assert (f.quantization, f.quantization_source) == ("awq", "--quantization awq")
    assert (f.tensor_parallel, f.context_length, f.kv_cache_dtype) == (2, 4096, "fp8")
    assert f.prefix_caching is False
    assert f.speculative is not None and f.speculative.num_speculative_tokens == 4
    assert VLLM.launch_facts(["vllm", "--dtype", "bfloat16", "--enable-prefix-caching"], {}
                             ).model_dump(exclude={"speculative"}) == {
        "quantization": "bf16", "quantization_source": "--dtype bfloat16 (unquantized weights)",
        "prefix_caching": True, "tensor_parallel": None, "context_length": None,
        "kv_cache_dtype": None}


def test_each_engine_reads_only_its_own_spelling() -> None:
    assert SGLANG.launch_facts(["sglang", "--tp-size", "4", "--context-length", "8192",
                                "--disable-radix-cache", "--max-model-len", "1"], {}
                               ).model_dump(include={"tensor_parallel", "context_length",
                                                     "prefix_caching"}) == {
        "tensor_parallel": 4, "context_length": 8192, "prefix_caching": False}
    # vLLM has no --tp-size, llama.cpp no tensor-parallel degree and no --quantization.
    assert VLLM.launch_facts(["vllm", "--tp-size", "4", "-c", "99"], {}).tensor_parallel is None
    llama = LLAMA.launch_facts(["llama-server", "-c", "2048", "-ctk", "q8_0", "-ctv", "f16",
                                "-tp", "2", "--quantization", "awq"], {})
    assert (llama.context_length, llama.kv_cache_dtype) == (2048, "k:q8_0,v:f16")
    assert (llama.tensor_parallel, llama.quantization) == (None, None)
    assert llama.quantization_source == "no --quantization or --dtype in the server argv"


def test_an_unknown_server_is_read_with_every_known_spelling() -> None:
    f = OPENAI.launch_facts(["my-server", "--tp", "8", "--ctx-size", "512", "-ctk", "q4_0"], {})
    assert (f.tensor_parallel, f.context_length, f.kv_cache_dtype) == (8, 512, "q4_0")
    assert OPENAI.launch_facts(["s", "--dtype", "auto", "-tp", "x"], {}).model_dump(
        include={"quantization", "quantization_source", "tensor_parallel"}) == {
        "quantization": None, "quantization_source": "--dtype auto", "tensor_parallel": None}
