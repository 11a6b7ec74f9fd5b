"""The end-to-end check on a GPU with vLLM installed (marker ``gpu``): a small form of
``python -m vllm_sparse_mla_blackwell e2e``, GLM-5.3-Flash (NoPE, 64 heads, block-outer cache)
with a bf16 cache, eager, against the exact reference and, where the GPU has one, vLLM's own
sparse-MLA kernel."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(900)
def test_e2e_quick_glm_bf16_eager(tmp_path, same_package_env):
    pytest.importorskip("vllm")
    report_path = tmp_path / "e2e.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_sparse_mla_blackwell", "e2e", "--quick", "--models", "glm-5.3-flash",
         "--kv", "bfloat16", "--modes", "eager", "--json", str(report_path), "--work-dir", str(tmp_path / "work")],
        env=same_package_env(), capture_output=True, text=True, timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    report = json.loads(report_path.read_text())
    rows = report["models"]["glm-5.3-flash"]["rows"]
    assert len(rows) == 1 and rows[0]["passed"] and rows[0]["selected_ours"]
    assert rows[0]["vs_exact"]["min_step_cos"] > 0.99
