"""CPU tests of the op layer: argument errors (named, before anything is written), the CPU
implementation against an independent float64 loop, the cache formats' byte layout, and the
constants shared between C++ and Python."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import zlib

import pytest
import torch

from vllm_sparse_mla_blackwell import _testing, cases, formats, ops, reference

pytestmark = pytest.mark.skipif(not ops.extension_available(), reason="op library not built")


def naive_sparse_mla(q, rows, indices, sm_scale, topk, topk_len=None):
    """float64, one (token, head) at a time: an independent check of the reference."""
    T, H, _ = q.shape
    out = torch.zeros(T, H, 512, dtype=torch.float64)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64)
    for t in range(T):
        limit = topk if topk_len is None else min(topk, int(topk_len[t]))
        valid = [int(i) for i in indices[t, :limit] if 0 <= int(i) < rows.shape[0]]
        if not valid:
            continue
        k = rows[valid].double()
        for h in range(H):
            s = (k[:, : q.shape[-1]] @ q[t, h].double()) * sm_scale
            m = s.max()
            p = torch.exp(s - m)
            out[t, h] = (p[:, None] * k[:, :512]).sum(0) / p.sum()
            lse[t, h] = m + torch.log(p.sum())
    return out, lse


@pytest.mark.parametrize("masking", ["none", "random", "invalid", "all_masked", "topk_len"])
@pytest.mark.parametrize("head_size", [512, 576])
def test_reference_matches_float64_loop(masking, head_size):
    case = cases.Case(head_size=head_size, num_heads=3, topk=40, num_tokens=5, masking=masking, block_size=16)
    inp = cases.make_inputs(case, "cpu")
    out, lse = reference.sparse_mla_reference(inp.q, inp.kv_rows, inp.indices, case.sm_scale,
                                              topk=case.topk, topk_len=inp.topk_len)
    ref_out, ref_lse = naive_sparse_mla(inp.q, inp.kv_rows, inp.indices, case.sm_scale, case.topk, inp.topk_len)
    assert torch.isfinite(out).all()  # NaN rows of the cache are never mixed in
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "split_q"])
def test_cpu_op_equals_reference(kv_cache_dtype, layout):
    case = cases.Case(head_size=576, num_heads=5, topk=70, num_tokens=4, kv_cache_dtype=kv_cache_dtype,
                      masking="invalid", layout=layout, block_size=16)
    inp = cases.make_inputs(case, "cpu")
    out, lse = ops.sparse_mla_fwd(inp.q, inp.kv_cache, inp.indices, case.sm_scale, q_pe=inp.q_pe,
                                  kv_cache_dtype=inp.kv_cache_dtype, k_scale=inp.k_scale, topk=case.topk,
                                  out=inp.out)
    result = cases.compare(case, inp, out, lse)
    assert result.all_written and result.masked_exact
    assert result.max_rel_err < 4e-3 and result.max_lse_err < 1e-5


@pytest.mark.parametrize("q_dtype, kv, scale, passes", [
    ("bf16", "bf16", 1.003, True), ("bf16", "bf16", 1.0045, False),
    ("fp16", "fp16", 1.0008, True), ("fp16", "fp16", 1.0015, False),  # fp16 out and MMAs: 1e-3
    ("fp16", "bf16", 1.003, True),  # bf16 MMAs, whose P rounds to bf16: 4e-3
])
def test_compare_fails_an_output_off_by_more_than_its_bar(q_dtype, kv, scale, passes):
    """verify's bar: per-row relative error against the fp32 reference, 4e-3, or 1e-3 where out
    and the MMAs are fp16; an output scaled by ``scale`` (relative error scale - 1) passes or not."""
    case = cases.Case(head_size=576, num_heads=4, topk=64, num_tokens=3, q_dtype=q_dtype, kv_cache_dtype=kv)
    inp = cases.make_inputs(case, "cpu")
    out, lse = reference.sparse_mla_reference(inp.q, inp.kv_rows, inp.indices, case.sm_scale, topk=case.topk,
                                              topk_len=inp.topk_len, q_pe=inp.q_pe)
    result = cases.compare(case, inp, (out * scale).to(inp.out.dtype), lse)
    assert result.passed is passes, result


def test_case_seeds_are_those_verified_before_row_spread_existed():
    """verify's inputs stay the ones its recorded H200 runs used (bench/results/*/verify.json)."""
    old_repr = ("Case(head_size=576, num_heads=16, topk=2048, num_tokens=7, q_dtype='bf16', kv_cache_dtype='bf16', "
                "masking='none', block_size=64, layout='contiguous', sm_scale=0.135234, index_width=0, seed=0)")
    assert cases.case_seed(cases.Case()) == zlib.crc32(old_repr.encode()) & 0x7FFFFFFF
    assert cases.case_seed(cases.Case(row_spread=12)) == cases.case_seed(cases.Case())
    assert cases.case_seed(cases.Case(value_scale_log2=17)) == cases.case_seed(cases.Case())
    assert cases.case_seed(cases.Case(num_heads=64, block_heads=32)) == cases.case_seed(cases.Case(num_heads=64))


def test_row_spread_rescales_cache_rows_only():
    base = cases.Case(head_size=576, num_heads=4, topk=64, num_tokens=3, block_size=16)
    spread = dataclasses.replace(base, row_spread=12)
    a, b = cases.make_inputs(base, "cpu"), cases.make_inputs(spread, "cpu")
    assert torch.equal(a.q, b.q) and torch.equal(a.indices, b.indices)
    referenced = a.kv_rows[:, 0].isfinite()
    ratio = b.kv_rows[referenced] / a.kv_rows[referenced]  # bf16 rows: powers of two scale exactly
    per_row = ratio[:, 0]
    assert torch.all((ratio == per_row[:, None]) | a.kv_rows[referenced].eq(0))
    assert set(per_row.unique().tolist()) <= {1.0, 2.0**-12}
    assert 0.85 < (per_row == 2.0**-12).float().mean().item() < 1.0
    assert "spread2^-12" in spread.label()


