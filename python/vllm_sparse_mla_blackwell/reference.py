"""fp32 reference of the sparse-MLA forward and of the cache formats.

The same functions serve the tests, ``verify``, and the op's CPU implementation. They are plain
PyTorch, chosen for clarity over speed; the query-token axis is processed in chunks so that the
gathered ``[chunk, topk, head_size]`` fp32 block stays within a fixed memory budget.
"""

from __future__ import annotations

import contextlib

import torch

from vllm_sparse_mla_blackwell import formats


@contextlib.contextmanager
def _exact_fp32_matmul():
    # TF32 would make the "fp32" reference a 10-bit-mantissa one on Ampere and later.
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def valid_index_mask(
    indices: torch.Tensor, num_kv_rows: int, topk: int, topk_len: torch.Tensor | None = None
) -> torch.Tensor:
    """``valid(t, j)`` as a bool tensor ``[T, topk]``.

    A slot is valid when ``0 <= indices[t, j] < num_kv_rows`` and, if ``topk_len`` is given,
    ``j < topk_len[t]``. ``indices`` is int32 ``[T, >= topk]``; only its first ``topk`` columns count.
    """
    idx = indices[:, :topk].long()
    valid = (idx >= 0) & (idx < num_kv_rows)
    if topk_len is not None:
        j = torch.arange(topk, device=indices.device)
        valid &= j[None, :] < topk_len.to(indices.device).long()[:, None]
    return valid


