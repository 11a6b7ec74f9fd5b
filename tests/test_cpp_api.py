"""Builds and runs the GoogleTest suite of the C++ host API (tests/cpp/test_api.cpp) with CMake,
without the kernels or torch: argument checks and split planning are plain C++."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="the CUDA toolkit (nvcc, headers) is needed to configure the project")
def test_googletest_host_api(tmp_path):
    build = tmp_path / "build"
    env = dict(os.environ)
    env.setdefault("CUDACXX", shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    configure = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DSPARSE_MLA_BUILD_TESTS=ON",
                                "-DSPARSE_MLA_BUILD_TORCH=OFF", "-DGLM53_ARCHS=80", "-DCMAKE_BUILD_TYPE=Release"],
                               env=env, capture_output=True, text=True)
    if configure.returncode != 0 and "GTest" in configure.stderr + configure.stdout:
        pytest.skip("GoogleTest is not installed (Debian/Ubuntu: libgtest-dev)")
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    subprocess.run(["cmake", "--build", str(build), "--target", "sparse_mla_api_test", "-j", "2"],
                   check=True, env=env, capture_output=True)
    result = subprocess.run([str(build / "sparse_mla_api_test")], capture_output=True, text=True)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "[  PASSED  ]" in result.stdout
