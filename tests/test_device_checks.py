"""tools/device_checks.sh on the CPU: the arguments it refuses before running anything, the
summary a failed step leaves (verify without a GPU exits 3), a failed build skipping the steps
after it, and the sanitizer steps judged by the tools' summaries (stand-in programs on PATH)."""

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
    assert "Exits 0 when every step passed" in r.stderr


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


def _fake_tool(bin_dir: pathlib.Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / name).chmod(0o755)


def test_a_failed_build_skips_the_steps_after_it(tmp_path):
    _fake_tool(tmp_path / "bin", "python3", 'echo "pip: build failed" >&2; exit 1')
    r = run(str(tmp_path / "out"), "build", "verify", tmp_path=tmp_path,
            PATH=os.pathsep.join([str(tmp_path / "bin"), os.environ.get("PATH", "")]))
    assert r.returncode == 1
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("build: rc 1 in ") and summary[0].endswith("pip: build failed"), summary
    assert summary[1:] == ["verify: skipped: the build failed"]


def test_a_sanitizer_step_needs_its_clean_summary(tmp_path):
    # A sanitizer that exits 0 but reports errors fails the step; its clean summary passes it.
    path = os.pathsep.join([str(tmp_path / "bin"), os.environ.get("PATH", "")])
    _fake_tool(tmp_path / "bin", "compute-sanitizer", 'echo "========= ERROR SUMMARY: 2 errors"; exit 0')
    r = run(str(tmp_path / "dirty"), "memcheck", tmp_path=tmp_path, PATH=path)
    assert r.returncode == 1
    assert (tmp_path / "dirty" / "summary.txt").read_text().startswith("memcheck: rc 1 in ")
    _fake_tool(tmp_path / "bin", "compute-sanitizer", 'echo "========= ERROR SUMMARY: 0 errors"; exit 0')
    r = run(str(tmp_path / "clean"), "memcheck", tmp_path=tmp_path, PATH=path)
    assert r.returncode == 0
    assert (tmp_path / "clean" / "summary.txt").read_text().startswith("memcheck: rc 0 in ")