def test_row_ramp_sorts_each_tokens_slots_by_a_growing_row_scale():
    base = cases.Case(head_size=576, num_heads=4, topk=64, num_tokens=3, block_size=16)
    ramp = dataclasses.replace(base, row_ramp=3.0)
    a, b = cases.make_inputs(base, "cpu"), cases.make_inputs(ramp, "cpu")
    assert torch.equal(a.q, b.q)
    assert torch.equal(a.indices.sort(dim=1).values, b.indices.sort(dim=1).values)  # the same slots, reordered
    referenced = a.kv_rows[:, 0].isfinite()
    ratio = b.kv_rows[referenced] / a.kv_rows[referenced]
    row_scale = ratio.median(dim=1, keepdim=True).values
    assert torch.allclose(ratio, row_scale.expand_as(ratio), rtol=1e-2)  # each value rounded to bf16
    per_row = torch.zeros(a.kv_rows.shape[0], dtype=torch.float64)
    per_row[referenced] = row_scale[:, 0].double()
    along = per_row[b.indices.long()]  # [T, topk]: each token's row scales in slot order
    assert torch.all(along[:, 1:] >= along[:, :-1] * (1 - 1e-2))
    assert 0.99 <= along.min() < 1.5 and 3.5 < along.max() < 4.01  # 1 + 3 u, u in [0, 1)
    assert "ramp3" in ramp.label()
    assert cases.case_seed(ramp) == cases.case_seed(base)


@pytest.mark.parametrize("row_ramp", [-0.5, 16.5, float("nan")])
def test_row_ramp_outside_its_range_is_refused(row_ramp):
    with pytest.raises(ValueError, match=r"row_ramp must be in \[0, 16\]"):
        cases.make_inputs(cases.Case(head_size=512, num_heads=4, topk=64, num_tokens=3, row_ramp=row_ramp), "cpu")


def _lazy_maximum_events(case: cases.Case) -> dict[str, float]:
    """The lazy rescale's events on a case's inputs, from float64 scores (log2 units), one chain
    of tiles per row (an unsplit launch): a row's reference maximum starts at its first 32-key
    tile's and moves only where a tile's passes it by more than 8 (sparse_mla_fwd_wide.cuh
    kBlockN, kLazyLog2); a 32-head block's heads vote on each tile."""
    inp = cases.make_inputs(case, "cpu")
    rows = inp.kv_rows.double()[inp.indices[:, : case.topk].long()]
    scores = torch.einsum("thd,tkd->thk", inp.q.double(), rows) * (case.sm_scale / math.log(2))
    tile_max = scores.unflatten(-1, (-1, 32)).amax(-1)  # [T, H, tiles]
    m = tile_max[..., 0]
    moves = torch.zeros_like(tile_max, dtype=torch.bool)
    p_log2 = torch.zeros_like(m)  # the largest p of a row after its first tile, log2
    for t in range(1, tile_max.shape[-1]):
        moves[..., t] = tile_max[..., t] > m + 8
        m = torch.where(moves[..., t], tile_max[..., t], m)
        p_log2 = torch.maximum(p_log2, tile_max[..., t] - m)
    per_block = moves[..., 1:].unflatten(1, (-1, 32))  # [T, blocks, 32 heads, tiles]
    return {"moves_per_row": moves.sum(-1).double().mean().item(),
            "mixed_tiles": (per_block.any(2) & ~per_block.all(2)).double().mean().item(),
            "p_past_2^7": (p_log2 > 7).double().mean().item()}


@pytest.mark.parametrize("row_ramp, moves, mixed, past_7", [(0.0, (0.2, 0.4), (0.08, 0.2), (0.15, 0.3)),
                                                              (1.0, (1.3, 1.6), (0.45, 0.6), (0.4, 0.6)),
                                                              (3.0, (3.2, 3.7), (0.75, 0.9), (0.55, 0.7))])
def test_row_ramp_moves_the_running_maximum_at_different_tiles(row_ramp, moves, mixed, past_7):
    """test_kernel_gpu.py's rising-maximum inputs reach the lazy rescale's paths: row_ramp 1 and 3
    move each row's maximum 5-12x as often as plain inputs (row_ramp 0), in about half / 80 % of
    the tiles a 32-head block's heads disagree on it (the warp vote), and P passes 2^7 in about
    half / 60 % of the rows. D = 576, 256 tokens: the GPU test's bf16 inputs."""
    ev = _lazy_maximum_events(cases.Case(head_size=576, num_heads=32, topk=2048, num_tokens=256, row_ramp=row_ramp,
                                         block_heads=32))
    assert moves[0] < ev["moves_per_row"] < moves[1], ev
    assert mixed[0] < ev["mixed_tiles"] < mixed[1] and past_7[0] < ev["p_past_2^7"] < past_7[1], ev


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_value_scale_scales_cache_up_and_q_down_exactly(layout):
    base = cases.Case(head_size=576, num_heads=4, topk=64, num_tokens=3, block_size=16, layout=layout)
    scaled = dataclasses.replace(base, value_scale_log2=17)
    a, b = cases.make_inputs(base, "cpu"), cases.make_inputs(scaled, "cpu")
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(b.q.float() * 2.0**17, a.q.float())  # powers of two: exact in bf16
    referenced = a.kv_rows[:, 0].isfinite()
    assert torch.equal(b.kv_rows[referenced], a.kv_rows[referenced] * 2.0**17)
    assert b.kv_rows[referenced].abs().max() > 65520  # past fp16's range
    assert "values2^17" in scaled.label()


@pytest.mark.parametrize("q_dtype, kv", [("fp16", "bf16"), ("bf16", "fp16"), ("bf16", "fp8_e4m3")])
def test_value_scale_is_for_bf16_q_and_cache_only(q_dtype, kv):
    case = cases.Case(head_size=512, num_heads=4, topk=64, num_tokens=3, q_dtype=q_dtype, kv_cache_dtype=kv,
                      value_scale_log2=17)
    with pytest.raises(ValueError, match="value_scale_log2 needs a bf16 cache and bf16 q"):
        cases.make_inputs(case, "cpu")


