"""GPU tests of the sparse-MLA kernel (marker ``gpu``; skipped without CUDA). The same case
builder as ``verify``: fresh random inputs, NaN in unreferenced cache rows, NaN-poisoned outputs,
fp32 reference, verify's bars."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from vllm_sparse_mla_blackwell import _testing, cases, envs, ops, verify
from vllm_sparse_mla_blackwell.cases import Case

pytestmark = pytest.mark.gpu

QUICK = [c for cs in verify.case_groups(quick=True, kv_dtypes=verify.KV_16BIT + verify.KV_FP8).values() for c in cs]


def _check(result):
    assert result.all_written, "output not fully written (NaN left)"
    assert result.masked_exact, "rows with no valid slot must be exactly out=0, lse=-inf"
    assert result.max_rel_err <= cases.max_rel_err(result.case), result
    assert result.min_cosine >= cases.MIN_COSINE, result
    assert result.max_lse_err <= cases.MAX_LSE_ERR, result
    assert result.passed, result  # every bar of cases.compare


@pytest.mark.parametrize("case", QUICK, ids=[c.label() for c in QUICK])
def test_matrix_subset(case):
    _check(verify.run_case(case, torch.device("cuda")))


# Launches of more than 16 heads run in the planned blocks and in forced 16- and 32-head ones:
# for this 16-bit cache the planner gives 16-head blocks at decode (T = 1; planner.h
# plan_head_groups), 32-head ones at T = 64.
@pytest.mark.parametrize("block_heads", [None, 16, 32])
@pytest.mark.parametrize("masking", ["random", "causal", "all_masked", "invalid", "topk_len"])
@pytest.mark.parametrize("num_tokens", [1, 64])
def test_masking_and_nan_poisoned_rows(masking, num_tokens, block_heads):
    _check(verify.run_case(Case(head_size=512, num_heads=64, topk=2176, num_tokens=num_tokens, masking=masking,
                                block_heads=block_heads), torch.device("cuda")))


@pytest.mark.parametrize("block_heads", [None, 32])
@pytest.mark.parametrize("layout", ["strided", "split_q"])
@pytest.mark.parametrize("kv", ["bf16", "fp8_ds_mla"])
def test_strided_q_and_out(layout, kv, block_heads):
    _check(verify.run_case(Case(head_size=576, num_heads=32, topk=300, num_tokens=9, layout=layout, kv_cache_dtype=kv,
                                block_heads=block_heads), torch.device("cuda")))


# q and cache dtypes of the 32-head kernel's P types: bf16 P (bf16 cache), fp16 P with the lazy
# rescale (fp16 cache, fp8_e4m3, fp8_ds_mla with bf16 q) and fp16 P without it (fp8_ds_mla with
# fp16 q: sparse_mla_fwd_wide.cuh kLazy).
P_TYPES = [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp8_e4m3"), ("fp16", "fp8_e4m3"),
           ("bf16", "fp8_ds_mla"), ("fp16", "fp8_ds_mla")]


def _check_in_wide_kernel(case: Case):
    """verify's bars, and the profiler must see the WideWarps kernel run 32-head blocks (traits'
    head groups and kWideWarps); returns the profile. fp8 caches need sm_89+ and a grid of more
    blocks than SMs for it: fewer blocks, or an older GPU, decode each tile once in the main
    kernel (planner.h decoded_fp8_plan), which has no lazy rescale."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _check(verify.run_case(case, torch.device("cuda")))
    if case.kv_cache_dtype in verify.KV_16BIT or torch.cuda.get_device_capability() >= (8, 9):
        assert {(a[3], a[8]) for a in _fwd_kernel_traits(prof)} == {("2", "true")}, case.label()
    return prof


@pytest.mark.parametrize("num_tokens, block_heads", [(1, None), (1, 16), (1, 32), (64, None), (64, 16), (64, 32),
                                                     (256, 32)])
