"""Generation requests as the fake server reads them: OpenAI completions and chat bodies,
and the helpers the native dialects' readers share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from tokrecord.jsontypes import JSONObject
from tokrecord.server.fake.constants import DEFAULT_MAX_TOKENS
from tokrecord.server.fake.tokens import chat_prompt_text, prompt_token_ids


class _RequestError(Exception):
    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True)
class _Generation:
    chat: bool
    prompt_ids: tuple[int, ...]
    prompt_key: str
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    # llama.cpp's per-request prompt cache (its `cache_prompt`, on unless it says false).
    cache_prompt: bool = False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_bool(body: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _RequestError(400, f"{where}{key} must be a boolean", param=key)
    return value


def _completion_prompt(prompt: object) -> tuple[tuple[int, ...], str]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tuple(prompt_token_ids(prompt)), prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        ids = tuple(cast(list[int], prompt))
        return ids, " ".join(str(t) for t in ids)
    raise _RequestError(
        400,
        "prompt must be a string or a list of token ids (one prompt per request)",
        param="prompt",
    )


def _chat_messages(messages: object) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _RequestError(400, "messages must be a non-empty list", param="messages")
    rendered: list[dict[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _RequestError(400, "each message needs a string role", param="messages")
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            text = "".join(p["text"] for p in content)
        else:
            raise _RequestError(
                400, "message content must be a string or text parts", param="messages"
            )
        rendered.append({"role": message["role"], "content": text})
    return rendered


def _parse_generation(chat: bool, body: object, model: str) -> _Generation:
    if not isinstance(body, dict):
        raise _RequestError(400, "request body must be a JSON object")
    requested_model = body.get("model")
    if requested_model is not None and requested_model != model:
        raise _RequestError(
            404, f"The model `{requested_model}` does not exist.", "NotFoundError", "model"
        )
    if body.get("n") not in (None, 1):
        raise _RequestError(400, "the fake server supports n = 1 only", param="n")
    if body.get("echo"):
        raise _RequestError(400, "the fake server does not support echo", param="echo")
    if chat:
        text = chat_prompt_text(_chat_messages(body.get("messages")))
        ids, key = tuple(prompt_token_ids(text)), text
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        if "prompt" not in body:
            raise _RequestError(400, "prompt is required", param="prompt")
        ids, key = _completion_prompt(body["prompt"])
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens) or max_tokens < 1:
        raise _RequestError(
            400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", param="max_tokens"
        )
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise _RequestError(400, "stream_options must be an object", param="stream_options")
    if options and not stream:
        # vLLM rejects this too; accepting it would hide a client that forgot `stream`.
        raise _RequestError(
            400, "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    include_usage = _optional_bool(options, "include_usage", "stream_options.")
    continuous = _optional_bool(options, "continuous_usage_stats", "stream_options.")
    return _Generation(
        chat=chat,
        prompt_ids=ids,
        prompt_key=key,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        # As in vLLM: continuous usage stats only ride along with include_usage.
        continuous_usage=include_usage and continuous,
        return_token_ids=_optional_bool(body, "return_token_ids"),
    )


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> JSONObject:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
