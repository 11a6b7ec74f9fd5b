"""bench/candidates/: every kernel diff waiting for a GPU still applies to this tree, and each
candidate kernel change passes verify's bars in the kernel emulation (CPU only).

A candidate that no longer applies cannot be measured by `tools/ab_device.sh NAME=DIFF`; rebase it
or delete it, and say which in bench/NOTES.md.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

import emulation

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_DIFFS = sorted((_ROOT / "bench" / "candidates").glob("*.diff"))
# Measurement builds (clocks read through PTX; "phase-clocks" in the name), not changes to land:
# the emulation has no clocks.
_MEASUREMENT_BUILDS = {d.name for d in _DIFFS if "phase-clocks" in d.name}


@pytest.mark.parametrize("diff", _DIFFS, ids=[d.name for d in _DIFFS])
def test_candidate_applies(diff):
    check = subprocess.run(["git", "apply", "--check", "-p1", str(diff)], cwd=_ROOT, capture_output=True, text=True)
    assert check.returncode == 0, f"{diff.name} no longer applies:\n{check.stderr}"


@pytest.mark.skipif(emulation.unavailable() is not None, reason=str(emulation.unavailable()))
def test_candidates_pass_in_the_emulation():
    changes = [f"{d.stem}={d}" for d in _DIFFS if d.name not in _MEASUREMENT_BUILDS]
    if not changes:
        pytest.skip("no candidate kernel change in bench/candidates/")
    run = subprocess.run([sys.executable, str(_ROOT / "tools" / "emulated_ab.py"), *changes], cwd=_ROOT,
                         capture_output=True, text=True)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    for change in changes:
        name = change.split("=")[0]
        assert re.search(rf"^{re.escape(name)}: (\d+) of \1 launches pass", run.stdout, re.M), name
