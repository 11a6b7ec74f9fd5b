"""tools/ab_device.sh: the arguments it refuses before building anything (CPU only)."""

import pathlib
import subprocess

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "ab_device.sh"


def run(*args, tmp_path, **env):
    return subprocess.run(["bash", str(TOOL), str(tmp_path / "out"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "AB_WORK": str(tmp_path / "work"), **env})


def test_without_builds_prints_its_usage(tmp_path):
    r = run(tmp_path=tmp_path)
    assert r.returncode == 2
    assert "NAME=SOURCE" in r.stderr


def test_a_build_must_be_named(tmp_path):
    r = run("bench/a.diff", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "is not NAME=SOURCE" in r.stderr


def test_a_missing_source_is_refused(tmp_path):
    r = run(f"A={tmp_path / 'nowhere.diff'}", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "no such folder or diff" in r.stderr
    assert not (tmp_path / "work" / "lib_A").exists()


def test_an_unknown_q_dtype_is_refused_before_any_build(tmp_path):
    r = run("A=.", "B=.", tmp_path=tmp_path, AB_Q="fp32")
    assert r.returncode == 2
    assert "AB_Q 'fp32' is not bf16 or fp16" in r.stderr
    assert not (tmp_path / "work").exists()
