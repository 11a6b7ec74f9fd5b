"""Shared-memory roofline of the kernel's warp tiling: bytes read from and written to shared memory
per m16n8k16 MMA, per KV tile, against what an SM's shared memory (128 B/clock on sm_80-sm_121)
can serve at the mma.sync rate. A paper model: it counts every ldmatrix / ld.shared / st.shared
/ cp.async byte of one tile, not bank conflicts or latency; bench/NOTES.md uses its table.

    python tools/smem_roofline.py

Tilings (per block of H heads, 32 KV rows per tile, D = 512 + R, V = the first 512 columns):
  main      : 4 warps per 16 heads; in S each warp covers 16 heads x a quarter of D (q in
              registers) and writes fp32 partial scores, which the softmax sums; in P V each warp
              covers 16 heads x 128 columns (P from shared memory).
  wide      : the WideWarps family (sparse_mla_fwd_wide.cuh), 8 warps per 32 heads; in S each
              warp covers 32 heads x a quarter of D x half the tile's rows (72 registers of q), in
              P V 32 heads x 64 columns: every K/V fragment feeds two m16 tiles, with the main
              tiling's partial scores.
  wide-m    : 8 warps per 32 heads; each warp 32 heads x an eighth of D in S and 32 heads x 64
              columns in P V: every K/V fragment feeds two m16 tiles, at the main tiling's
              registers (36 for q, 64 accumulators), but twice the partial scores.
"""

from __future__ import annotations

from dataclasses import dataclass

SMEM_BYTES_PER_CLOCK = 128  # 32 banks x 4 bytes, per SM
MMA_FLOP = 2 * 16 * 8 * 16
ROWS = 32  # KV rows per tile


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    clock_ghz: float
    mma_tflops: float  # mma.sync bf16 -> fp32, dense

    @property
    def mmas_per_clock(self) -> float:  # per SM
        return self.mma_tflops * 1e12 / MMA_FLOP / (self.sms * self.clock_ghz * 1e9)


GPUS = (
    Gpu("H200 (measured 648 TFLOP/s)", 132, 1.98, 648.0),
    Gpu("RTX PRO 6000 (datasheet, full-rate fp32 accumulate)", 188, 2.6, 250.0),
    Gpu("RTX 5090 (datasheet, half-rate fp32 accumulate)", 170, 2.41, 105.0),
)


def tile_bytes_per_mma(tiling: str, heads: int, head_size: int, cache_bytes: int, copy_row_bytes: int) -> dict:
    """Shared-memory bytes per MMA of one tile of a block of ``heads`` heads, by kind of traffic.
    ``cache_bytes``: bytes per cached value as the MMAs' B fragments read it (2, or 1 for raw fp8
    tiles); ``copy_row_bytes``: bytes of one row the gather writes into shared memory."""
    s_mmas = heads // 16 * (ROWS // 8) * (head_size // 16)
    pv_mmas = heads // 16 * (512 // 8) * (ROWS // 16)
    groups = heads // 16  # m16 tiles of heads
    d_splits = 8 if tiling == "wide-m" else 4  # warps that share one head tile's S over D
    m_tiles_per_warp = 1 if tiling == "main" else 2
    # A K or V value is read once per warp that needs it, for all the m16 tiles that warp covers;
    # each warp reads the P of its m16 tiles whole; the partial scores are written by every
    # D-split warp and read back by the softmax.
    reads = groups // m_tiles_per_warp
    parts = {
        "gather (cp.async writes)": ROWS * copy_row_bytes,
        "K fragments (S)": reads * ROWS * head_size * cache_bytes,
        "V fragments (P V)": reads * ROWS * 512 * cache_bytes,
        "P (write + ldmatrix)": groups * 16 * ROWS * 2 * (1 + 4 * m_tiles_per_warp),
        "partial scores (write + read)": 2 * heads * ROWS * 4 * d_splits,
    }
    mmas = s_mmas + pv_mmas
    out = {k: v / mmas for k, v in parts.items()}
    out["total"] = sum(parts.values()) / mmas
    # What it occupies: two stages of rows padded by 16 B (and a valid flag each), fp32 partial
    # scores and the P buffers of pitch 40, the softmax statistics.
    out["smem bytes (two stages)"] = (2 * ROWS * (copy_row_bytes + 16 + 4) + heads * 40 * 4 * d_splits
                                      + groups * 16 * 40 * 2 + 2 * heads * 4)
    return out


def main() -> None:
    configs = [
        ("main", 16, "bf16 / fp16", 2, 2 * 576), ("main", 32, "bf16 / fp16", 2, 2 * 576),
        ("main", 32, "fp8_e4m3 raw", 1, 576), ("main", 32, "fp8_ds_mla raw", 1, 656),
        ("wide", 32, "bf16 / fp16", 2, 2 * 576),
        ("wide-m", 32, "bf16 / fp16", 2, 2 * 576), ("wide-m", 64, "bf16 / fp16", 2, 2 * 576),
        ("wide-m", 32, "fp8_e4m3 raw", 1, 576), ("wide-m", 32, "fp8_ds_mla raw", 1, 656),
    ]
    print("D = 576. B/MMA: shared-memory bytes per m16n8k16 MMA; per GPU: the fraction of the mma.sync")
    print("peak that 128 B/clock allows (1.00 = not shared-memory bound); KB: the block's shared memory")
    print("with two stages (the ceiling is 101,376 B = 99.0 KB).\n")
    names = [g.name.split(" (")[0] for g in GPUS]
    print(f"{'tiling':8} {'heads':>5} {'cache':15} {'B/MMA':>6} {'KB':>6}  " + "  ".join(names))
    for tiling, heads, cache, cache_bytes, row_bytes in configs:
        b = tile_bytes_per_mma(tiling, heads, 576, cache_bytes, row_bytes)
        bounds = [min(1.0, SMEM_BYTES_PER_CLOCK / b["total"] / g.mmas_per_clock) for g in GPUS]
        print(f"{tiling:8} {heads:5d} {cache:15} {b['total']:6.0f} {b['smem bytes (two stages)'] / 1024:6.1f}  "
              + "  ".join(f"{x:>{len(n)}.2f}" for x, n in zip(bounds, names)))
    for tiling in ("main", "wide"):
        print(f"\nper kind, {tiling} tiling, 32 heads, bf16 (B/MMA):")
        for k, v in tile_bytes_per_mma(tiling, 32, 576, 2, 2 * 576).items():
            if not k.startswith("smem"):
                print(f"  {k:32} {v:6.0f}")
    print("\nmma.sync rate per SM and clock: " + ", ".join(f"{g.name}: {g.mmas_per_clock:.3f}" for g in GPUS))


if __name__ == "__main__":
    main()
