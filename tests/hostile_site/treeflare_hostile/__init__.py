"""Test-only code shipped to one simulated site to make it misbehave (never part of the package)."""
