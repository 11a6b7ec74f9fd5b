"""GPU tests of bench's mma.sync ceilings (marker ``gpu``; skipped without CUDA): the bf16 and fp16
peaks everywhere, the e4m3 one from compute capability 8.9, refused below it."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_sparse_mla_blackwell import bench, ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ops.extension_available(), reason="op library not built")]


@pytest.fixture
def device():
    return torch.device("cuda", torch.cuda.current_device())


def test_e4m3_peak_is_measured_from_compute_capability_8_9(device):
    bf16 = bench.measure_mma_peak(device)
    e4m3 = bench.measure_mma_peak(device, "e4m3")
    assert 0 < bf16 < math.inf
    if torch.cuda.get_device_capability(device) < (8, 9):
        assert e4m3 is None
        return
    # Native e4m3 MMAs (sm_89, sm_120) run at about twice the bf16 FLOP/s; 4x would mean the
    # compiler hoisted MMAs out of the loop (sm_90 emulates e4m3 with f16 MMAs, which it can move;
    # measured 0.26x there). Below an eighth, the loop is broken.
    assert e4m3 is not None and bf16 / 8 < e4m3 < 4 * bf16, (e4m3, bf16)


def test_fp16_peak_is_measured_beside_bf16(device):
    # The same m16n8k16 shape at the same rate (H200: 643.8 against 648.8 TFLOP/s): off by a
    # quarter means a broken loop (hoisted MMAs would read above it, a wrong type or count below).
    bf16 = bench.measure_mma_peak(device)
    fp16 = bench.measure_mma_peak(device, "fp16")
    assert fp16 is not None and 0.8 * bf16 < fp16 < 1.25 * bf16, (fp16, bf16)


def test_e4m3_op_counts_its_flops_or_names_the_missing_mma(device):
    op = torch.ops.sparse_mla_bw.bench_mma_sync_peak
    sink = torch.zeros(2 * 8, device=device)
    assert op(sink, 2, 3) == op(sink, 2, 3, "fp16") == 2 * 8 * 3 * 8 * (2 * 16 * 8 * 16)
    if torch.cuda.get_device_capability(device) < (8, 9):
        with pytest.raises(NotImplementedError, match="dtype e4m3 needs a GPU of compute capability 8.9"):
            op(sink, 2, 3, "e4m3")
    else:
        assert op(sink, 2, 3, "e4m3") == 2 * 8 * 3 * 8 * (2 * 16 * 8 * 32)
    torch.cuda.synchronize(device)  # the launches (or the refusal) left no error behind
    with pytest.raises(ValueError, match="dtype must be bf16, fp16 or e4m3, got 'e5m2'"):
        op(sink, 2, 3, "e5m2")
