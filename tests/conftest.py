"""Shared test fixtures (kept small and generic)."""

from pathlib import Path

import pytest


@pytest.fixture
def make_csv(tmp_path):
    """``make_csv(text, name="data.csv") -> Path``: write a small CSV file under the test's tmp_path."""

    def _make(text: str, name: str = "data.csv") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _make
