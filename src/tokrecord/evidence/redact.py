"""Secrets out of evidence: a value that looks like a credential is written as
`<redacted: sha256 …>`; its name (the flag, the env variable) stays.

Used by everything that writes the server's command or environment where others read
it: a leg's config.json and server.json, a teacher, the record, and the leaderboard
payload's commandSnippet. The hash prefix lets the value's owner recognise it; nobody
else learns it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

_REDACTED = re.compile(r"^<redacted: sha256 [0-9a-f]{12}>$")

# Flags whose value is a credential: `--api-key sk-…` or `--hf-token=hf_…`. A whole word of
# the flag must say so: `--num-speculative-tokens` and `--max-tokens` are not secrets.
SECRET_FLAG = re.compile(r"^--?(?:[a-z0-9]+[-_])*(?:token|key|apikey|secret|password|passwd)"
                         r"(?:[-_][a-z0-9]+)*$", re.IGNORECASE)

# Env names: a word of the name that is, or ends in, one of these (HF_TOKEN, OPENAI_API_KEY,
# DB_PASSWORD, AWS_SECRET_ACCESS_KEY, HFTOKEN); TOKENIZERS_PARALLELISM keeps its value.
_SECRET_WORDS = ("TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL",
                 "CREDENTIALS", "AUTH")


def is_secret_env(name: str) -> bool:
    return any(part.endswith(_SECRET_WORDS) for part in re.split(r"[^A-Za-z0-9]+", name.upper()))


def redacted(value: str) -> str:
    """A secret as it may be published. Idempotent: a value redacted already (read back
    from evidence) is kept as it is."""
    if _REDACTED.match(value):
        return value
    return f"<redacted: sha256 {hashlib.sha256(value.encode()).hexdigest()[:12]}>"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with the value of every secret-looking flag redacted (both `--flag v` and
    `--flag=v`)."""
    out: list[str] = []
    secret_next = False
    for arg in argv:
        if secret_next:
            out.append(redacted(arg))
            secret_next = False
            continue
        flag, eq, value = arg.partition("=")
        if SECRET_FLAG.match(flag):
            out.append(f"{flag}={redacted(value)}" if eq else arg)
            secret_next = not eq
            continue
        out.append(arg)
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """env with the value of every secret-looking name redacted."""
    return {k: redacted(v) if is_secret_env(k) else v for k, v in env.items()}