def _good_args(T=3, H=4, D=576, topk=8):
    return dict(
        q=torch.randn(T, H, D, dtype=torch.bfloat16),
        kv_cache=torch.randn(4, 16, D, dtype=torch.bfloat16),
        indices=torch.zeros(T, topk, dtype=torch.int32),
        sm_scale=0.1,
        out=torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16),
        lse=torch.full((T, H), float("nan")),
    )


BAD_INPUTS = [
    ("q", lambda a: a.update(q=a["q"].float()), "q must be bfloat16 or float16"),
    ("q", lambda a: a.update(q=a["q"][0]), "q must have 3 dims"),
    ("q", lambda a: a.update(q=a["q"][..., :500]), "head_size) must be 512 or 576"),
    ("q", lambda a: a.update(q=torch.randn(3, 129, 576, dtype=torch.bfloat16)), "num_heads) must be in 1..128"),
    ("q", lambda a: a.update(q=a["q"].transpose(0, 2).contiguous().transpose(0, 2)), "q must have a contiguous last dim"),
    ("q", lambda a: a.update(q=torch.randn(3 * 4 * 576 + 1, dtype=torch.bfloat16)[1:].view(3, 4, 576)), "16-byte aligned"),
    ("q_pe", lambda a: a.update(q=a["q"][..., :512].contiguous(), q_pe=torch.randn(3, 4, 32, dtype=torch.bfloat16)), "q_pe.shape[2] must be 64"),
    ("q_pe", lambda a: a.update(q=a["q"][..., :512].contiguous(), q_pe=torch.randn(3, 4, 64, dtype=torch.float16)), "q_pe must be bfloat16"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"][..., :512]), "kv_cache last dim must be 576"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"].half(), kv_cache_dtype="bfloat16"), "kv_cache must be bfloat16"),
    ("kv_cache", lambda a: a.update(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float32)), "needs a bfloat16 or float16 kv_cache"),
    ("kv_cache", lambda a: a.update(kv_cache=torch.zeros(4, 16, 600, dtype=torch.uint8), kv_cache_dtype="fp8_ds_mla"), "kv_cache last dim must be 656"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"].view(-1)), "kv_cache must be [num_blocks"),
    ("kv_cache_dtype", lambda a: a.update(kv_cache_dtype="int4"), "kv_cache_dtype must be one of"),
    ("k_scale", lambda a: a.update(k_scale=torch.ones(1)), "k_scale is only used with kv_cache_dtype fp8"),
    ("k_scale", lambda a: a.update(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8), kv_cache_dtype="fp8", k_scale=torch.ones(2)), "k_scale must hold one element"),
    ("indices", lambda a: a.update(indices=a["indices"].long()), "indices must be int32"),
    ("indices", lambda a: a.update(indices=a["indices"][:2]), "indices.shape[0] must be 3"),
    ("indices", lambda a: a.update(indices=torch.zeros(3, 0, dtype=torch.int32)), "topk must be >= 1"),
    ("topk", lambda a: a.update(topk=0), "topk must be >= 1"),
    ("topk", lambda a: a.update(topk=9), "topk (9) must be <= indices.shape[1] (8)"),
    ("topk_len", lambda a: a.update(topk_len=torch.zeros(3, dtype=torch.int64)), "topk_len must be int32"),
    ("topk_len", lambda a: a.update(topk_len=torch.zeros(2, dtype=torch.int32)), "topk_len.shape[0] must be 3"),
    ("out", lambda a: a.update(out=a["out"].half()), "out must be bfloat16"),
    ("out", lambda a: a.update(out=a["out"][..., :256]), "out.shape[2] must be 512"),
    ("lse", lambda a: a.update(lse=a["lse"].double()), "lse must be float32"),
    ("lse", lambda a: a.update(lse=a["lse"][:, :2]), "lse.shape[1] must be 4"),
    ("sm_scale", lambda a: a.update(sm_scale=float("nan")), "sm_scale must be a finite float32"),
    ("sm_scale", lambda a: a.update(sm_scale=1e300), "sm_scale must be a finite float32"),
    ("topk", lambda a: a.update(topk=-5), "topk must be >= 1 (or -1"),
    ("topk", lambda a: a.update(topk=3.7), "topk must be an int"),
    ("q", lambda a: a.update(q=torch.randn(576, dtype=torch.bfloat16), out=None, lse=None), "q must have 3 dims"),
    ("out", lambda a: a.update(out=torch.full((1, 1, 512), float("nan"), dtype=torch.bfloat16).expand(3, 4, 512)), "out must not overlap itself"),
    ("lse", lambda a: a.update(lse=torch.full((1, 1), float("nan")).expand(3, 4)), "lse must not overlap itself"),
    ("lse", lambda a: a.update(lse=a["out"].view(-1).view(torch.float32)[:12].view(3, 4)), "out must not overlap lse"),
    ("out", lambda a: a.update(out=a["q"][..., :512]), "out must not overlap q"),
    ("workspace", lambda a: a.update(workspace=a["kv_cache"].view(-1).view(torch.uint8)), "workspace must not overlap kv_cache"),
    ("workspace", lambda a: a.update(workspace=a["indices"].view(-1).view(torch.uint8)), "workspace must not overlap indices"),
    ("kv_cache", lambda a: a.update(kv_cache=torch.zeros(2, 2, 2, 2, 576, dtype=torch.bfloat16)), "kv_cache must have at most 4 dims"),
    ("q", lambda a: a.update(q=a["q"].double()), "got Double"),
]


