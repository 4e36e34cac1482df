"""Leaderboard submission from sealed records (``tokrecord submit``).

* ``facts``: the verified facts of a sealed record (the only I/O before a payload);
* ``target``: the ``Target`` interface, the API key, HTTP exchanges as evidence;
* ``contract`` and ``localmaxxing``: the first target, its local schema and client;
* ``verified``: the verified-run evidence a payload carries, from the record;
* ``ledger``: one record, one submission per service;
* ``flow``: dry run (default), send, check (and wait) — queue file and sealed addenda;
* ``lifecycle``: a submission's sealed observations, read back in order;
* ``prior``: a plan's prior record, rechecked on the public API before it runs;
* ``standin``: a local stand-in for the LocalMaxxing API, shipped for rehearsals and tests.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Callable
from urllib.parse import urlsplit

from tokrecord.submit.facts import RecordFacts, SubmitError, load_facts
from tokrecord.submit.localmaxxing import DEFAULT_URL, URL_ENV, USER_AGENT, USER_AGENT_ENV, LocalMaxxing
from tokrecord.submit.target import ApiKey, PayloadOptions, Target, key_from_env

__all__ = ["TARGETS", "ApiKey", "PayloadOptions", "RecordFacts", "SubmitError", "Target",
           "key_from_env", "load_facts", "make_target"]


def _localmaxxing(url: str | None) -> Target:

    base = url or os.environ.get(URL_ENV) or DEFAULT_URL
    require_https_unless_loopback(base)
    return LocalMaxxing(base, user_agent=os.environ.get(USER_AGENT_ENV) or USER_AGENT)


def require_https_unless_loopback(url: str) -> None:
    """A bearer key and the evidence travel in the request: plain http:// only to this
    machine (a local stand-in), never across a network."""
    parsed = urlsplit(url)
    host = (parsed.hostname or "").lower()
    if parsed.scheme == "https":
        return
    loopback = host == "localhost"
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    if parsed.scheme != "http" or not loopback:
        raise SubmitError(f"refusing {url!r}: use https:// (plain http:// only to a loopback "
                          "address such as 127.0.0.1, for a local stand-in)")


# name -> factory(base URL or None for the target's default); add a target here.
TARGETS: dict[str, Callable[[str | None], Target]] = {"localmaxxing": _localmaxxing}


def make_target(name: str, url: str | None = None) -> Target:
    try:
        factory = TARGETS[name]
    except KeyError:
        raise SubmitError(f"unknown target {name!r}; known: {', '.join(sorted(TARGETS))}") from None
    return factory(url)