def sparse_mla_reference(
    q: torch.Tensor,
    kv_rows: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    topk: int | None = None,
    topk_len: torch.Tensor | None = None,
    q_pe: torch.Tensor | None = None,
    max_gather_bytes: int = 1 << 29,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 sparse-MLA forward over a dequantised cache.

    Args:
        q: ``[T, H, D]`` (any float dtype), or the latent part ``[T, H, 512]`` when ``q_pe`` is given.
        kv_rows: ``[num_kv_rows, >= D]`` dequantised cache rows (fp32 or any float dtype);
            ``K = row[:D]``, ``V = row[:512]``. Rows no valid index refers to are never read
            (they may hold NaN).
        indices: int32 ``[T, >= topk]`` physical row ids; invalid values are masked.
        sm_scale: softmax scale applied to ``q·k`` (a float, not derived from D).
        topk: slots used per token, default ``indices.shape[1]``.
        topk_len: optional int32 ``[T]``; slots ``j >= topk_len[t]`` are masked.
        q_pe: optional rope part ``[T, H, R]`` appended to ``q``.
        max_gather_bytes: bytes of fp32 gathered rows held at once; tokens are processed in
            chunks that fit (memory bound for long prefills, not a result change).

    Returns:
        ``(out, lse)``: fp32 ``[T, H, 512]`` and fp32 ``[T, H]`` (natural log). A token with no
        valid slot gives ``out = 0`` and ``lse = -inf``.
    """
    if q_pe is not None:
        q = torch.cat([q, q_pe], dim=-1)
    num_tokens, num_heads, head_size = q.shape
    topk = indices.shape[1] if topk is None else topk
    num_kv_rows = kv_rows.shape[0]
    device = q.device
    out = torch.zeros(num_tokens, num_heads, formats.HEAD_SIZE_V, dtype=torch.float32, device=device)
    lse = torch.full((num_tokens, num_heads), float("-inf"), dtype=torch.float32, device=device)
    if num_tokens == 0 or num_kv_rows == 0:  # nothing valid: out = 0, lse = -inf
        return out, lse
    valid = valid_index_mask(indices, num_kv_rows, topk, topk_len)
    chunk = max(1, max_gather_bytes // max(1, topk * head_size * 4))
    with _exact_fp32_matmul():
        for t0 in range(0, num_tokens, chunk):
            t1 = min(num_tokens, t0 + chunk)
            v = valid[t0:t1]
            safe_idx = torch.where(v, indices[t0:t1, :topk].long(), 0)
            rows = kv_rows[safe_idx.flatten(), :head_size].float().view(t1 - t0, topk, head_size)
            # Masked slots must not contribute even if the row they point at holds NaN.
            rows = torch.where(v[..., None], rows, 0.0)
            scores = torch.einsum("thd,tjd->thj", q[t0:t1].float(), rows) * sm_scale
            scores = scores.masked_fill(~v[:, None, :], float("-inf"))
            chunk_lse = torch.logsumexp(scores, dim=-1)
            has_valid = v.any(dim=-1)[:, None]
            probs = torch.where(
                has_valid[..., None], torch.exp(scores - chunk_lse[..., None]), 0.0
            )
            out[t0:t1] = torch.einsum("thj,tjd->thd", probs, rows[..., : formats.HEAD_SIZE_V])
            lse[t0:t1] = torch.where(has_valid, chunk_lse, float("-inf"))
    return out, lse


def _cache_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """View a ``[num_blocks, block_size, W]`` or ``[num_rows, W]`` cache as ``[num_rows, W]``."""
    return kv_cache.reshape(-1, kv_cache.shape[-1])


def dequantize_kv_cache(
    kv_cache: torch.Tensor,
    kv_cache_dtype: str,
    head_size: int,
    k_scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Decode every cache row to fp32 ``[num_rows, head_size]``.

    Args:
        kv_cache: ``[num_blocks, block_size, W]`` or ``[num_rows, W]``: bf16/fp16 rows of ``W =
            head_size``; e4m3 rows (uint8 or float8_e4m3fn) of ``W = head_size`` bytes; or the
            656-byte ``fp8_ds_mla`` record (uint8).
        kv_cache_dtype: a vLLM ``kv_cache_dtype`` string (see ``formats.KV_CACHE_DTYPES``).
        head_size: 512 or 576. For ``fp8_ds_mla`` with 512 the rope bytes are ignored.
        k_scale: per-tensor scale of ``fp8``/``fp8_e4m3`` caches (vLLM's ``k_scale``), default 1.

    Raises:
        ValueError: unknown ``kv_cache_dtype`` or a row width that does not match it.
    """
    fmt = formats.canonical_kv_cache_dtype(kv_cache_dtype, kv_cache)
    rows = _cache_rows(kv_cache)
    width = formats.kv_row_bytes(fmt, head_size) // (2 if fmt in ("bfloat16", "float16") else 1)
    if rows.shape[-1] != width:
        raise ValueError(
            f"kv_cache last dim must be {width} for {fmt} with head_size {head_size}, "
            f"got {rows.shape[-1]}"
        )
    if fmt in ("bfloat16", "float16"):
        return rows.float()
    raw = rows.view(torch.uint8)
    if fmt == "fp8_e4m3":
        scale = 1.0 if k_scale is None else k_scale
        scale = scale.float().reshape(()) if isinstance(scale, torch.Tensor) else float(scale)
        return raw.view(torch.float8_e4m3fn).float() * scale
    # fp8_ds_mla
    latent = raw[:, : formats.KV_LORA_RANK].contiguous().view(torch.float8_e4m3fn).float()
    scales = (
        raw[:, formats.FP8_DS_MLA_SCALE_OFFSET : formats.FP8_DS_MLA_ROPE_OFFSET]
        .contiguous()
        .view(torch.float32)
    )
    latent = (latent.view(-1, 4, formats.FP8_DS_MLA_TILE) * scales[..., None]).view(-1, formats.KV_LORA_RANK)
    if head_size == formats.KV_LORA_RANK:
        return latent
    rope = raw[:, formats.FP8_DS_MLA_ROPE_OFFSET :].contiguous().view(torch.bfloat16).float()
    return torch.cat([latent, rope], dim=-1)


def _e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) as e4m3 bytes the way CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE,
    __NV_E4M3)`` rounds them: saturated to +-448 (infinities too), NaN as the canonical 0x7f
    whatever its sign."""
    q8 = x.clamp(-formats.FP8_E4M3_MAX, formats.FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return q8.masked_fill(x.isnan(), 0x7F)


def quantize_fp8_ds_mla(kv_c: torch.Tensor, k_pe: torch.Tensor | None) -> torch.Tensor:
    """Encode tokens as vLLM's 656-byte ``fp8_ds_mla`` records, uint8 ``[T, 656]``.

    Scales are computed as vLLM's ``concat_and_cache_ds_mla`` does (csrc/cache_kernels.cu): per
    128-value tile ``scale = max(amax / 448, FLT_MIN)``, values ``e4m3(x / scale)`` saturated. This
    keeps caches written by vLLM and by this package byte-compatible. ``k_pe`` (bf16 ``[T, 64]``)
    fills the rope bytes; ``None`` (NoPE) writes them as zeros.

    Non-finite values as that kernel's ``fmaxf`` and conversion treat them: amax skips NaN, so a
    NaN becomes the byte 0x7f beside a finite scale; an infinity makes the tile's scale infinite,
    itself 0x7f and the tile's finite values (+-)0.
    """
    num_tokens = kv_c.shape[0]
    tiles = kv_c.float().view(num_tokens, 4, formats.FP8_DS_MLA_TILE)
    # A tensor divisor: torch turns division by a Python scalar into a multiplication by its
    # reciprocal, which is not the IEEE division vLLM's kernel (and ours) performs.
    amax = tiles.abs().nan_to_num(nan=0.0, posinf=torch.inf).amax(dim=-1)
    scales = (amax / torch.full_like(amax, formats.FP8_E4M3_MAX)).clamp_min(torch.finfo(torch.float32).tiny)
    record = torch.zeros(num_tokens, formats.FP8_DS_MLA_RECORD_BYTES, dtype=torch.uint8, device=kv_c.device)
    record[:, : formats.KV_LORA_RANK] = _e4m3_bytes(tiles / scales[..., None]).reshape(num_tokens, formats.KV_LORA_RANK)
    record[:, formats.FP8_DS_MLA_SCALE_OFFSET : formats.FP8_DS_MLA_ROPE_OFFSET] = scales.contiguous().view(
        torch.uint8
    )
    if k_pe is not None:
        record[:, formats.FP8_DS_MLA_ROPE_OFFSET :] = k_pe.to(torch.bfloat16).contiguous().view(torch.uint8)
    return record


def write_kv_cache_reference(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | float | None = None,
) -> None:
    """Write tokens into the cache in place, with vLLM's ``concat_and_cache_mla`` slot convention.

    Args:
        kv_c: ``[T, 512]`` latent (bf16/fp16/fp32).
        k_pe: ``[T, R]`` rope part (R = 64), or ``None`` for NoPE (head_size 512).
        kv_cache: ``[num_blocks, block_size, W]`` (any block stride of at least ``block_size``
            rows) or ``[num_rows, W]``; see ``dequantize_kv_cache`` for ``W``.
        slot_mapping: int ``[T]`` slot per token (row ``s % block_size`` of block
            ``s // block_size``); ``-1`` (or any slot outside the cache) skips the token.
        kv_cache_dtype: vLLM ``kv_cache_dtype`` string.
        k_scale: per-tensor scale of ``fp8``/``fp8_e4m3`` (values are stored as ``x / k_scale``).
    """
    fmt = formats.canonical_kv_cache_dtype(kv_cache_dtype, kv_cache)
    # Address rows as (block, offset), so that block-outer views (block stride larger than
    # block_size rows) are written in place, as vLLM's kernel does.
    blocks = kv_cache if kv_cache.dim() == 3 else kv_cache.unsqueeze(0)
    block_size = blocks.shape[1]
    keep = (slot_mapping >= 0) & (slot_mapping < blocks.shape[0] * block_size)
    slots = slot_mapping[keep].long()
    where = (slots // block_size, slots % block_size)
    kv_c = kv_c[keep]
    k_pe = None if k_pe is None else k_pe[keep]
    if fmt == "fp8_ds_mla":
        blocks.view(torch.uint8)[where] = quantize_fp8_ds_mla(kv_c, k_pe)
        return
    full = kv_c if k_pe is None else torch.cat([kv_c, k_pe.to(kv_c.dtype)], dim=-1)
    if fmt in ("bfloat16", "float16"):
        blocks[where] = full.to(blocks.dtype)
        return
    scale = torch.as_tensor(1.0 if k_scale is None else k_scale, dtype=torch.float32, device=full.device)
    blocks.view(torch.uint8)[where] = _e4m3_bytes(full.float() / scale.reshape(1, 1).expand_as(full))
