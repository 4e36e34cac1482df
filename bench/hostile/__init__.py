"""Hostile inputs for verify, lint and report (issue 31): `python -m bench.hostile`."""
