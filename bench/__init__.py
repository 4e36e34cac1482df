"""Benchmarks that print figures (not tests): run from the repository root."""
