"""The server under test: lifecycle, the embedded vLLM CPU default, and a paced fake."""

from tokrecord.server.process import (
    CleanupReport,
    ServerProcess,
    check_port_free,
    free_port,
    port_is_listening,
    render_argv,
)

__all__ = [
    "CleanupReport",
    "ServerProcess",
    "check_port_free",
    "free_port",
    "port_is_listening",
    "render_argv",
]
