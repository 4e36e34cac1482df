"""Issue 31, finding 6 (secrets): nothing of tokrecord's own credentials reaches the server
under test, the payload's commandSnippet, or a non-loopback plain-http URL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokrecord.server.process import ServerProcess
from tokrecord.submit import SubmitError, make_target
from tokrecord.submit.localmaxxing import KEY_ENV, command_snippet

KEY = "bhk_" + "ab" * 20


def test_the_server_never_inherits_the_api_key(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    # A server that logs its environment, as the did.
    server = ServerProcess([sys.executable, "-c", "import os; print(dict(os.environ))"],
                           port=1, log_path=tmp_path / "server.log")
    server.start()
    assert server._proc is not None
    server._proc.wait(timeout=60)  # the child exits by itself once it has printed
    server.stop()
    log = (tmp_path / "server.log").read_text()
    assert "PATH" in log and KEY not in log


def test_secret_flags_are_redacted_in_the_command_snippet() -> None:
    text, _ = command_snippet(["vllm", "serve", "m", "--api-key", "sk-SECRET1",
                               "--hf-token=hf_SECRET2", "--port", "{port}"],
                              {"HF_TOKEN": "hf_SECRET3", "CUDA": "0"})
    for secret in ("sk-SECRET1", "hf_SECRET2", "hf_SECRET3"):
        assert secret not in text
    assert "--api-key '<redacted: sha256 " in text and "'--hf-token=<redacted: sha256 " in text
    assert "--port '{port}'" in text and "CUDA=0" in text


@pytest.mark.parametrize("url", ["http://leaderboard.example", "http://10.0.0.5:8000",
                                 "ftp://127.0.0.1"])
def test_plain_http_is_refused_beyond_loopback(url: str) -> None:
    with pytest.raises(SubmitError, match="use https://"):
        make_target("localmaxxing", url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8787", "http://localhost:1", "http://[::1]:9",
                                 "https://leaderboard.example"])
def test_https_and_loopback_are_accepted(url: str) -> None:
    make_target("localmaxxing", url).close()


def test_the_stripped_names_follow_the_submit_key() -> None:
    from tokrecord.server.process import OWN_CREDENTIAL_ENV, server_environ

    assert KEY_ENV in OWN_CREDENTIAL_ENV
    assert server_environ({KEY_ENV: KEY, "PATH": "/bin"}) == {"PATH": "/bin"}
