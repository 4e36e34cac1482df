"""Measurement fidelity of tokrecord and its peers against the fake server's own log."""