@pytest.mark.parametrize("name,mutate,message", BAD_INPUTS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_is_named_and_nothing_written(name, mutate, message):
    args = _good_args()
    poisoned = args["out"]
    mutate(args)
    with pytest.raises(ValueError) as err:
        ops.sparse_mla_fwd(**args)
    assert message in str(err.value)
    assert name.split(".")[0] in str(err.value)
    assert poisoned.isnan().all()  # still poisoned: nothing written


def test_empty_cache_gives_empty_rows():
    args = _good_args()
    args["kv_cache"] = torch.zeros(0, 16, 576, dtype=torch.bfloat16)
    out, lse = ops.sparse_mla_fwd(**args)
    assert (out == 0).all() and (lse == float("-inf")).all()


CACHE_BAD_INPUTS = [
    ("k_scale", dict(k_scale=torch.ones(1)), "k_scale is only used with kv_cache_dtype fp8"),
    ("slot_mapping", dict(slot_mapping=torch.arange(8)[::2]), "slot_mapping must be contiguous"),
    ("slot_mapping", dict(slot_mapping=torch.arange(4, dtype=torch.int32)), "slot_mapping must be int64"),
    ("kv_c", dict(kv_c=torch.ones(4, 500, dtype=torch.bfloat16)), "kv_c.shape[1] must be 512"),
    ("kv_c", dict(kv_c=torch.ones(4, 512)), "kv_c must be bfloat16 or float16, got float32"),
]


@pytest.mark.parametrize("name,override,message", CACHE_BAD_INPUTS, ids=[c[0] for c in CACHE_BAD_INPUTS])
def test_cache_writer_bad_input_writes_nothing(name, override, message):
    args = dict(kv_c=torch.ones(4, 512, dtype=torch.bfloat16), k_pe=torch.ones(4, 64, dtype=torch.bfloat16),
                kv_cache=torch.full((2, 4, 576), 7.0, dtype=torch.bfloat16), slot_mapping=torch.arange(4),
                kv_cache_dtype="auto")
    args.update(override)
    with pytest.raises(ValueError, match=re.escape(message)):
        ops.concat_and_cache_sparse_mla(**args)
    assert (args["kv_cache"] == 7.0).all()


def test_cache_writer_skips_slots_outside_the_cache():
    cache = torch.full((2, 4, 576), 7.0, dtype=torch.bfloat16)
    ops.concat_and_cache_sparse_mla(torch.ones(4, 512, dtype=torch.bfloat16), torch.ones(4, 64, dtype=torch.bfloat16),
                                    cache, torch.tensor([0, 8, -1, 2**40]), "auto")
    rows = cache.view(8, 576)
    assert (rows[0] == 1).all() and (rows[1:] == 7.0).all()


def test_cache_writer_follows_the_block_stride():
    """A block-outer view (block stride of three caches' rows, as vLLM 0.33 gives GLM-5.3-Flash's
    layers): slot s lands in row s % 4 of block s // 4 of this view, nowhere else."""
    storage = torch.full((3, 12, 512), 7.0, dtype=torch.bfloat16)
    cache = storage[:, 4:8]
    kv_c = torch.arange(1, 6, dtype=torch.bfloat16)[:, None].expand(5, 512).contiguous()
    ops.concat_and_cache_sparse_mla(kv_c, None, cache, torch.tensor([0, 6, 11, -1, 12]), "auto")
    want = torch.full_like(storage, 7.0)
    want[0, 4], want[1, 6], want[2, 7] = 1.0, 2.0, 3.0
    assert torch.equal(storage, want)


@pytest.mark.parametrize("make, message", [
    (lambda: torch.zeros(64, 512, dtype=torch.bfloat16).as_strided((4, 16, 512), (256, 8, 1)),
     "kv_cache rows must not overlap (stride(1) >= 512)"),
    (lambda: torch.zeros(1, 512, dtype=torch.bfloat16).expand(4, 512), "kv_cache rows must not overlap (stride(0)"),
    (lambda: torch.zeros(512, dtype=torch.bfloat16).expand(4, 4, 512), "kv_cache rows must not overlap (stride(1)"),
    (lambda: torch.zeros(64, 512, dtype=torch.bfloat16).as_strided((4, 4, 512), (1536, 512, 1)),
     "kv_cache blocks must not overlap (stride(0) >= (shape[1] - 1) * stride(1) + shape[2])"),
    (lambda: torch.zeros(64, 656, dtype=torch.uint8).as_strided((8, 656), (16, 1)),
     "kv_cache rows must not overlap (stride(0) >= 656)"),
], ids=["rows-in-a-block", "expanded-2d", "expanded-3d", "blocks", "ds-mla-2d"])
def test_cache_writer_refuses_overlapping_rows_and_writes_nothing(make, message):
    cache = make()
    fmt = "fp8_ds_mla" if cache.dtype == torch.uint8 else "auto"
    before = cache.clone()
    with pytest.raises(ValueError, match=re.escape(message)):
        ops.concat_and_cache_sparse_mla(torch.ones(2, 512, dtype=torch.bfloat16), None, cache,
                                        torch.arange(2), fmt)
    assert torch.equal(cache, before)


def test_forward_refuses_overlapping_rows():
    rows = torch.zeros(64, 576, dtype=torch.bfloat16).as_strided((8, 576), (8, 1))
    with pytest.raises(ValueError, match=re.escape("kv_cache rows must not overlap")):
        ops.sparse_mla_fwd(torch.randn(1, 1, 576, dtype=torch.bfloat16), rows, torch.zeros(1, 4, dtype=torch.int32), 0.1)


def test_forward_still_needs_evenly_spaced_blocks():
    q = torch.randn(1, 1, 512, dtype=torch.bfloat16)
    cache = torch.zeros(3, 12, 512, dtype=torch.bfloat16)[:, 4:8]
    with pytest.raises(ValueError, match=re.escape("kv_cache blocks must be evenly spaced rows")):
        ops.sparse_mla_fwd(q, cache, torch.zeros(1, 4, dtype=torch.int32), 0.1)


@pytest.mark.parametrize("args, message", [
    ((torch.float32, "bfloat16", 576, 16, 0), "dtype must be bfloat16 or float16"),
    ((torch.bfloat16, "auto", 576, 16, 0), "'auto' needs a cache"),
    ((torch.bfloat16, "fp8_e5m2", 576, 16, 0), "kv_cache_dtype must be one of"),
    ((torch.bfloat16, "bfloat16", 128, 16, 0), "head_size must be 512 or 576, got 128"),
    ((torch.bfloat16, "bfloat16", 576, 129, 0), r"num_heads must be in 1\.\.128, got 129"),
    ((torch.bfloat16, "bfloat16", 576, 0, 0), "num_heads must be in"),
    ((torch.bfloat16, "bfloat16", 576, 16, torch.device("cpu")), "device must be a CUDA device"),
])
def test_fwd_blocks_per_sm_names_the_bad_argument(args, message):
    """Checked before any CUDA call, so on any machine."""
    with pytest.raises(ValueError, match=message):
        _testing.fwd_blocks_per_sm(*args)


def test_fwd_blocks_per_sm_names_an_unknown_variant():
    for variant in ("two", None, 3):
        with pytest.raises(ValueError, match="variant must be one of main, one_stage, decoded_fp8, paired_scores"):
            _testing.fwd_blocks_per_sm(torch.bfloat16, "fp8_ds_mla", 576, 16, 0, variant=variant)


@pytest.mark.parametrize("block_heads, message", [
    (24, "block_heads must be 16, 32 or None, got 24"),
    (0, "block_heads must be 16, 32 or None, got 0"),
    (True, "block_heads must be 16, 32 or None"),
    (16.0, "block_heads must be 16, 32 or None, got 16.0"),
    (32, "block_heads 32 needs num_heads > 16"),
])
def test_forced_block_heads_are_checked_and_nothing_written(block_heads, message):
    """The testing knob's values (16 or 32, 32 only above 16 heads), named before any launch."""
    args = _good_args()
    poisoned = args["out"]
    with pytest.raises(ValueError, match=message):
        _testing.sparse_mla_fwd(**args, block_heads=block_heads)
    assert poisoned.isnan().all()


def test_public_op_has_no_measurement_knobs():
    import inspect

    assert "block_heads" not in inspect.signature(ops.sparse_mla_fwd).parameters
    assert not hasattr(ops, "fwd_blocks_per_sm")


def test_format_constants_agree_with_cpp():
    got = torch.ops.sparse_mla_bw.format_constants()
    assert got == [formats.KV_LORA_RANK, formats.QK_ROPE_HEAD_DIM, formats.HEAD_SIZE_V, formats.MAX_NUM_HEADS,
                   formats.SMEM_BUDGET_BYTES, formats.FP8_DS_MLA_RECORD_BYTES, formats.FP8_DS_MLA_SCALE_OFFSET,
                   formats.FP8_DS_MLA_ROPE_OFFSET, formats.FP8_DS_MLA_TILE]


def test_workspace_size_grows_with_sms():
    assert torch.ops.sparse_mla_bw.workspace_size(132) > torch.ops.sparse_mla_bw.workspace_size(20) > 0


@pytest.mark.parametrize("rope", [True, False])
def test_fp8_ds_mla_byte_layout(rope):
    """vLLM's 656-byte fp8_ds_mla record written by the CPU op: latent e4m3 at [0,512), four fp32
    per-128 scales at [512,528) equal to amax/448 (vLLM's rule), bf16 rope at [528,656) or zeros."""
    torch.manual_seed(0)
    kv_c = (torch.randn(3, 512) * torch.tensor([1.0, 10.0, 0.01, 1000.0]).repeat_interleave(128)).bfloat16()
    k_pe = torch.randn(3, 64).bfloat16() if rope else None
    cache = torch.full((2, 4, 656), 0xAB, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 0])
    ops.concat_and_cache_sparse_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla")
    rows = cache.view(-1, 656)
    assert (rows[[1, 2, 3, 4, 6, 7]] == 0xAB).all()  # untouched rows, and token 1 skipped (slot -1)
    for token, slot in ((0, 5), (2, 0)):
        rec = rows[slot]
        scales = rec[512:528].contiguous().view(torch.float32)
        amax = kv_c[token].float().view(4, 128).abs().amax(-1)
        torch.testing.assert_close(scales, amax / 448.0, rtol=0, atol=0)
        latent = rec[:512].contiguous().view(torch.float8_e4m3fn).float().view(4, 128) * scales[:, None]
        torch.testing.assert_close(latent.view(512), kv_c[token].float(), rtol=0.0625, atol=scales.max().item() * 2**-9)
        rope_bytes = rec[528:656].contiguous()
        if rope:
            assert torch.equal(rope_bytes.view(torch.bfloat16), k_pe[token])
        else:
            assert (rope_bytes == 0).all()


