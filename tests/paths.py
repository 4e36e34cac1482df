"""Where the tests' fixtures are, wherever a test file sits in the tree."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent  # the repository
