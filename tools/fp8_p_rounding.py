#!/usr/bin/env python3
"""Host emulation of how rounding P for the P V MMAs bounds the accuracy of the fp8 formats (CPU only).

fp8_e4m3 rounds p itself to fp16, so a row's largest p (1) is exact; fp8_ds_mla folds each key's
scale of the warp's 128 columns, divided by the tile's power-of-two norm, into P, so every P, the
dominant ones included, carries the rounding error. The kernel rounds P once (docs/design.md
"Precision"); from v15 to v23 it carried fp8_ds_mla's P as fp16 hi + lo, which a former verify
bar (cosine against the reference rounded to out's dtype) needed. This script emulates that
arithmetic in float64 (S, a softmax against each row's global max rather than the kernel's
running max, and the norms; only P rounded, per 32-key tile and column tile as the kernel does,
but not the fp32 roundings of exp2 and of p * scale) on a verify case and prints verify's metrics
(worst per-row relative error and cosine against the fp32 reference) with P exact, in one fp16
part, as fp16 hi + lo, and the same in e4m3 (the e4m3 residual at 16x the scale, or at the same
scale so that one accumulator takes both parts' MMAs; optionally with q in e4m3), so that an e4m3
MMA path can be judged before it is built:

    python tools/fp8_p_rounding.py [--num-heads 32] [--topk 128] [--num-tokens 272]

The default case is DeepSeek-V3.2's D = 576, 32 heads, topk 128, 272 tokens: few keys dominate
each row, and thousands of rows.
"""

from __future__ import annotations

import argparse

import torch

from vllm_sparse_mla_blackwell import cases, formats, reference

BLOCK_N = 32  # keys per tile (kernel_traits.h kBlockN): fp8_ds_mla's norms are per tile


P_MODES = ("exact", "fp16", "fp16 hi + lo", "e4m3", "e4m3 hi + lo", "e4m3 hi + lo, one acc")
# An e4m3 P is scaled by this before rounding (its values are below 2 here), so that it keeps
# clear of e4m3's subnormals (2^-6) and its largest finite value (448); the accumulator takes the
# inverse in fp32.
E4M3_P_SCALE = 128.0


def _e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x * scale).float().to(torch.float8_e4m3fn).double() / scale


def emulated_out(case: cases.Case, inputs: cases.CaseInputs, p_mode: str, q_e4m3: str = "") -> torch.Tensor:
    """out [T, H, 512] in q's dtype as the kernel computes it, P exact, rounded to fp16 or e4m3,
    or carried as a hi + lo pair of either (P_MODES); with ``q_e4m3`` "one" or "hi + lo", q in
    e4m3 with a scale per (token, head) (amax / 448), as an e4m3 MMA for S would take it, in one
    part or two (the residual scaled by 16 more)."""
    idx = inputs.indices[:, : case.topk].long()
    q = inputs.q.double()
    if q_e4m3:
        q_scale = q.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448.0
        hi = _e4m3(q / q_scale, 1.0) * q_scale
        q = hi if q_e4m3 == "one" else hi + _e4m3((q - hi) / q_scale, 16.0) * q_scale
    kv = inputs.kv_rows.double()[idx]  # [T, topk, D] dequantised
    s = torch.einsum("thd,tkd->thk", q, kv) * case.sm_scale
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l = p.sum(-1, keepdim=True)

    def rounded(x: torch.Tensor) -> torch.Tensor:
        if p_mode == "exact":
            return x
        if p_mode.startswith("e4m3"):
            # hi + lo: the residual at 16x hi's scale (its own accumulator, scaled back in fp32);
            # one acc: at hi's scale, so that both parts' MMAs add into the same accumulator.
            hi = _e4m3(x, E4M3_P_SCALE)
            if p_mode == "e4m3":
                return hi
            return hi + _e4m3(x - hi, E4M3_P_SCALE if p_mode.endswith("one acc") else 16 * E4M3_P_SCALE)
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
    ap.add_argument("--q-e4m3", choices=("one", "hi + lo"), default="",
                    help="q in e4m3 too (a scale per token and head), in one part or two")
    args = ap.parse_args()
    for kv_cache_dtype in ("fp8_ds_mla", "fp8_e4m3"):
        case = cases.Case(head_size=576, num_heads=args.num_heads, topk=args.topk, num_tokens=args.num_tokens,
                          kv_cache_dtype=kv_cache_dtype, masking="none")
        inputs = cases.make_inputs(case, "cpu")
        ref, _ = reference.sparse_mla_reference(inputs.q, inputs.kv_rows, inputs.indices, case.sm_scale,
                                                topk=case.topk)
        ref = ref.double()
        rel, cos = zip(*(cases.row_metrics(emulated_out(case, inputs, mode, args.q_e4m3).double(), ref)
                         for mode in P_MODES))
        print(f"{case.label()}{f' (q in e4m3, {args.q_e4m3})' if args.q_e4m3 else ''}: worst row vs the fp32 reference, P")
        for mode, r, c in zip(P_MODES, rel, cos):
            print(f"  {mode:22} rel {r:.2e}  cos {c:.7f}")


if __name__ == "__main__":
    main()