def test_dequantize_kv_cache_decodes_hand_built_rows():
    """The reference decoder on bytes written by hand, independent of the reference writer: e4m3
    0x38 = 1.0, 0x40 = 2.0, 0xC0 = -2.0, 0x01 = 2^-9 (the smallest subnormal); fp8 times k_scale;
    fp8_ds_mla's latent times its 128-value tile's fp32 scale, then its bf16 rope."""
    e4m3 = torch.tensor([0x38, 0x40, 0xC0, 0x01], dtype=torch.uint8)
    values = torch.tensor([1.0, 2.0, -2.0, 2.0**-9])
    row = e4m3.repeat(144)[None]  # 576 bytes
    torch.testing.assert_close(reference.dequantize_kv_cache(row, "fp8", 576, torch.tensor([0.5])),
                               (values.repeat(144) * 0.5)[None], rtol=0, atol=0)
    record = torch.zeros(1, 656, dtype=torch.uint8)
    record[0, :512] = e4m3.repeat(128)
    record[0, 512:528] = torch.tensor([2.0, 4.0, 0.25, 1024.0]).view(torch.uint8)
    rope = torch.linspace(-3, 3, 64).bfloat16()
    record[0, 528:] = rope.view(torch.uint8)
    latent = values.repeat(128).view(4, 128) * torch.tensor([2.0, 4.0, 0.25, 1024.0])[:, None]
    want = torch.cat([latent.view(512), rope.float()])[None]
    torch.testing.assert_close(reference.dequantize_kv_cache(record, "fp8_ds_mla", 576), want, rtol=0, atol=0)
    torch.testing.assert_close(reference.dequantize_kv_cache(record, "fp8_ds_mla", 512), want[:, :512], rtol=0, atol=0)


