"""tools/device_checks.sh on the CPU: the arguments it refuses before running anything, and the
summary a failed step leaves (verify without a GPU exits 3)."""

import os
import pathlib
import subprocess
import sys

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "device_checks.sh"


def run(*args, tmp_path, **env):
    return subprocess.run(["bash", str(TOOL), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CHECK_LIB": str(tmp_path / "no-lib"), **env})


def test_without_out_prints_its_usage(tmp_path):
    r = run(tmp_path=tmp_path)
    assert r.returncode == 2
    assert "tools/device_checks.sh OUT [STEP ...]" in r.stderr


def test_an_unknown_step_is_named_and_nothing_runs(tmp_path):
    r = run(str(tmp_path / "out"), "verify", "bench", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "unknown step 'bench'" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_failed_step_is_summarised_and_fails_the_run(tmp_path, same_package_env):
    # No GPU here: verify exits 3 ("no GPU"), which the summary records. The tool's python3 is
    # this interpreter.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = same_package_env(CUDA_VISIBLE_DEVICES="", CHECK_LIB=str(tmp_path / "no-lib"), PATH=path)
    r = subprocess.run(["bash", str(TOOL), str(tmp_path / "out"), "verify"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert len(summary) == 1 and summary[0].startswith("verify: rc 3 in "), summary
    assert summary[0] in r.stdout
