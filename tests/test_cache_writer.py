"""The cache writer (``ops.concat_and_cache_sparse_mla``'s CUDA kernel) against the reference
writer, byte for byte: on the GPU (marker ``gpu``) and, everywhere, its kernel in the CPU emulation
(tests/emulation)."""

from __future__ import annotations

import pytest
import torch

import emulation
from vllm_sparse_mla_blackwell import formats, ops, reference


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu), "emulated"])
def writer(request):
    """(device, write): the op on the GPU, or the emulated kernel on CPU tensors."""
    if request.param == "cuda":
        return "cuda", ops.concat_and_cache_sparse_mla
    if emulation.unavailable():
        pytest.skip(emulation.unavailable())
    return "cpu", request.getfixturevalue("emulator").concat_and_cache


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def cache_row(kv_cache_dtype: str, head_size: int) -> tuple[int, torch.dtype]:
    """(elements per cache row, element dtype) of a cache tensor in ``kv_cache_dtype``."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(kv_cache_dtype, torch.uint8)
    return formats.kv_row_bytes(kv_cache_dtype, head_size) // dtype.itemsize, dtype


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16", "fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("rope", [True, False])
def test_cache_writer_matches_reference_bytes(writer, kv_cache_dtype, rope):
    device, write = writer
    torch.manual_seed(3)
    T, D = 37, 576 if rope else 512
    kv_c = torch.randn(T, 512, device=device, dtype=torch.bfloat16) * 3
    k_pe = torch.randn(T, 64, device=device, dtype=torch.bfloat16) if rope else None
    slots = torch.randperm(64, device=device)[:T]
    slots[::5] = -1
    width, dtype = cache_row(kv_cache_dtype, D)
    k_scale = torch.tensor([0.37], device=device) if kv_cache_dtype == "fp8_e4m3" else None
    got = torch.zeros(4, 16, width, device=device, dtype=dtype)
    want = got.clone()
    write(kv_c, k_pe, got, slots, kv_cache_dtype, k_scale)
    reference.write_kv_cache_reference(kv_c, k_pe, want, slots, kv_cache_dtype, k_scale)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16", "fp8_e4m3", "fp8_ds_mla"])
def test_cache_writer_non_finite_values_as_vllm_writes_them(writer, kv_cache_dtype):
    """NaN and infinities in kv_c, as vLLM's writers store them (csrc/cache_kernels.cu: the tile's
    amax by ``fmaxf``, which skips NaN, then ``__nv_cvt_float_to_fp8`` saturating to finite):
    fp8_ds_mla keeps a NaN's tile scale finite and stores the NaN as 0x7f, an infinity makes its
    tile's scale infinite, itself 0x7f and the tile's finite values +-0; fp8_e4m3 saturates an
    infinity to +-448; 16-bit caches keep both. The reference writer must agree byte for byte."""
    device, write = writer
    torch.manual_seed(11)
    kv_c = torch.randn(2, 512, dtype=torch.bfloat16) * 3
    kv_c[0, 5], kv_c[0, 130], kv_c[0, 300] = float("nan"), float("inf"), -float("inf")  # tiles 0, 1, 2
    # A signalling NaN beside tile 3's largest value, which the max must not lose (a host's fmaxf
    # returns NaN for it: the emulation's must not).
    kv_c.view(torch.int16)[0, 384] = 0x7F81
    kv_c[0, 385] = 20.0
    kv_c = kv_c.to(device)
    k_pe = torch.randn(2, 64, device=device, dtype=torch.bfloat16)
    width, dtype = cache_row(kv_cache_dtype, 576)
    got = torch.zeros(1, 16, width, device=device, dtype=dtype)
    want = got.clone()
    slots = torch.tensor([3, 9], device=device)
    write(kv_c, k_pe, got, slots, kv_cache_dtype, None)
    reference.write_kv_cache_reference(kv_c, k_pe, want, slots, kv_cache_dtype, None)
    synchronize(device)
    row = got[0, 3].cpu()
    if kv_cache_dtype in ("bfloat16", "float16"):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert row[5].isnan() and row[130] == float("inf") and row[300] == -float("inf") and row[384].isnan()
        return
    assert torch.equal(got, want)
    if kv_cache_dtype == "fp8_e4m3":
        assert (int(row[5]), int(row[130]), int(row[300]), int(row[384])) == (0x7F, 0x7E, 0xFE, 0x7F)
        return
    scales = row[512:528].view(torch.float32)
    for tile, nan_at in ((0, 5), (3, 384)):  # the scale of the tile's finite values; NaN is 0x7f
        finite_amax = kv_c[0, 128 * tile : 128 * (tile + 1)].float().abs().nan_to_num(nan=0.0).amax().cpu()
        # A tensor divisor: IEEE division, as the kernels do (a Python scalar becomes a reciprocal).
        torch.testing.assert_close(scales[tile], finite_amax / torch.tensor(448.0), rtol=0, atol=0)
        assert int(row[nan_at]) == 0x7F
    assert scales[1] == float("inf") and scales[2] == float("inf")
    assert int(row[130]) == 0x7F and int(row[300]) == 0x7F
    for tile, bad in ((1, 130), (2, 300)):
        rest = torch.cat([row[128 * tile : bad], row[bad + 1 : 128 * (tile + 1)]])
        assert set(rest.tolist()) <= {0x00, 0x80}  # x / inf = +-0
    # Tile 3's other values and all of the second token decode to their values.
    rows = reference.dequantize_kv_cache(got, "fp8_ds_mla", 576).cpu()
    full = torch.cat([kv_c, k_pe], -1).float().cpu()
    torch.testing.assert_close(rows[3, 385:], full[0, 385:], rtol=0.07, atol=0.07)
    torch.testing.assert_close(rows[9], full[1], rtol=0.07, atol=0.07)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16", "fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("num_tokens", [0, 3])
def test_cache_writer_without_a_valid_slot_writes_nothing(writer, kv_cache_dtype, num_tokens):
    """No token to write (none, or every slot -1 or past the cache): the cache stays as it was,
    in the kernel and in the reference writer (which the CPU op runs)."""
    device, write = writer
    dtype = cache_row(kv_cache_dtype, 576)[1]
    row_bytes = formats.kv_row_bytes(kv_cache_dtype, 576)
    cache = torch.full((2, 16, row_bytes), 0x3C, device=device, dtype=torch.uint8).view(dtype)
    before = cache.clone()
    kv_c = torch.randn(num_tokens, 512, device=device, dtype=torch.bfloat16)
    k_pe = torch.randn(num_tokens, 64, device=device, dtype=torch.bfloat16)
    slots = torch.tensor([-1, 32, 2**40][:num_tokens], device=device, dtype=torch.int64)
    write(kv_c, k_pe, cache, slots, kv_cache_dtype, None)
    reference.write_kv_cache_reference(kv_c, k_pe, before, slots, kv_cache_dtype, None)
    synchronize(device)
    assert torch.equal(cache.view(torch.uint8), torch.full_like(cache.view(torch.uint8), 0x3C))
    assert torch.equal(before.view(torch.uint8), cache.view(torch.uint8))


def test_cache_writer_never_writes_outside_the_cache(writer):
    """Slots >= num_rows (and -1) are skipped: a guard region after the cache stays intact."""
    device, write = writer
    storage = torch.full((3 * 16, 576), 7.0, device=device, dtype=torch.bfloat16)
    cache = storage[:32].view(2, 16, 576)  # rows 32.. are the guard region
    slots = torch.tensor([0, 32, 40, -1, 2**40], device=device)
    write(torch.ones(5, 512, device=device, dtype=torch.bfloat16), torch.ones(5, 64, device=device, dtype=torch.bfloat16),
          cache, slots, "auto")
    synchronize(device)
    assert (storage[0] == 1).all() and (storage[1:] == 7.0).all()


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16", "fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("block_size", [16, 64])
def test_cache_writer_block_outer_layout(writer, kv_cache_dtype, rope, block_size):
    """vLLM 0.33 lays GLM-5.3-Flash's cache out block-outer: each layer's ``[num_blocks,
    block_size, W]`` view has a block stride of several caches' rows. The writer must address
    (block, offset) through that stride, skip -1 and out-of-range slots, and leave the other
    caches' rows of each block untouched."""
    device, write = writer
    torch.manual_seed(5)
    num_blocks, T, D = 6, 70, 576 if rope else 512
    width, dtype = cache_row(kv_cache_dtype, D)
    # Three caches share each block; the layer under test owns the middle one.
    row_bytes = formats.kv_row_bytes(kv_cache_dtype, D)
    storage = torch.full((num_blocks, 3 * block_size, row_bytes), 0x55, device=device, dtype=torch.uint8).view(dtype)
    got = storage[:, block_size : 2 * block_size]
    assert got.stride(0) == 3 * block_size * width
    want_storage = storage.clone()
    want = want_storage[:, block_size : 2 * block_size]
    kv_c = torch.randn(T, 512, device=device, dtype=torch.bfloat16) * 3
    k_pe = torch.randn(T, 64, device=device, dtype=torch.bfloat16) if rope else None
    slots = torch.randperm(num_blocks * block_size, device=device)[:T]
    slots[::7] = -1
    slots[3::11] = num_blocks * block_size + torch.arange(len(slots[3::11]), device=device) * 5
    k_scale = torch.tensor([0.37], device=device) if kv_cache_dtype == "fp8_e4m3" else None
    write(kv_c, k_pe, got, slots, kv_cache_dtype, k_scale)
    reference.write_kv_cache_reference(kv_c, k_pe, want, slots, kv_cache_dtype, k_scale)
    synchronize(device)
    written = (slots >= 0) & (slots < num_blocks * block_size)
    assert 40 < int(written.sum()) < T
    assert torch.equal(storage.view(torch.uint8), want_storage.view(torch.uint8))
    # The written rows are the tokens', read back through the flat slot -> (block, offset) map.
    rows = reference.dequantize_kv_cache(got, kv_cache_dtype, D, k_scale)
    full = kv_c.float() if k_pe is None else torch.cat([kv_c, k_pe], -1).float()
    s = slots[written]
    torch.testing.assert_close(rows[s], full[written], rtol=0.07, atol=0.07)
