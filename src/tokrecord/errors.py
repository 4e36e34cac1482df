"""Errors a user can act on.

Every failure that reaches the CLI is a TokrecordError: one message that names
the cause, printed without a traceback, with a non-zero exit. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class TokrecordError(Exception):
    """A failure with a message meant for the user."""

    exit_code = 1


class ConfigError(TokrecordError):
    """Bad input: an option, a suite file, a config file."""

    exit_code = 2


class SuiteError(ConfigError):
    """A suite file that cannot be used (invalid JSON, duplicate prompt, ...)."""


class ServerError(TokrecordError):
    """The server under test failed to start, become ready or stop."""


class StreamError(TokrecordError):
    """A request failed: HTTP error, malformed SSE, stream cut mid-row."""


class EngineSetupError(TokrecordError):
    """The embedded engine venv could not be built or used."""


class EvidenceError(TokrecordError):
    """Evidence cannot be written: a full disk, a read-only directory, no permission.

    Its own exit code (EX_IOERR of sysexits.h), so a script can tell "the machine
    could not keep the evidence" from a failed measurement. What was written stays.
    """

    exit_code = 74