@pytest.mark.parametrize("q_dtype, kv", P_TYPES)
@pytest.mark.parametrize("head_size", [512, 576])
def test_tiles_of_different_magnitudes(q_dtype, kv, num_tokens, head_size, block_heads):
    """Most cache rows 2^-12 smaller than the rest, so consecutive KV tiles differ by up to 12
    octaves: fp8_ds_mla's power-of-two P norm changes from tile to tile (the accumulator is
    rescaled by norm_prev / norm; the lazy kernels keep it while the tile's largest scale is
    within 2^3), and small fp8_e4m3 values become subnormal or zero. 256 tokens: a grid of more
    32-head blocks than SMs on every target GPU, where fp8 caches too run the WideWarps kernel."""
    case = Case(head_size=head_size, num_heads=32, topk=2048, num_tokens=num_tokens, q_dtype=q_dtype,
                kv_cache_dtype=kv, row_spread=12, block_heads=block_heads)
    if num_tokens == 256:
        _check_in_wide_kernel(case)
    else:
        _check(verify.run_case(case, torch.device("cuda")))


@pytest.mark.parametrize("row_ramp", [1.0, 3.0])
@pytest.mark.parametrize("q_dtype, kv", P_TYPES)
@pytest.mark.parametrize("head_size", [512, 576])
def test_running_maximum_that_rises_tile_by_tile(q_dtype, kv, head_size, row_ramp):
    """Scores that grow along each token's KV tiles (Case.row_ramp) in the WideWarps kernel's
    32-head blocks (256 tokens: more blocks than SMs), the lazy rescale's paths with O already
    large. Each row's maximum moves 1.3-1.5 (ramp 1) or 3.3-3.5 (ramp 3) times after its first
    tile, against 0.2-0.3 on plain inputs, at tiles that differ between the block's heads in half
    (ramp 1) or 80 % (ramp 3) of them (the warp vote that skips O's rescale must not skip a head
    whose maximum moved), and about half (ramp 1) or 60 % (ramp 3) of the rows see P past 2^7 of
    its 2^8 bound (float64 scores of these inputs, one chain of tiles per row; test_ops_cpu.py
    checks the figures on the bf16 ones)."""
    _check_in_wide_kernel(Case(head_size=head_size, num_heads=32, topk=2048, num_tokens=256, q_dtype=q_dtype,
                               kv_cache_dtype=kv, row_ramp=row_ramp, block_heads=32))


@pytest.mark.parametrize("q_dtype, kv", [("fp16", "bf16"), ("bf16", "fp16")])
@pytest.mark.parametrize("num_heads", [32, 64])
@pytest.mark.parametrize("head_size", [512, 576])
def test_mixed_16_bit_q_and_cache_in_32_head_blocks(q_dtype, kv, num_heads, head_size):
    """q and cache of different 16-bit dtypes in 32-head blocks. fp16 q with a bf16 cache enters
    the MMAs as bf16 hi + lo (two Q parts: the kernel's most registers, 238 on sm_90 at D = 576);
    verify's matrix mixes the dtypes at 16 heads only."""
    _check(verify.run_case(Case(head_size=head_size, num_heads=num_heads, topk=2048, num_tokens=64,
                                q_dtype=q_dtype, kv_cache_dtype=kv, block_heads=32), torch.device("cuda")))


@pytest.mark.parametrize("value_scale_log2", [17, -14])
@pytest.mark.parametrize("num_heads, num_tokens, block_heads", [(16, 1, None), (16, 64, None), (64, 64, 32)])
@pytest.mark.parametrize("head_size", [512, 576])
def test_bf16_cache_values_outside_fp16_range(value_scale_log2, num_heads, num_tokens, block_heads, head_size):
    """bf16 cache values beyond fp16's range (2^17: ~60 % of them past 65,520, up to ~2^19) and
    in its subnormals (2^-14: ~10 % of them below 2^-17) meet the bars: the bf16 cache's MMAs
    take V as stored (P V in fp16 with V converted, and a bf16 fallback pass, ran 0.95-1.00x in
    v17: bench/HISTORY.md). q is scaled by the inverse, so the scores are the usual ones. 64 heads
    run the 32-head kernel (two S chains: kernel_traits.h kSTwoChains)."""
    _check(verify.run_case(Case(head_size=head_size, num_heads=num_heads, topk=2048, num_tokens=num_tokens,
                                value_scale_log2=value_scale_log2, block_heads=block_heads), torch.device("cuda")))


