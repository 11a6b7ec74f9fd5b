"""Inputs of the correctness case matrix: one function builds a paged, NaN-poisoned cache
and the index tensor for a case, so that ``verify`` and the GPU tests draw the same kind of data.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import torch

from vllm_sparse_mla_blackwell import envs, formats, reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SM_SCALES = (0.135234, 1.0 / 16)
INT32_MIN = -(2**31)


@dataclasses.dataclass(frozen=True)
class Case:
    """One point of the matrix. ``masking``: none | random | causal | all_masked | invalid | topk_len."""

    head_size: int = 576
    num_heads: int = 16
    topk: int = 2048
    num_tokens: int = 7
    q_dtype: str = "bf16"
    kv_cache_dtype: str = "bf16"
    masking: str = "none"
    block_size: int = 64
    layout: str = "contiguous"  # contiguous | strided | split_q (q as ql_nope + q_pe)
    sm_scale: float = SM_SCALES[0]
    index_width: int = 0  # indices buffer wider than topk when > topk (vLLM's 2176 buffers)
    seed: int = 0
    # > 0: 95 % of the cache rows scaled by 2^-row_spread, so KV tiles differ in magnitude by
    # that many octaves (fp8_ds_mla's per-tile P norms; small fp8_e4m3 values go to zero). Not
    # part of the seed: the same draws as row_spread=0, rescaled.
    row_spread: int = 0
    # != 0: every cache value times 2^value_scale_log2 and q times its inverse, so the scores are
    # those of value_scale_log2=0 and out is scaled by it: bf16 cache values past fp16's range or
    # in its subnormals, which the bf16 cache's MMAs must take as stored. Not part of the seed.
    value_scale_log2: int = 0
    # > 0: cache row r scaled by 1 + row_ramp * u_r (u_r uniform in [0, 1)) and each token's topk
    # slots sorted by u_r, so that the scores' running maximum rises from KV tile to KV tile: rows
    # whose maximum moves at different tiles, rows whose P grows far past 1 (the lazy rescale).
    # At most 16, which keeps fp8_e4m3 values in range. Not part of the seed: the same draws as
    # row_ramp=0, rescaled and reordered (masking, applied after the sort, then keeps other slots).
    row_ramp: float = 0.0
    # Heads per kernel block forced on the op (_testing.sparse_mla_fwd block_heads); None: planned.
    # Not part of the seed: the inputs of the planned launch.
    block_heads: int | None = None

    def label(self) -> str:
        return (f"D{self.head_size} H{self.num_heads} topk{self.topk} T{self.num_tokens} "
                f"{self.q_dtype}/{self.kv_cache_dtype} {self.masking} bs{self.block_size} "
                f"{self.layout} s{self.sm_scale:.4g}" + (f" spread2^-{self.row_spread}" if self.row_spread else "")
                + (f" values2^{self.value_scale_log2}" if self.value_scale_log2 else "")
                + (f" ramp{self.row_ramp:g}" if self.row_ramp else "")
                + (f" {self.block_heads}-head blocks" if self.block_heads else ""))


@dataclasses.dataclass
class CaseInputs:
    q: torch.Tensor          # [T, H, D] or ql_nope [T, H, 512] when q_pe is set
    q_pe: torch.Tensor | None
    kv_cache: torch.Tensor   # [num_blocks, block_size, W]
    kv_cache_dtype: str      # vLLM string passed to the op
    k_scale: torch.Tensor | None
    indices: torch.Tensor    # int32 [T, index_width]
    topk_len: torch.Tensor | None
    out: torch.Tensor        # NaN-poisoned output, possibly a strided view
    kv_rows: torch.Tensor    # fp32 dequantised rows [num_rows, D], NaN where unreferenced


def case_seed(case: Case) -> int:
    """The generator seed of a case's inputs: a CRC-32 of its repr without ``row_spread``,
    ``value_scale_log2``, ``row_ramp`` and ``block_heads`` (the dataclass repr of every other
    field, as before those existed), so the same case draws the same inputs in every process
    (Python's str hash is salted per process); ``Case.seed`` gives a fresh draw."""
    fields = ", ".join(f"{f.name}={getattr(case, f.name)!r}" for f in dataclasses.fields(case)
                       if f.name not in ("row_spread", "value_scale_log2", "row_ramp", "block_heads"))
    return zlib.crc32(f"{type(case).__qualname__}({fields})".encode()) & 0x7FFFFFFF


def make_inputs(case: Case, device: torch.device | str) -> CaseInputs:
    """Random inputs for a case (drawn from ``case_seed``): shuffled block table, unreferenced
    cache rows set to NaN (bytes 0xFF for fp8), output poisoned with NaN. Raises ValueError for
    ``value_scale_log2`` with anything but a bf16 cache and bf16 q, and for ``row_ramp`` outside
    [0, 16]."""
    if case.value_scale_log2 and (case.kv_cache_dtype != "bf16" or case.q_dtype != "bf16"):
        # An fp16 cache or q would overflow, and quantising a scaled cache changes the scores.
        raise ValueError(f"value_scale_log2 needs a bf16 cache and bf16 q, got {case.kv_cache_dtype} / {case.q_dtype}")
    if not 0 <= case.row_ramp <= 16:
        # Row scales up to 17 x randn's ~5.5 / k_scale's 0.5: ~190, inside e4m3's 448.
        raise ValueError(f"row_ramp must be in [0, 16], got {case.row_ramp}")
    gen = torch.Generator(device="cpu").manual_seed(case_seed(case))
    T, H, D, topk = case.num_tokens, case.num_heads, case.head_size, case.topk
    width = max(case.index_width, topk)
    dtype = DTYPES[case.q_dtype]
    # Logical context per token, longer than topk so that every token picks a strict subset.
    context = max(2 * topk, 64)
    bs = case.block_size
    num_blocks = math.ceil(context / bs) + 8  # spare blocks stay unreferenced (NaN)
    num_rows = num_blocks * bs
    block_table = torch.randperm(num_blocks, generator=gen)[: math.ceil(context / bs)]

    # Distinct logical positions per token, mapped through the block table to physical rows.
    logical = torch.argsort(torch.rand(T, context, generator=gen), dim=1)[:, :topk]
    physical = (block_table[logical // bs] * bs + logical % bs).to(torch.int32)
    indices = torch.full((T, width), -1, dtype=torch.int32)
    indices[:, :topk] = physical
    ramp = None
    if case.row_ramp:
        ramp_gen = torch.Generator(device="cpu").manual_seed(case_seed(case) + 2)  # the draws above unchanged
        ramp = torch.rand(num_rows, generator=ramp_gen)
        order = torch.argsort(ramp[physical.long()], dim=1)
        indices[:, :topk] = torch.gather(physical, 1, order)
    topk_len = None
    if case.masking == "random":
        indices[:, :topk][torch.rand(T, topk, generator=gen) < 0.3] = -1
    elif case.masking == "causal":
        # Token t sees the first t+1 slots (a causal prefix of the sequence), at most topk.
        lengths = torch.arange(1, T + 1).clamp(max=topk)
        indices[torch.arange(width)[None, :] >= lengths[:, None]] = -1
    elif case.masking == "all_masked":
        indices[::2] = -1  # every other token has no valid slot at all
    elif case.masking == "invalid":
        r = torch.rand(T, topk, generator=gen)
        sl = indices[:, :topk]
        sl[r < 0.1] = -1
        sl[(r >= 0.1) & (r < 0.2)] = INT32_MIN
        sl[(r >= 0.2) & (r < 0.3)] = num_rows
        sl[(r >= 0.3) & (r < 0.35)] = 2**31 - 1
        indices[T // 2] = INT32_MIN  # one token entirely invalid
    elif case.masking == "topk_len":
        topk_len = torch.randint(0, topk + 1, (T,), generator=gen, dtype=torch.int32)
    # Columns past topk (a wider buffer) hold real-looking rows: the kernel must ignore them.
    if width > topk:
        indices[:, topk:] = torch.randint(0, num_rows, (T, width - topk), generator=gen, dtype=torch.int32)

    # Cache: random rows, then NaN in every row no valid index refers to.
    kv_c = torch.randn(num_rows, formats.KV_LORA_RANK, generator=gen)
    k_pe = torch.randn(num_rows, D - formats.KV_LORA_RANK, generator=gen) if D > formats.KV_LORA_RANK else None
    value_scale = 2.0**case.value_scale_log2
    factor = torch.full((num_rows, 1), value_scale)
    if case.row_spread:
        spread_gen = torch.Generator(device="cpu").manual_seed(case_seed(case) + 1)  # the draws above unchanged
        small = torch.rand(num_rows, generator=spread_gen) >= 0.05
        factor[small] *= 2.0**-case.row_spread
    if ramp is not None:
        factor *= 1.0 + case.row_ramp * ramp[:, None]
    kv_c = kv_c * factor  # exact for row_spread's and value_scale_log2's powers of two
    k_pe = None if k_pe is None else k_pe * factor
    valid = reference.valid_index_mask(indices, num_rows, topk, topk_len)
    referenced = torch.zeros(num_rows, dtype=torch.bool)
    referenced[indices[:, :topk][valid].long()] = True

    kv_op = formats.KV_CACHE_DTYPES[case.kv_cache_dtype]
    k_scale = None
    if kv_op in ("bfloat16", "float16"):
        cache_dtype = DTYPES[case.kv_cache_dtype]
        rows = torch.cat([kv_c, k_pe], dim=1) if k_pe is not None else kv_c
        rows = rows.to(cache_dtype)
        rows[~referenced] = float("nan")
        kv_cache = rows.view(num_blocks, bs, D)
    else:
        width_bytes = formats.kv_row_bytes(kv_op, D)
        kv_cache = torch.zeros(num_rows, width_bytes, dtype=torch.uint8)
        if kv_op == "fp8_e4m3":
            k_scale = torch.tensor([0.5 + torch.rand(1, generator=gen).item()], dtype=torch.float32)
        slots = torch.arange(num_rows, dtype=torch.int64)
        reference.write_kv_cache_reference(
            kv_c.to(dtype), None if k_pe is None else k_pe.to(dtype), kv_cache, slots, kv_op, k_scale
        )
        kv_cache[~referenced] = 0xFF  # e4m3 NaN bytes (and NaN scales for fp8_ds_mla)
        kv_cache = kv_cache.view(num_blocks, bs, width_bytes)

    q = (torch.randn(T, H, D, generator=gen) / value_scale).to(dtype)
    out_shape = (T, H, formats.HEAD_SIZE_V)
    if case.layout == "strided":
        # q and out are views into larger buffers: token and head strides differ from dense.
        q = (torch.randn(T, H + 3, D + 64, generator=gen) / value_scale).to(dtype)[:, 1 : H + 1, :D]
        out = torch.full((T, H + 2, formats.HEAD_SIZE_V + 128), float("nan"), dtype=dtype)[:, :H, 64 : 64 + 512]
    else:
        out = torch.full(out_shape, float("nan"), dtype=dtype)

    device = torch.device(device)
    kv_cache = kv_cache.to(device)
    kv_rows = reference.dequantize_kv_cache(kv_cache, kv_op, D, None if k_scale is None else k_scale.to(device))
    q_pe = None
    q = q.to(device)
    if case.layout == "split_q" and D > formats.KV_LORA_RANK:
        q_pe = q[..., formats.KV_LORA_RANK :]  # vLLM passes ql_nope and q_pe separately
        q = q[..., : formats.KV_LORA_RANK]
    return CaseInputs(
        q=q,
        q_pe=q_pe,
        kv_cache=kv_cache,
        kv_cache_dtype=kv_op,
        k_scale=None if k_scale is None else k_scale.to(device),
        indices=indices.to(device),
        topk_len=None if topk_len is None else topk_len.to(device),
        out=_strided_to(out, device),
        kv_rows=kv_rows,
    )


def _strided_to(view: torch.Tensor, device) -> torch.Tensor:
    # Move the base buffer so the view keeps its strides on the device.
    base = view._base if view._base is not None else view
    moved = base.to(device)
    return moved.as_strided(view.shape, view.stride(), view.storage_offset())


@dataclasses.dataclass
class CaseResult:
    case: Case
    max_rel_err: float      # per-row |out - ref| / |ref| against the fp32 reference, worst row
    min_cosine: float       # per-row cosine against the fp32 reference, worst row
    max_lse_err: float
    masked_exact: bool
    all_written: bool
    passed: bool
    note: str = ""


# verify's bars for every kv cache dtype (fp8 against the dequantised cache), per output row
# against the fp32 reference itself. out's own rounding is part of the error: bf16's unit
# roundoff 2^-8 alone gives per-row relative errors up to ~3.9e-3 on this matrix. Where out and
# the MMAs are fp16 (fp16 q with any cache but bf16) the error is ~5x smaller (<= 5.3e-4 on the
# H200, the most in 32-head blocks, where the lazy rescale lets p reach 2^8 or fp8_ds_mla's P is
# rounded twice), and a bar of its size keeps a regression there visible. The cosine bar follows
# from the relative one (cosine >= sqrt(1 - rel^2)); it is checked and reported all the same.
MAX_REL_ERR = 4e-3
MAX_REL_ERR_FP16 = 1e-3
MIN_COSINE = 0.99999
MAX_LSE_ERR = 1e-3


def max_rel_err(case: Case) -> float:
    """The relative-error bar of ``case``: MAX_REL_ERR_FP16 where out and the MMAs are fp16,
    else MAX_REL_ERR. With the e4m3 P V option set (``envs.E4M3_PV_ENV``), fp8_ds_mla's P V MMAs
    are e4m3, so its cases take MAX_REL_ERR."""
    if case.kv_cache_dtype == "fp8_ds_mla" and envs.flag(envs.E4M3_PV_ENV):
        return MAX_REL_ERR
    return MAX_REL_ERR_FP16 if case.q_dtype == "fp16" and case.kv_cache_dtype != "bf16" else MAX_REL_ERR


def row_metrics(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Worst per-row relative error ``|out - ref| / |ref|`` and worst per-row cosine of two
    ``[..., N]`` float tensors (rows along the last dim)."""
    diff = (out - ref).norm(dim=-1)
    rel = float((diff / ref.norm(dim=-1).clamp_min(1e-30)).max())
    cos = float(torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=-1).min())
    return rel, cos


def compare(case: Case, inputs: CaseInputs, out: torch.Tensor, lse: torch.Tensor) -> CaseResult:
    """Compare a kernel result with the fp32 reference on the same inputs (verify's metrics).

    Per live output row: relative error ``|out - ref| / |ref|`` and cosine against the fp32
    reference; per live (token, head): absolute lse error. Rows with no valid slot must be exactly
    ``out = 0``, ``lse = -inf``. The bars are ``max_rel_err(case)``, MIN_COSINE and MAX_LSE_ERR.

    Shapes: ``out [T, H, 512]`` in q's dtype, ``lse [T, H]`` fp32, both from the op (any device).
    """
    ref_out, ref_lse = reference.sparse_mla_reference(
        inputs.q, inputs.kv_rows, inputs.indices, case.sm_scale, topk=case.topk,
        topk_len=inputs.topk_len, q_pe=inputs.q_pe,
    )
    all_written = bool(torch.isfinite(out).all()) and not bool(torch.isnan(lse).any())
    out = out.float()
    empty = torch.isinf(ref_lse) & (ref_lse < 0)  # [T, H] rows with no valid slot
    masked_exact = bool((out[empty] == 0).all()) and bool((lse[empty] == float("-inf")).all())
    live = ~empty
    rel = lse_err = 0.0
    cos = 1.0
    if live.any():
        rel, cos = row_metrics(out[live], ref_out[live])
        lse_err = float((lse[live] - ref_lse[live]).abs().max())
    if not all_written:
        rel = cos = float("nan")
    passed = (all_written and masked_exact and rel <= max_rel_err(case) and cos >= MIN_COSINE
              and lse_err <= MAX_LSE_ERR)
    return CaseResult(case, rel, cos, lse_err, masked_exact, all_written, passed)
