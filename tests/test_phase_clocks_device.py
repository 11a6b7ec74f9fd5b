"""tools/phase_clocks_device.sh: the arguments it refuses before building anything, and what each
build is made of and passed (a stand-in python3; CPU only)."""

import pathlib
import subprocess

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "phase_clocks_device.sh"


def run(*args, tmp_path, **env):
    return subprocess.run(["bash", str(TOOL), str(tmp_path / "out"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PC_WORK": str(tmp_path / "work"), **env})


def refused(r, message, tmp_path):
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_without_builds_prints_its_usage(tmp_path):
    refused(run(tmp_path=tmp_path), "NAME=FLAGS", tmp_path)


def test_a_build_must_be_named(tmp_path):
    refused(run("-DPC_SCORES_TWICE", tmp_path=tmp_path), "'-DPC_SCORES_TWICE' is not NAME=FLAGS", tmp_path)


def test_flags_with_a_single_quote_are_refused(tmp_path):
    refused(run("a=-DX='1'", tmp_path=tmp_path), "a: FLAGS may not hold a single quote", tmp_path)


def test_a_missing_measuring_diff_is_refused(tmp_path):
    refused(run("plain=", tmp_path=tmp_path, PC_DIFF=str(tmp_path / "nowhere.diff")), "PC_DIFF: no such diff", tmp_path)


def test_a_missing_base_diff_is_refused(tmp_path):
    refused(run("plain=", tmp_path=tmp_path, PC_BASE=str(tmp_path / "nowhere.diff")), "PC_BASE: no such diff", tmp_path)


def test_a_shape_must_be_model_and_heads(tmp_path):
    refused(run("plain=", tmp_path=tmp_path, PC_SHAPES="DeepSeek-V3.2:128,GLM-5.3-Flash"),
            "PC_SHAPES: 'GLM-5.3-Flash' is not MODEL:HEADS", tmp_path)


def test_each_build_patches_a_copy_and_passes_its_flags(tmp_path):
    # python3 stands in for pip, profile_shape.py and phase_clocks.py: it logs its arguments and
    # CMAKE_ARGS, and checks that the copy it builds carries the measuring diff.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("""#!/bin/bash
echo "$PWD | $* | ${CMAKE_ARGS:-}" >> "$LOG"
case "$*" in
  "-m pip install"*) grep -q clock64 csrc/sparse_mla/sparse_mla_fwd_pingpong.cuh || exit 3 ;;
  "tools/phase_clocks.py --pingpong") echo "│     all │ 1997 │" ;;
esac
""")
    fake.chmod(0o755)
    log = tmp_path / "log"
    r = run("plain=", "twice=-DPC_SCORES_TWICE -DPC_S_DELAY=300", tmp_path=tmp_path, LOG=str(log),
            PATH=f"{fake.parent}:/usr/bin:/bin", PC_SHAPES="DeepSeek-V3.2:128", PC_KV="fp8_e4m3")
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    builds = [c for c in calls if "pip install" in c]
    assert [b.split(" | ")[0] for b in builds] == [str(tmp_path / "work" / "src_plain"), str(tmp_path / "work" / "src_twice")]
    assert builds[0].endswith("-DSPARSE_MLA_CHECK_RESOURCES=OFF '-DCMAKE_CUDA_FLAGS='")
    assert builds[1].endswith("'-DCMAKE_CUDA_FLAGS=-DPC_SCORES_TWICE -DPC_S_DELAY=300'")
    assert sum("bench/profile_shape.py --model DeepSeek-V3.2 --heads 128 --tokens 1024 --kv fp8_e4m3" in c
               for c in calls) == 2
    assert (tmp_path / "out" / "twice_DeepSeek-V3.2_128_fp8_e4m3.txt").read_text().startswith("│     all │ 1997")
    assert "== twice DeepSeek-V3.2 H128 fp8_e4m3" in r.stdout
    # The repository itself is left as it was.
    assert "clock64" not in (TOOL.parent.parent / "csrc" / "sparse_mla" / "sparse_mla_fwd_pingpong.cuh").read_text()
