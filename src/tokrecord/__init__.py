"""tokrecord: speed records for local LLM inference that hold up to scrutiny."""

__version__ = "0.1.0"
