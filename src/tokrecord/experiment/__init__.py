"""Experiments: legs (one fresh server + one suite pass), and later designs of legs."""
