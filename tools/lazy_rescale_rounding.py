"""Host emulation: what the FlashAttention-4 lazy rescale costs in accuracy with P rounded once.

The kernel's online softmax subtracts each row's running maximum, so the largest p of a row is
exactly 1 and rounding P to bf16 / fp16 leaves the dominant term exact. A lazy rescale (the
reference maximum moves only when a tile's maximum passes it by more than 8, in log2 units, as
in FlashAttention-4) lets p reach 2^8, and the dominant term is then rounded like any other.
This tool emulates, in float64 on the CPU, one pass over 32-key tiles with P rounded to the MMA
type, on inputs drawn like verify's (randn q and rows, the rows rounded to the cache type), and
prints the worst per-row relative error of the bf16 / fp16 output against the float64 softmax:
with the exact running maximum, with the lazy one, and with the lazy one normalised by the sum
of the rounded p (which cancels the dominant term's rounding but not lse's). verify's bar is
4e-3 (bench/NOTES.md, step B, for the figures).

    python tools/lazy_rescale_rounding.py [--seed 0] [--tokens 8] [--heads 16]
"""

from __future__ import annotations

import argparse
import math

import torch

TILE = 32
LAZY_THRESHOLD = 8.0  # log2 units: p <= 2^8


def worst_row_error(q, k, v, sm_scale, p_dtype, lazy, rounded_sum) -> float:
    """Worst per-row relative error of the emulated kernel against float64 attention.
    Shapes: q [T, H, D], k [T, N, D], v [T, N, 512]; float64 values exact in p_dtype."""
    s = torch.einsum("thd,tnd->thn", q, k) * (sm_scale / math.log(2))  # scores in log2 units
    ref = torch.softmax(s * math.log(2), dim=-1) @ v
    T, H, N = s.shape
    m = torch.full((T, H, 1), -math.inf, dtype=torch.float64)
    l = torch.zeros(T, H, 1, dtype=torch.float64)
    l_rounded = torch.zeros_like(l)
    o = torch.zeros(T, H, v.shape[-1], dtype=torch.float64)
    for j in range(0, N, TILE):
        x = s[..., j : j + TILE].float().double()  # the kernel's fp32 scores
        m_new = torch.maximum(m, x.amax(dim=-1, keepdim=True))
        m_ref = torch.where(m_new > m + LAZY_THRESHOLD, m_new, m) if lazy else m_new
        alpha = torch.exp2(m - m_ref)
        p = torch.exp2(x - m_ref)
        p_mma = p.to(p_dtype).double()
        l = l * alpha + p.sum(-1, keepdim=True)
        l_rounded = l_rounded * alpha + p_mma.sum(-1, keepdim=True)
        o = o * alpha + torch.einsum("thn,tnd->thd", p_mma, v[:, j : j + TILE])
        m = m_ref
    out = (o / (l_rounded if rounded_sum else l)).to(p_dtype).double()
    return float(((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    print("dtype     D  topk  sm_scale  exact max  lazy      lazy, rounded sum")
    for p_dtype in (torch.bfloat16, torch.float16):
        for head_size, topk, sm_scale in ((576, 2048, 0.135234), (512, 2176, 1 / 16), (576, 128, 0.135234)):
            q = torch.randn(args.tokens, args.heads, head_size, dtype=torch.float64).to(p_dtype).double()
            k = torch.randn(args.tokens, topk, head_size, dtype=torch.float64).to(p_dtype).double()
            v = k[..., :512]
            errs = [worst_row_error(q, k, v, sm_scale, p_dtype, lazy, rs)
                    for lazy, rs in ((False, False), (True, False), (True, True))]
            name = str(p_dtype).removeprefix("torch.")
            print(f"{name:8s} {head_size:4d} {topk:5d} {sm_scale:9.4f}  " + "  ".join(f"{e:.2e} " for e in errs))


if __name__ == "__main__":
    main()
