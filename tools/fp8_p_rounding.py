#!/usr/bin/env python3
"""Host emulation of how the kernel's rounding of P bounds the accuracy of the fp8 formats (CPU only).

The kernel rounds P for the P V MMAs (kernel_traits.h precision plan). fp8_e4m3 rounds p itself
to fp16, so a row's largest p (1) is exact; fp8_ds_mla folds each key's scale of the warp's 128
columns, divided by the tile's power-of-two norm, into P, so every P, the dominant ones included,
carries the rounding error, and since v15 the kernel carries that P as fp16 hi + lo (two MMAs
per P V step, as the bf16 cache does in bf16). This script emulates that arithmetic in float64
(S, a softmax against each row's global max rather than the kernel's running max, and the
norms; only P rounded, per 32-key tile and column tile as the kernel does, but not the fp32
roundings of exp2 and of p * scale, so its hi + lo figure is close to exact by construction) on
a verify case and prints the per-row minimum cosine against the fp32 reference rounded to out's
dtype, verify's metric, with P exact, in one fp16 part, and as fp16 hi + lo:

    python tools/fp8_p_rounding.py [--num-heads 32] [--topk 128] [--num-tokens 272]

On the default case (DeepSeek-V3.2's D = 576, 32 heads, topk 128, 272 tokens: few keys dominate
each row, and thousands of rows) it printed fp8_ds_mla 0.9999997 / 0.9999979 / 0.9999997 and
fp8_e4m3 0.9999995 / 0.9999988 / 0.9999995 (exact / fp16 / hi + lo). The H200 measured
0.9999979 for fp8_ds_mla with one fp16 part (bench/HISTORY.md v14), so the kernel added nothing
beyond this rounding; with hi + lo the format passes every bar at small topk (v15).
"""

from __future__ import annotations

import argparse

import torch

from vllm_sparse_mla_blackwell import cases, formats, reference

BLOCK_N = 32  # keys per tile (kernel_traits.h kBlockN): fp8_ds_mla's norms are per tile


P_MODES = ("exact", "fp16", "fp16 hi + lo")


def emulated_out(case: cases.Case, inputs: cases.CaseInputs, p_mode: str) -> torch.Tensor:
    """out [T, H, 512] in q's dtype as the kernel computes it, P exact, rounded to fp16, or
    carried as fp16 hi + lo (P_MODES)."""
    idx = inputs.indices[:, : case.topk].long()
    q = inputs.q.double()
    kv = inputs.kv_rows.double()[idx]  # [T, topk, D] dequantised
    s = torch.einsum("thd,tkd->thk", q, kv) * case.sm_scale
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l = p.sum(-1, keepdim=True)

    def rounded(x: torch.Tensor) -> torch.Tensor:
        if p_mode == "exact":
            return x
        hi = x.float().half().double()
        return hi if p_mode == "fp16" else hi + (x - hi).float().half().double()

    if inputs.kv_cache_dtype == "fp8_e4m3":
        out = torch.einsum("thk,tkc->thc", rounded(p), kv[..., : formats.HEAD_SIZE_V])
    else:  # fp8_ds_mla: P' = p * scale / norm against the raw e4m3 values, times norm after
        raw = reference._cache_rows(inputs.kv_cache).view(torch.uint8)[idx]
        v_raw = raw[..., : formats.KV_LORA_RANK].contiguous().view(torch.float8_e4m3fn).double()
        scales = raw[..., formats.FP8_DS_MLA_SCALE_OFFSET : formats.FP8_DS_MLA_ROPE_OFFSET]
        scales = scales.contiguous().view(torch.float32).double()  # [T, topk, 4]
        out = torch.zeros(*q.shape[:2], formats.HEAD_SIZE_V, dtype=torch.float64)
        for k0 in range(0, case.topk, BLOCK_N):
            keys = slice(k0, k0 + BLOCK_N)
            for w in range(formats.KV_LORA_RANK // formats.FP8_DS_MLA_TILE):
                cols = slice(w * formats.FP8_DS_MLA_TILE, (w + 1) * formats.FP8_DS_MLA_TILE)
                sc = scales[:, keys, w]
                norm = torch.exp2(torch.floor(torch.log2(sc.amax(-1, keepdim=True))))
                p_scaled = rounded(p[:, :, keys] * (sc / norm)[:, None, :])
                out[..., cols] += torch.einsum("thk,tkc->thc", p_scaled, v_raw[:, keys, cols]) * norm[:, None, :]
    return (out / l).to(inputs.q.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-heads", type=int, default=32)
    ap.add_argument("--topk", type=int, default=128)
    ap.add_argument("--num-tokens", type=int, default=272)
    args = ap.parse_args()
    for kv_cache_dtype in ("fp8_ds_mla", "fp8_e4m3"):
        case = cases.Case(head_size=576, num_heads=args.num_heads, topk=args.topk, num_tokens=args.num_tokens,
                          kv_cache_dtype=kv_cache_dtype, masking="none")
        inputs = cases.make_inputs(case, "cpu")
        ref, _ = reference.sparse_mla_reference(inputs.q, inputs.kv_rows, inputs.indices, case.sm_scale,
                                                topk=case.topk)
        ref_rounded = ref.to(inputs.q.dtype).double()
        cos = [torch.nn.functional.cosine_similarity(emulated_out(case, inputs, mode).double(), ref_rounded,
                                                     dim=-1).min().item() for mode in P_MODES]
        print(f"{case.label()}: min cosine vs rounded reference, P " +
              ", ".join(f"{mode} {c:.7f}" for mode, c in zip(P_MODES, cos)))


if __name__ == "__main__":
    main()
