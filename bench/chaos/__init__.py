"""Crash anywhere, lose nothing: SIGKILLs at random instants, then resume (bench.chaos.run)."""
