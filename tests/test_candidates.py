"""bench/candidates/: every kernel diff waiting for a GPU still applies to this tree (CPU only).

A candidate that no longer applies cannot be measured by `tools/ab_device.sh NAME=DIFF`; rebase it
or delete it, and say which in bench/NOTES.md.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_DIFFS = sorted((_ROOT / "bench" / "candidates").glob("*.diff"))


@pytest.mark.parametrize("diff", _DIFFS, ids=[d.name for d in _DIFFS])
def test_candidate_applies(diff):
    check = subprocess.run(["git", "apply", "--check", "-p1", str(diff)], cwd=_ROOT, capture_output=True, text=True)
    assert check.returncode == 0, f"{diff.name} no longer applies:\n{check.stderr}"
