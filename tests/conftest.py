"""Shared pytest setup: tests marked ``gpu`` skip cleanly when no CUDA device is visible."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