@pytest.mark.parametrize("block_heads", [None, 32])
@pytest.mark.parametrize("topk, masking", [(96, "topk_len"), (128, "none")])
def test_fp8_ds_mla_accuracy_at_small_topk(topk, masking, block_heads):
    """fp8_ds_mla's P carries the key scales, so its fp16 rounding touches even a row's dominant
    terms; rows where a few keys dominate are where that shows most (bench/HISTORY.md v14). 32
    heads at D = 576, 272 tokens: v14's inputs (the case seed hashes the shape), a grid of more
    blocks than SMs on the H200 (raw tiles there)."""
    _check(verify.run_case(Case(head_size=576, num_heads=32, topk=topk, num_tokens=272,
                                kv_cache_dtype="fp8_ds_mla", masking=masking, block_heads=block_heads),
                           torch.device("cuda")))


def _combine_kernel_configs(prof) -> set[tuple[int, int]]:
    """(split groups, loads per thread) of every combine kernel a profile saw, from the names of
    its template arguments (combine_kernel.cuh sparse_mla_combine_kernel<Element, G, loads>)."""
    names = [e.name for e in prof.events() if "sparse_mla_combine_kernel" in e.name]
    found = [re.search(r"sparse_mla_combine_kernel<[^,]+, (\d+), (\d+)>", n) for n in names]
    assert names and all(found), names
    return {(int(m[1]), int(m[2])) for m in found}


@pytest.mark.parametrize("topk", [2176, 4416])
@pytest.mark.parametrize("num_heads", [8, 16])
def test_decode_combine_of_more_than_64_splits(num_heads, topk):
    """T = 1 with more splits than the decode combine's 64 a round (four thread groups of 16 loads,
    combine_kernel.cuh): on a GPU of 69 SMs or more (the H200: 132) topk 2176 makes 68 one-tile
    splits, which the 17-load variant takes in one round (params.h combine_decode_loads), and
    topk 4416 (138 tiles) 69 splits of two tiles, which take two rounds of the 16-load kernel; the
    profiler must see that variant (fewer SMs plan fewer splits: values only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _check(verify.run_case(Case(head_size=576, num_heads=num_heads, topk=topk, num_tokens=1), torch.device("cuda")))
    if torch.cuda.get_device_properties(0).multi_processor_count >= 69:
        assert _combine_kernel_configs(prof) == {(4, 17 if topk == 2176 else 16)}


@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("num_tokens", [9, 12])
def test_combine_of_more_splits_than_one_round_one_block_per_row(num_tokens, kv_cache_dtype):
    """16 heads, topk 2048, 9 or 12 tokens: 144 or 192 (token, head) rows, more than the H200's
    132 SMs, so the combine runs one block per row (eight loads per thread a round), and the
    planner splits the top-k into 13 or 11 blocks (GoogleTest pins both plans at 132 SMs): the
    rounds after the first read their lse values again (combine_kernel.cuh). The profiler must see
    that combine variant wherever the rows outnumber the SMs; values on every GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _check(verify.run_case(Case(head_size=576, num_heads=16, topk=2048, num_tokens=num_tokens,
                                    kv_cache_dtype=kv_cache_dtype), torch.device("cuda")))
    if 16 * num_tokens > torch.cuda.get_device_properties(0).multi_processor_count:
        assert _combine_kernel_configs(prof) == {(1, 16)}


def _traits_args(name: str) -> list[str]:
    """The template arguments of a forward kernel's traits, from its name (kernel_traits.h
    SparseMlaFwdTraits): q type, cache format, D, head groups, copy stages, kFp8RawTiles,
    kPairedScores, kE4m3Pv, kWideWarps; [] for another name."""
    m = re.search(r"SparseMlaFwdTraits<(.*?)>, \d+>", name)
    return m[1].split(", ") if m else []