def test_fp8_e4m3_cache_roundtrip():
    torch.manual_seed(1)
    kv_c, k_pe = torch.randn(5, 512).half(), torch.randn(5, 64).half()
    cache = torch.zeros(5, 576, dtype=torch.uint8)
    k_scale = torch.tensor([0.25])
    ops.concat_and_cache_sparse_mla(kv_c, k_pe, cache, torch.arange(5), "fp8", k_scale)
    rows = reference.dequantize_kv_cache(cache, "fp8", 576, k_scale)
    full = torch.cat([kv_c, k_pe], -1).float()
    assert ((rows - full).abs() <= full.abs() * 0.0625 + 0.25 * 2**-9).all()
    assert ((rows - full).abs() > 0).any()  # it really is quantised


@pytest.mark.parametrize("targets,capability,ok", [
    (["120a"], (12, 0), True), (["120a"], (12, 1), False), (["121a"], (12, 0), False),
    (["120"], (12, 1), True), (["80"], (8, 9), True), (["80"], (9, 0), False),
    (["80", "ptx80"], (10, 0), True), (["90a"], (9, 0), True), (["86"], (8, 0), False),
])
def test_unsupported_device_reason_follows_cuda_compatibility(monkeypatch, targets, capability, ok):
    monkeypatch.setattr(ops, "compiled_targets", lambda: targets)
    reason = ops.unsupported_device_reason(capability)
    assert (reason is None) == ok
    if not ok:
        assert "GLM53_ARCHS=" in reason


def test_library_records_its_targets():
    targets = ops.compiled_targets()
    assert targets and all(t.removeprefix("ptx").rstrip("af").isdigit() for t in targets)


def test_bench_command_line_narrows_the_shapes(monkeypatch):
    """--tokens/--kv/--models/--no-naive reach bench.main as parsed values; bad values are refused."""
    from vllm_sparse_mla_blackwell import bench, cli

    seen = {}
    monkeypatch.setattr(bench, "main", lambda **kw: seen.update(kw) or 0)
    assert cli.main(["bench", "--tokens", "1,64", "--kv", "fp8_e4m3,bf16", "--models", "DeepSeek-V3.2", "--no-naive",
                     "--no-peers"]) == 0
    assert seen["tokens"] == (1, 64)
    assert seen["kv_dtypes"] == ("fp8_e4m3", "bf16")
    assert seen["models"] == ("DeepSeek-V3.2",)
    assert seen["naive"] is False and seen["peers"] is False
    cli.main(["bench"])
    assert seen["tokens"] is None and seen["kv_dtypes"] is None and seen["naive"] is True and seen["peers"] is True
    # Repeats add up, duplicates go.
    cli.main(["bench", "--tokens", "1,1,64", "--tokens", "64,4", "--kv", "bf16", "--kv", "fp8_ds_mla,bf16"])
    assert seen["tokens"] == (1, 64, 4)
    assert seen["kv_dtypes"] == ("bf16", "fp8_ds_mla")
    for option, bad in (("--tokens", "0"), ("--tokens", "1,x"), ("--tokens", ""), ("--tokens", str(1 << 40)),
                        ("--kv", ""), ("--kv", ","), ("--models", " ")):
        with pytest.raises(SystemExit):
            cli.main(["bench", option, bad])


def test_time_ms_sizes_its_graph_from_a_two_call_estimate(monkeypatch):
    from vllm_sparse_mla_blackwell import bench

    calls = []
    monkeypatch.setattr(bench, "_median_ms", lambda fn, reps, sets: calls.append((reps, sets)) or 0.5)
    assert bench.time_ms(None) == 0.5
    assert calls == [(2, bench.INDEX_SETS), (40, bench.INDEX_SETS)]  # 20 ms of 0.5 ms calls


def test_bench_peers_that_cannot_run_or_disagree_are_noted_not_timed(monkeypatch):
    """vLLM's kernels are optional in bench: one that raises, or whose output is not this kernel's
    (a misused interface), gets a line in the notes and no time; one that agrees is timed."""
    from vllm_sparse_mla_blackwell import bench

    ours = torch.randn(2, 16, 512)
    behaviour = {"FlashMLA-sparse": "raise", "FA3-sparse": "wrong"}
    outputs = {"wrong": -ours, "scaled": 1.08 * ours, "agree": ours}

    def fake_call(peer, *args):
        if behaviour[peer] == "raise":
            raise ImportError("No module named 'vllm'")
        return lambda i: outputs[behaviour[peer]]

    monkeypatch.setattr(bench, "_peer_call", fake_call)
    monkeypatch.setattr(bench, "_median_ms", lambda call, reps, sets: 0.5)
    q = torch.zeros(2, 16, 576)
    notes = {}
    assert bench._time_peers("bf16", q, None, [None], 0.1, ours, 1.0, notes, {}) == {}
    assert "No module named 'vllm'" in notes["FlashMLA-sparse (bf16, D=576, H=16)"]
    assert "differs from this kernel's" in notes["FA3-sparse (bf16, D=576, H=16)"]
    behaviour["FA3-sparse"] = "scaled"  # the same direction, 8 % too large: not the same result
    notes = {}
    assert bench._time_peers("bf16", q, None, [None], 0.1, ours, 1.0, notes, {}) == {}
    assert "relative error 8.00e-02" in notes["FA3-sparse (bf16, D=576, H=16)"]
    behaviour["FA3-sparse"] = "agree"
    rel_errs = {}
    assert bench._time_peers("bf16", q, None, [None], 0.1, ours, 1.0, {}, rel_errs) == {"FA3-sparse": 500.0}
    assert rel_errs == {"FA3-sparse": 0.0}
    assert bench._time_peers("fp8_e4m3", q, None, [None], 0.1, ours, 1.0, {}, {}) == {}  # no vLLM kernel reads it


