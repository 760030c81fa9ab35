"""Fixtures of the fine-tuning tests."""

from pathlib import Path

import pytest

from support.hf_esm import random_hf_esm


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    """A tiny random Hugging Face ESM-2 folder (1 layer x 32), the base the Python-API runs fine-tune (read-only)."""
    path = tmp_path_factory.mktemp("tiny_base") / "base"
    random_hf_esm(path, hidden=32, heads=2, layers=1)
    return path
