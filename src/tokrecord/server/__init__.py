"""The server under test: lifecycle, the embedded vLLM CPU default, and a paced fake."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokrecord.server.process import (
        CleanupReport,
        PortHold,
        ServerProcess,
        check_port_free,
        free_port,
        port_is_listening,
        render_argv,
    )

__all__ = [
    "CleanupReport",
    "PortHold",
    "ServerProcess",
    "check_port_free",
    "free_port",
    "port_is_listening",
    "render_argv",
]


def __getattr__(name: str) -> Any:
    """The lifecycle's names, imported on first use: `python -m tokrecord.server.fake` runs
    this package's __init__ too, and the fake server needs none of them (process imports
    every engine adapter, the larger part of each fake server's start-up)."""
    if name in __all__:
        return getattr(importlib.import_module("tokrecord.server.process"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