def _fwd_kernel_traits(prof) -> list[list[str]]:
    """The traits arguments (_traits_args) of every forward kernel a profile saw; at least one."""
    names = [e.name for e in prof.events() if "sparse_mla_fwd_kernel" in e.name]
    args = [_traits_args(n) for n in names]
    assert names and all(len(a) == 9 for a in args), names
    return args


def _fwd_kernel_configs(prof) -> set[tuple[int, int, str]]:
    """(head_size, head groups, kFp8RawTiles) of every forward kernel a profile saw."""
    return {(int(a[2]), int(a[3]), a[5]) for a in _fwd_kernel_traits(prof)}


def _planned_block_heads(kv_cache_dtype: str, head_size: int, num_heads: int, num_tokens: int,
                         split_short: bool) -> int:
    """The heads per block planner.h plan_head_groups gives: 16 up to 16 heads, for fp8 caches where
    an SM holds two 16-head blocks (the fwd_blocks_per_sm op) but on sm_89+ where the unsplit
    32-head grid has more blocks than SMs, or where the 32-head plan splits into blocks of fewer
    than 8 tiles (`split_short`, from the caller's shape); else 32."""
    if num_heads <= 16 or split_short:
        return 16
    if kv_cache_dtype in verify.KV_16BIT:
        return 32
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor) >= (8, 9) and num_tokens * -(-num_heads // 32) > props.multi_processor_count:
        return 32
    return 16 if _testing.fwd_blocks_per_sm(torch.bfloat16, kv_cache_dtype, head_size, 16) >= 2 else 32


@pytest.mark.parametrize("block_heads", [None, 16, 32])
@pytest.mark.parametrize("num_tokens", [1, 256])
@pytest.mark.parametrize("kv_cache_dtype", verify.KV_16BIT + verify.KV_FP8)
@pytest.mark.parametrize("head_size", [512, 576])
def test_head_blocks_as_planned_or_forced(head_size, kv_cache_dtype, num_tokens, block_heads):
    """64 heads run the block size plan_head_groups picks (planner.h; 16-head blocks for fp8 caches
    on a GPU that holds two of them per SM, as the H200 does, but at T = 256, whose 32-head grid
    is more than one wave, and for T = 1, whose 32-head plan splits topk 2048 into
    blocks of two tiles), or the one block_heads forces; the profiler must see it, with right
    values."""
    from torch.profiler import ProfilerActivity, profile

    case = Case(head_size=head_size, num_heads=64, topk=2048, num_tokens=num_tokens, kv_cache_dtype=kv_cache_dtype,
                block_heads=block_heads)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = verify.run_case(case, torch.device("cuda"))
    _check(result)
    want = block_heads or _planned_block_heads(kv_cache_dtype, head_size, 64, num_tokens, split_short=num_tokens == 1)
    assert {g for _, g, _ in _fwd_kernel_configs(prof)} == {want // 16}, (case.label(), _fwd_kernel_configs(prof))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("num_heads, block_heads", [(16, None), (64, None), (64, 32)])
@pytest.mark.parametrize("head_size", [512, 576])
def test_fp8_raw_and_decoded_tile_kernels(head_size, num_heads, block_heads, kv_cache_dtype):
    """An fp8 cache runs its kernel of raw tiles (decoded per MMA fragment) where the grid has
    more blocks than SMs, and the DecodedFp8 variant (each tile decoded once) in grids of one wave
    (planner.h decoded_fp8_plan), on GPUs before sm_89, and for 16-head fp8_ds_mla at D = 576 where
    an SM holds two decode-once blocks but one of raw tiles and fewer than two of the paired-scores
    variant of raw tiles, which runs before it (plan_fwd_splits): the profiler must see each where
    it is planned, both with right values under random masks and topk_len, q strided or split;
    the 32-head kernel of raw tiles is the WideWarps one (kernel_traits.h). The one-wave
    launches have two tiles (topk 64: unsplit, T x head blocks <= 28 blocks), the others 2 x SMs
    tokens of 16 tiles; all unsplit, so 64 heads run 32-head blocks where forced, where an SM holds
    one 16-head block, or on sm_89+ where they are more than one wave (planner.h
    plan_head_groups), else 16-head ones."""
    from torch.profiler import ProfilerActivity, profile

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    layout = "split_q" if head_size == 576 else "strided"
    for num_tokens, topk, one_wave in ((1, 64, True), (7, 64, True), (2 * sms, 512, False)):
        bh = block_heads or _planned_block_heads(kv_cache_dtype, head_size, num_heads, num_tokens, split_short=False)
        occupancy = [_testing.fwd_blocks_per_sm(torch.bfloat16, kv_cache_dtype, head_size, bh, variant=v)
                     for v in ("main", "decoded_fp8")]
        paired = _testing.fwd_blocks_per_sm(torch.bfloat16, kv_cache_dtype, head_size, bh, variant="paired_scores")
        # planner.h variant_raises_occupancy: the paired-scores variant first, then the decode-once one.
        raw = (not one_wave and (props.major, props.minor) >= (8, 9)
               and not (occupancy[0] < 2 <= occupancy[1] and paired < 2))
        wide = "true" if raw and bh == 32 else "false"
        for masking in ("random", "topk_len"):
            case = Case(head_size=head_size, num_heads=num_heads, topk=topk, num_tokens=num_tokens,
                        kv_cache_dtype=kv_cache_dtype, masking=masking, layout=layout, block_heads=block_heads)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                result = verify.run_case(case, torch.device("cuda"))
            _check(result)
            configs = _fwd_kernel_configs(prof)
            assert configs == {(head_size, bh // 16, "true" if raw else "false")}, (case.label(), configs)
            assert {a[8] for a in _fwd_kernel_traits(prof)} == {wide}, case.label()


def test_fwd_blocks_per_sm():
    """The occupancies the split planner plans with, through its op: every head count of one
    block size gets its block's count, a 16-head block (128 threads, <= 87 KB) at least as many
    as a 32-head one (256 threads, <= 99 KB), the 16-head fp8_e4m3 D512 block (44 KB) two, as on
    every target; the one-stage variant (16-head 16-bit caches only, <= 50 KB) at least two and
    at least the two-stage kernel's count, the decode-once fp8 variant two at 16 heads (<= 49 KB)
    and one at 32,
    the paired-scores variant (16-head fp8_ds_mla at D = 576 only, 47,488 bytes) at least two and
    at least the main kernel's count, 0 elsewhere (bad arguments: test_ops_cpu)."""
    for dtype in (torch.bfloat16, torch.float16):
        for kv in ("bfloat16", "float16", "fp8_e4m3", "fp8_ds_mla"):
            for head_size in (512, 576):
                sixteen, thirty_two = (_testing.fwd_blocks_per_sm(dtype, kv, head_size, h) for h in (16, 128))
                assert _testing.fwd_blocks_per_sm(dtype, kv, head_size, 1) == sixteen
                assert _testing.fwd_blocks_per_sm(dtype, kv, head_size, 17) == thirty_two
                assert sixteen >= thirty_two >= 1, (dtype, kv, head_size)
                one_stage = _testing.fwd_blocks_per_sm(dtype, kv, head_size, 16, variant="one_stage")
                if kv in ("bfloat16", "float16"):
                    assert one_stage >= max(2, sixteen), (dtype, kv, head_size)
                else:
                    assert one_stage == 0, (dtype, kv, head_size)
                assert _testing.fwd_blocks_per_sm(dtype, kv, head_size, 17, variant="one_stage") == 0
                decoded = [_testing.fwd_blocks_per_sm(dtype, kv, head_size, h, variant="decoded_fp8") for h in (16, 32)]
                if kv.startswith("fp8"):
                    assert decoded == [2, 1], (dtype, kv, head_size, decoded)
                else:
                    assert decoded == [0, 0], (dtype, kv, head_size, decoded)
                paired = [_testing.fwd_blocks_per_sm(dtype, kv, head_size, h, variant="paired_scores") for h in (16, 32)]
                if (kv, head_size) == ("fp8_ds_mla", 576):
                    assert paired[0] >= max(2, sixteen) and paired[1] == 0, (dtype, kv, head_size, paired)
                else:
                    assert paired == [0, 0], (dtype, kv, head_size, paired)
    assert _testing.fwd_blocks_per_sm(torch.float16, "fp8_e4m3", 512, 16) >= 2


def test_sm120_occupancy_emulation(same_package_env):
    """SPARSE_MLA_SM120_OCCUPANCY=1 (launch_template.cuh): the planner's occupancies become an
    sm_120 SM's (16-head kernels: fp8_ds_mla at D = 576 of raw tiles, 52,608 bytes, one block, its
    paired-scores variant, 47,488 bytes, two, and its decode-once variant, 48,384 bytes, two;
    fp8_e4m3 at D = 512, 44,672 bytes, two, and its decode-once variant two; bf16 at D = 576 and
    fp16 at D = 512 with two stages, 85,632 and 77,440 bytes, one; their one-stage variants, 48,128
    and 45,312 bytes, two), and every kernel class
    still launches, asking for about 2.3x its shared memory on an sm_90 (at most 221 KB), and gives
    right values: bf16, fp16 and both fp8 caches, 16 and 32 heads, D 512 and 576, unsplit (topk 32),
    split into blocks of one or two tiles (T 1, topk 300: 16 heads one, 32 heads two, planner.h
    kMinTilesPerSplit), blocks of many (T 64, topk 2048, where the stages are reused; 16-bit caches
    at 16 heads plan four splits of 16 tiles for the one-stage kernel, planner.h plan_fwd_splits), and
    16-head grids of two blocks per SM with random topk_len and both q dtypes (one-stage too). The
    profiler must see the one-stage kernel run in a split launch (T 64) and an unsplit one. A fresh
    process, since the setting is read once. And the 16-head fp8_ds_mla D576 grid of two blocks per
    SM must run the paired-scores kernel of raw tiles there (planner.h plan_fwd_splits), not the
    decode-once one (which ran there before that variant) nor the main one."""
    probes = [(torch.float16, "fp8_ds_mla", 576, 16), (torch.float16, "fp8_e4m3", 512, 16),
              (torch.bfloat16, "bfloat16", 576, 16), (torch.float16, "float16", 512, 16)]
    normal = [_testing.fwd_blocks_per_sm(*args) for args in probes]
    script = (
        "import sys, torch\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "from vllm_sparse_mla_blackwell import _testing, cases, verify\n"
        f"occupancy = [_testing.fwd_blocks_per_sm(*args) for args in {probes!r}]\n"
        f"occupancy += [_testing.fwd_blocks_per_sm(*args, variant='one_stage') for args in {probes!r}]\n"
        f"occupancy += [_testing.fwd_blocks_per_sm(*args, variant='decoded_fp8') for args in {probes!r}]\n"
        f"occupancy += [_testing.fwd_blocks_per_sm(*args, variant='paired_scores') for args in {probes!r}]\n"
        "two_per_sm = 2 * torch.cuda.get_device_properties(0).multi_processor_count + 8\n"
        "shapes = [(h, t, k, 'none', 'bf16') for h in (16, 32) for t, k in ((3, 32), (1, 300), (64, 2048))]\n"
        "shapes += [(16, two_per_sm, 64, 'topk_len', q) for q in ('bf16', 'fp16')]\n"
        "bad = [c.label() for kv in ('bf16', 'fp16', 'fp8_e4m3', 'fp8_ds_mla') for d in (512, 576)\n"
        "       for h, t, k, masking, q in shapes\n"
        "       for c in [cases.Case(head_size=d, num_heads=h, topk=k, num_tokens=t, kv_cache_dtype=kv,\n"
        "                            masking=masking, q_dtype=q)]\n"
        "       if not verify.run_case(c, torch.device('cuda')).passed]\n"
        "def kernels(num_tokens, topk, kv='bf16'):\n"
        "    with profile(activities=[ProfilerActivity.CUDA]) as prof:\n"
        "        verify.run_case(cases.Case(head_size=576, num_heads=16, topk=topk, num_tokens=num_tokens,\n"
        "                                   kv_cache_dtype=kv), torch.device('cuda'))\n"
        "    return sorted({e.name for e in prof.events() if 'sparse_mla_' in e.name})\n"
        "split, unsplit = kernels(64, 2048), kernels(two_per_sm, 64)\n"
        "one_stage = [any(', 1, 1, true, false, false, false>' in n for n in k) for k in (split, unsplit)]\n"
        "combined = any('combine' in n for n in split)\n"
        "ds_mla = kernels(two_per_sm, 64, 'fp8_ds_mla')\n"
        "paired = bool(ds_mla) and all(', 2, true, true, false, false>' in n for n in ds_mla)\n"
        "print('occupancy', occupancy, 'failed', bad, 'kernels', split, unsplit, ds_mla)\n"
        "sys.exit(0 if occupancy == [1, 2, 1, 1, 0, 0, 2, 2, 2, 2, 0, 0, 2, 0, 0, 0] and not bad\n"
        "         and one_stage == [True, True] and combined and paired else 1)\n")
    run = subprocess.run([sys.executable, "-c", script], env=same_package_env(SPARSE_MLA_SM120_OCCUPANCY="1"),
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"without the setting {normal}; " + run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.parametrize("num_heads, block_heads", [(16, None), (64, 32)])
@pytest.mark.parametrize("head_size", [512, 576])
def test_fp8_ds_mla_e4m3_pv_option(monkeypatch, head_size, num_heads, block_heads):
    """SPARSE_MLA_E4M3_PV=1 (a measuring option, docs/kernel.md): fp8_ds_mla launches planned
    with their main kernel run P V on e4m3 MMAs, P as e4m3 hi + lo (sm_90 emulates the MMAs).
    Within verify's bars on fresh NaN-poisoned inputs, and the profiler sees that variant (its
    traits' kE4m3Pv argument true): grids of more blocks than SMs (raw tiles), and v14's inputs where
    a few keys dominate each row (bench/HISTORY.md v14)."""
    from torch.profiler import ProfilerActivity, profile

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs e4m3 MMAs (compute capability 8.9+)")
    if num_heads == 16 and (_testing.fwd_blocks_per_sm(torch.bfloat16, "fp8_ds_mla", head_size, 16) < 2
                            <= _testing.fwd_blocks_per_sm(torch.bfloat16, "fp8_ds_mla", head_size, 16,
                                                          variant="paired_scores")):
        pytest.skip("planned as the paired-scores variant (SMs of 100 KB), which has no e4m3 P V form")
    monkeypatch.setenv(envs.E4M3_PV_ENV, "1")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_tokens, topk, masking in ((2 * sms, 512, "random"), (272, 128, "none"), (272, 96, "topk_len")):
        case = Case(head_size=head_size, num_heads=num_heads, topk=topk, num_tokens=num_tokens,
                    kv_cache_dtype="fp8_ds_mla", masking=masking, block_heads=block_heads)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            result = verify.run_case(case, torch.device("cuda"))
        _check(result)
        assert all(a[7:] == ["true", "false"] for a in _fwd_kernel_traits(prof)), case.label()


@pytest.mark.parametrize("q_dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("head_size", [512, 576])
def test_wide_warps_family_of_fp8_caches(head_size, kv, q_dtype):
    """fp8 caches' planned 32-head blocks of raw tiles run the WideWarps kernel on sm_89+ (the
    profiler sees the traits' kWideWarps argument), within verify's bars on fresh NaN-poisoned
    inputs: SMs + 8 tokens of 32 heads, topk 512, which the planner splits in two (the partial
    results' epilogue and the combine pass; planner.h plan_splits), 40 heads (a padded head
    block) with topk_len, and 2 x SMs tokens of 64 heads, q split."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("before sm_89 fp8 launches decode each tile once (planner.h decoded_fp8_plan)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_heads, num_tokens, topk, masking, layout in ((32, sms + 8, 512, "random", "contiguous"),
                                                         (40, 272, 128, "topk_len", "strided"),
                                                         (64, 2 * sms, 512, "none", "split_q")):
        case = Case(head_size=head_size, num_heads=num_heads, topk=topk, num_tokens=num_tokens, kv_cache_dtype=kv,
                    masking=masking, q_dtype=q_dtype, layout=layout if head_size == 576 else "strided")
        prof = _check_in_wide_kernel(case)
        if num_heads == 32:
            assert any("combine" in e.name for e in prof.events()), case.label()


@pytest.mark.parametrize("kv, q_dtype", [("bf16", "bf16"), ("fp16", "fp16"), ("fp16", "bf16"), ("bf16", "fp16")])
@pytest.mark.parametrize("head_size", [512, 576])
def test_wide_warps_family(head_size, kv, q_dtype):
    """32-head blocks of 16-bit caches run the WideWarps kernel family (sparse_mla_fwd_wide.cuh)
    where q enters the MMAs in one part, the main kernel for fp16 q with a bf16 cache (the
    profiler sees the traits' kWideWarps argument). Within verify's bars on fresh NaN-poisoned
    inputs at 32, 40 (a padded head block) and 128 heads, with masked slots; the 3- and 4-token
    launches are the ones the planner splits across blocks (the partial-result epilogue)."""
    from torch.profiler import ProfilerActivity, profile

    wide = "true" if (kv, q_dtype) != ("bf16", "fp16") else "false"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_heads, num_tokens, topk, masking in ((32, 2 * sms, 512, "random"), (40, 272, 128, "topk_len"),
                                                 (128, 4, 2048, "none"), (32, 3, 1000, "random")):
        case = Case(head_size=head_size, num_heads=num_heads, topk=topk, num_tokens=num_tokens, kv_cache_dtype=kv,
                    masking=masking, q_dtype=q_dtype, block_heads=32)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            result = verify.run_case(case, torch.device("cuda"))
        _check(result)
        assert all(a[8:] == [wide] for a in _fwd_kernel_traits(prof)), case.label()


@pytest.mark.parametrize("head_size", [512, 576])
def test_cuda_graph_replay_with_padded_rows(head_size):
    _check(verify.run_graph_case(head_size, torch.device("cuda")))


@pytest.mark.timeout(300)
def test_thousand_launches_deterministic():
    result = verify.run_stress(torch.device("cuda"), 1000, timeout_s=120)
    assert result.note == "bitwise identical", result.note
    _check(result)


def test_error_writes_nothing_on_gpu():
    q = torch.randn(2, 8, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(64, 576, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2, 8, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="indices must be int32"):
        ops.sparse_mla_fwd(q, kv, torch.zeros(2, 16, dtype=torch.int64, device="cuda"), 0.1, out=out)
    torch.cuda.synchronize()
    assert out.isnan().all()


def test_cache_writer_rejects_overlapping_blocks():
    cache = torch.zeros(64, 576, device="cuda", dtype=torch.bfloat16).as_strided((4, 16, 576), (8 * 576, 576, 1))
    with pytest.raises(ValueError, match=r"kv_cache blocks must not overlap"):
        ops.concat_and_cache_sparse_mla(torch.ones(2, 512, device="cuda", dtype=torch.bfloat16),
                                        torch.ones(2, 64, device="cuda", dtype=torch.bfloat16), cache,
                                        torch.arange(2, device="cuda"), "auto")
    torch.cuda.synchronize()
    assert (cache == 0).all()


def test_zero_tokens_is_a_no_op():
    q = torch.empty(0, 16, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(64, 576, device="cuda", dtype=torch.bfloat16)
    out, lse = ops.sparse_mla_fwd(q, kv, torch.empty(0, 2048, device="cuda", dtype=torch.int32), 0.1)
    torch.cuda.synchronize()
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