@pytest.mark.parametrize("kv, code", [("int4", 2), ("bfloat16,fp8", None)])
def test_bench_unknown_cache_dtype_is_a_usage_error_and_vllm_names_work(kv, code, monkeypatch):
    """Exit 2 (bad arguments) before any GPU check; vLLM's spellings map to bench's own."""
    from vllm_sparse_mla_blackwell import bench, cli

    if code is None:
        seen = {}
        monkeypatch.setattr(bench, "run", lambda **kw: seen.update(kw) or ([], {}))
        monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
        assert cli.main(["bench", "--kv", kv]) == 3  # past the name check, stopped at "no GPU"
    else:
        assert cli.main(["bench", "--kv", kv]) == code


@pytest.mark.parametrize("sm_scale", ["abc", None, True, torch.tensor(0.1)])
def test_sm_scale_that_is_no_number_is_named(sm_scale):
    q = torch.randn(1, 1, 576, dtype=torch.bfloat16)
    out = torch.full((1, 1, 512), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sm_scale must be a finite float32"):
        ops.sparse_mla_fwd(q, torch.zeros(4, 576, dtype=torch.bfloat16), torch.zeros(1, 4, dtype=torch.int32),
                           sm_scale, out=out)
    assert out.isnan().all()


def test_meta_and_cpu_tensors_mixed_are_refused():
    """A meta tensor sends the call to the fake implementation; it must not pass silently."""
    q = torch.randn(1, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache must be on the same device as q"):
        ops.sparse_mla_fwd(q, torch.zeros(4, 576, dtype=torch.bfloat16, device="meta"),
                           torch.zeros(1, 4, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="kv_cache must be on the same device as kv_c"):
        ops.concat_and_cache_sparse_mla(torch.ones(1, 512, dtype=torch.bfloat16), None,
                                        torch.zeros(4, 512, dtype=torch.bfloat16, device="meta"),
                                        torch.zeros(1, dtype=torch.int64), "auto")
    # All on meta (shape propagation, torch.compile's fake tensors): fine.
    out, lse = ops.sparse_mla_fwd(q.to("meta"), torch.zeros(4, 576, dtype=torch.bfloat16, device="meta"),
                                  torch.zeros(1, 4, dtype=torch.int32, device="meta"), 0.1)
    assert out.device.type == "meta" and out.shape == (1, 1, 512) and lse.shape == (1, 1)


def test_command_line_output_in_a_log_is_not_cut_to_80_columns(same_package_env):
    """Redirected output (a file, a CI log) keeps whole lines: rich would wrap at 80 columns."""
    env = same_package_env(CUDA_VISIBLE_DEVICES="")  # the no-GPU message, on any machine
    env.pop("COLUMNS", None)
    r = subprocess.run([sys.executable, "-m", "vllm_sparse_mla_blackwell", "verify"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert len(first) > 80 and "none is visible" in first and first.rstrip().endswith("Exit 3."), r.stdout


def test_bench_pools_every_cache_format_at_its_row_size():
    """bench times each cache format the kernel reads; its pool rows have that format's bytes."""
    from vllm_sparse_mla_blackwell import bench

    assert set(bench.KV_DTYPES) == {"bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"}
    expected = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.uint8, "fp8_ds_mla": torch.uint8}
    for kv_dtype in bench.KV_DTYPES:
        for head_size in (512, 576):
            dtype, width = bench.cache_layout(kv_dtype, head_size)
            row_bytes = 656 if kv_dtype == "fp8_ds_mla" else head_size * (2 if dtype != torch.uint8 else 1)
            assert (dtype, width * dtype.itemsize) == (expected[kv_dtype], row_bytes), (kv_dtype, head_size)


def test_bench_refuses_unknown_names_before_looking_for_a_gpu():
    from vllm_sparse_mla_blackwell import bench

    assert bench.main(kv_dtypes=("fp8_e5m2",)) == 2
    assert bench.main(models=("GLM-6",)) == 2
    if not torch.cuda.is_available():  # e2e's lower-case spelling is a known model: on to "no GPU"
        assert bench.main(models=("deepseek-v3.2",)) == 3


def test_mma_peak_op_names_a_bad_dtype_before_looking_at_the_device():
    op = torch.ops.sparse_mla_bw.bench_mma_sync_peak
    assert op.default._schema.arguments[-1].default_value == "bf16"
    for bad in ("fp8", "E4M3", "half", ""):
        with pytest.raises(ValueError, match=f"dtype must be bf16, fp16 or e4m3, got '{bad}'"):
            op(torch.zeros(8), 1, 1, bad)
    for good in ("fp16", "e4m3"):  # a good dtype: on to the sink
        with pytest.raises(ValueError, match="sink must be a CUDA float32 tensor of at least num_blocks"):
            op(torch.zeros(8), 1, 1, good)
    # Counts out of int range: named before the sink or the device is looked at.
    for num_blocks in (0, -1, 1 << 31):
        with pytest.raises(ValueError, match=f"num_blocks must be in \\[1, 268435455\\], got {num_blocks}"):
            op(torch.zeros(8), num_blocks, 1)
    for iters in (0, -5, (1 << 32) + 1):
        with pytest.raises(ValueError, match=f"iters must be in \\[1, 2147483647\\], got {iters}"):
            op(torch.zeros(8), 1, iters)


def test_bench_mma_peak_is_none_where_the_op_has_no_e4m3(monkeypatch):
    """measure_mma_peak turns the op's FLOPs and time into TFLOP/s, and its NotImplementedError (a GPU
    below 8.9, or a build without an sm_89+ image for it) into None, before timing anything."""
    from types import SimpleNamespace

    from vllm_sparse_mla_blackwell import bench

    calls = []

    def fake_op(sink, blocks, iters, dtype):
        calls.append((sink.numel(), blocks, iters, dtype))
        if dtype == "e4m3":
            raise NotImplementedError("bench_mma_sync_peak: dtype e4m3 needs a GPU of compute capability 8.9")
        return blocks * 8 * iters * 8 * 4096

    monkeypatch.setattr(torch.ops.sparse_mla_bw, "bench_mma_sync_peak", fake_op)
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=2))

    def fake_median_ms(fn, reps, sets):
        fn(0)
        return 2.0

    monkeypatch.setattr(bench, "_median_ms", fake_median_ms)
    assert bench.measure_mma_peak("cpu", "e4m3") is None
    assert calls == [(64, 8, 20000, "e4m3")]  # refused on the first call, nothing timed
    assert bench.measure_mma_peak("cpu") == pytest.approx(8 * 8 * 20000 * 8 * 4096 / 2e-3 / 1e12)
    assert [c[3] for c in calls[1:]] == ["bf16", "bf16"]


def _table_cells(table) -> tuple[str, list[list[str]]]:
    """The rendered title and the cells of each line of a rich table (header first)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=600, color_system=None).print(table)
    lines = out.getvalue().splitlines()
    cells = [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in lines if len(re.findall("[│┃]", line)) > 2]
    return lines[0].strip(), cells


def test_bench_table_reports_fp8_rows_against_the_e4m3_peak():
    from vllm_sparse_mla_blackwell import bench

    def row(kv, tflops, e4m3_frac=None):
        return bench.Row("DeepSeek-V3.2", 576, 128, 2048, 1024, kv, 100.0, 50.0, 1000.0, 0.5, tflops, tflops / 650,
                         e4m3_frac=e4m3_frac, fp8_over_bf16=None if kv == "bf16" else 1.25)

    rows = [row("bf16", 195.0), row("fp8_e4m3", 260.0, 260.0 / 1300), row("fp8_ds_mla", 130.0, 130.0 / 1300)]
    meta = dict(device="GPU", date="2026-12-02", mma_sync_peak_tflops=650.0, mma_sync_fp16_peak_tflops=660.0,
                mma_sync_e4m3_peak_tflops=1300.0)
    title, cells = _table_cells(bench.results_table(rows, meta))
    assert "measured mma.sync peaks, TFLOP/s: bf16 650, fp16 660, e4m3 1300" in title and "emulated" not in title
    header = cells[0]
    by_kv = {c[header.index("kv")]: c for c in cells[1:]}
    assert {kv: c[header.index("% bf16 mma")] for kv, c in by_kv.items()} == {
        "bf16": "30", "fp8_e4m3": "40", "fp8_ds_mla": "20"}
    assert {kv: c[header.index("% e4m3 mma")] for kv, c in by_kv.items()} == {
        "bf16": "", "fp8_e4m3": "20", "fp8_ds_mla": "10"}
    assert by_kv["fp8_e4m3"][header.index("fp8 speed-up")] == "1.25"
    # sm_90's e4m3 figure is ptxas's emulation: printed as such, no row is reported against it.
    meta.update(mma_sync_e4m3_peak_tflops=169.0, mma_sync_e4m3_emulated=True)
    title, _ = _table_cells(bench.results_table(rows[:1], meta))
    assert "e4m3 169 (emulated: conversions + f16 MMAs, not the fp8 rows' roof)" in title
    assert "E4M3_PV" not in title
    # A run with the e4m3 P V option says so in its title (and its JSON's meta).
    meta.update(e4m3_pv=True)
    assert bench.results_table(rows[:1], meta).title.endswith("SPARSE_MLA_E4M3_PV=1 (fp8_ds_mla's P V on e4m3 MMAs)")


def test_bench_table_reads_a_bench_json_from_before_the_e4m3_peak():
    """Older files have no mma_sync_e4m3_peak_tflops, and rows without e4m3_frac (or peer fields)."""
    from pathlib import Path

    from vllm_sparse_mla_blackwell import bench

    path = Path(__file__).parents[1] / "bench/results/2026-11-29-h200-v1/bench.json"
    data = json.loads(path.read_text())
    assert "mma_sync_e4m3_peak_tflops" not in data["meta"] and "e4m3_frac" not in data["rows"][0]
    rows = [bench.Row(**r) for r in data["rows"]]
    title, cells = _table_cells(bench.results_table(rows, data["meta"]))
    assert "2026-11-29; measured mma.sync peaks, TFLOP/s: bf16 645, fp16 not measured, e4m3 not measured" in title
    header = cells[0]
    assert len(cells) == 1 + len(rows) == 148
    assert {c[header.index("% e4m3 mma")] for c in cells[1:]} == {""}
    assert {c[header.index("% bf16 mma")] for c in cells[1:]} != {""}


def test_case_inputs_are_the_same_in_every_process(same_package_env):
    """A case draws the same inputs whatever the process's str-hash salt (so a failing verify
    case can be re-run), and a different Case.seed draws different ones."""
    case = cases.Case(head_size=512, num_heads=2, topk=64, num_tokens=2, masking="random")
    script = ("from vllm_sparse_mla_blackwell import cases; from vllm_sparse_mla_blackwell.cases import Case;"
              f"c = {case!r}; i = cases.make_inputs(c, 'cpu');"
              "print(cases.case_seed(c), float(i.q.double().sum()), int(i.indices.long().sum()))")
    outs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env=same_package_env(PYTHONHASHSEED=salt)).stdout.strip()
            for salt in ("1", "2")}
    assert len(outs) == 1
    here = cases.make_inputs(case, "cpu")
    seed, q_sum, idx_sum = outs.pop().split()
    assert int(seed) == cases.case_seed(case)
    assert float(q_sum) == float(here.q.double().sum()) and int(idx_sum) == int(here.indices.long().sum())
    other = cases.make_inputs(dataclasses.replace(case, seed=1), "cpu")
    assert not torch.equal(other.q, here.q)
