"""Small launches of every kernel configuration class, for compute-sanitizer's shared-memory and
barrier checks (racecheck and synccheck instrument every shared access, so verify's cases are too
big for them):

    compute-sanitizer --tool racecheck python tools/sanitizer_launches.py
    compute-sanitizer --tool synccheck python tools/sanitizer_launches.py

Every cache format x D (512, 576) x 8 and 32 heads, the 32 in 16-head blocks and in 32-head ones (two
head groups), both forced (block_heads=16, 32) so that each runs whatever planner.h plan_head_groups picks:
one token with the top-k axis split across blocks and random masked slots, and three tokens in one
block each with random topk_len (for fp8 caches these one-wave grids run the kernel that decodes
each tile once; one token of 8 heads splits into one-tile blocks), and one token of 8 heads at topk
2176 (68 one-tile blocks and the 17-load decode combine); and, with 16-bit caches at 8 heads and fp8
caches at 8 and at 32 in 32-head blocks, a grid of two blocks per SM with random topk_len, which
runs the fp8 kernels of raw tiles (the 32-head ones: the WideWarps kernel; not on GPUs
before sm_89; 16-head fp8_ds_mla at D = 576 in its paired-scores variant where an SM holds one
block of the main kernel) and the 16-bit one-stage kernels where an SM holds
one two-stage block (sm_120, or any GPU with SPARSE_MLA_SM120_OCCUPANCY=1 set, as README says). The
split one-stage launches the planner makes there (more blocks than SMs, >= 16 tiles each: thousands
of tiles) are left to memcheck; their shared memory is used as in the unsplit one-stage launch, and
only the global destination of the epilogue differs, which the split two-stage launches here cover.

Each launch is checked against the fp32 reference as in ``verify`` (``verify.run_case``). Needs a
CUDA GPU and the built package; exit 1 if a case fails.
"""

import torch

from vllm_sparse_mla_blackwell import cases, verify


def main() -> int:
    device = torch.device("cuda")
    two_blocks_per_sm = 2 * torch.cuda.get_device_properties(device).multi_processor_count + 8
    # (num_heads, block_heads): None plans the block.
    heads = ((8, None), (32, 16), (32, 32))
    shapes = [(num_heads, block_heads, num_tokens, topk, masking) for num_heads, block_heads in heads
              for num_tokens, topk, masking in ((1, 200, "random"), (3, 96, "topk_len"))]
    # Decode of 8 heads, topk 2176: 68 one-tile splits on the H200 and the decode combine's
    # 17-load variant (api.h kMinTilesPerSplit, params.h combine_decode_loads).
    shapes.append((8, None, 1, 2176, "topk_len"))
    many_blocks = {"bf16": ((8, None),), "fp16": ((8, None),), "fp8_e4m3": ((8, None), (32, 32)),
                   "fp8_ds_mla": ((8, None), (32, 32))}
    failed = [
        case.label()
        for kv_cache_dtype in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")
        for head_size in (512, 576)
        for num_heads, block_heads, num_tokens, topk, masking in
        shapes + [(h, bh, two_blocks_per_sm, 96, "topk_len") for h, bh in many_blocks[kv_cache_dtype]]
        for case in [cases.Case(head_size=head_size, num_heads=num_heads, topk=topk, num_tokens=num_tokens,
                                kv_cache_dtype=kv_cache_dtype, masking=masking, block_heads=block_heads)]
        if not verify.run_case(case, device).passed
    ]
    print("sanitizer launches:", "all passed" if not failed else f"FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
