"""The kernels in the emulation under ThreadSanitizer (tests/emulation/race_check.cpp): no two
threads of a block touch the same memory without a barrier, warp operation or mbarrier phase that
orders them, in any configuration and warp schedule; and the detector does report a missing
barrier. On the CPU, what compute-sanitizer's racecheck checks on a GPU, under the ordering rules
the emulation implements (docs/emulation.md). Not a GPU test: it runs in CI."""

from __future__ import annotations

import subprocess

import pytest

import emulation

pytestmark = pytest.mark.skipif(emulation.unavailable() is not None, reason=str(emulation.unavailable()))

RACE = "WARNING: ThreadSanitizer: data race"


@pytest.fixture(scope="module")
def race_check(tmp_path_factory):
    return emulation.build(tmp_path_factory.mktemp("race_check"), target="sparse_mla_race_check")


def _run(program, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("mode,races,returncode", [("missing", 1, 66), ("synced", 0, 0)])
def test_the_detector_reports_a_missing_barrier_and_only_that(race_check, mode, races, returncode):
    run = _run(race_check, "--self-check", mode)
    assert run.stderr.count(RACE) == races, run.stderr[-4000:]
    assert run.returncode == returncode  # 66: TSan's exit code after a report


# Launches that ran per cache (D 512 / 576, 16- / 32-head blocks, the variants each has, a split
# launch, 3 schedules): the check covers what it says.
LAUNCHES = {"bf16": 30, "fp16": 30, "fp8_e4m3": 36, "fp8_ds_mla": 39}


@pytest.mark.parametrize("kv", LAUNCHES)
def test_no_kernel_touches_memory_that_no_barrier_orders(race_check, kv):
    run = _run(race_check, kv)
    assert RACE not in run.stderr, run.stderr[:6000]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.count(": ran\n") == LAUNCHES[kv]
