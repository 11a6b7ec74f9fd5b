"""The gather ceiling when every row is read once per head block, as the forward kernel reads it:
a token of H heads runs ceil(H / 32) blocks of 32 heads (16 at decode), adjacent in the grid, and
each gathers all of the token's topk rows, so at 128 heads each row is read four times, three of
them (at best) from L2. bench's gather ceiling reads each row once; this times the same kernel
(`bench_gather_rows`) on the index rows repeated per head block, so that the re-reads of a token
run next to each other as the head blocks do. Needs a GPU and the op library.

    python tools/reread_ceiling.py [--model DeepSeek-V3.2] [--kv bf16] [--tokens 1024,4096] [--copies 1,2,4]

Prints, per token count and copies: µs per call, the bytes read per µs counted once per copy
(TB/s through L2 and DRAM together) and counted once (the unique rows, bench's gather figure),
and the time against one copy's. Timing as bench's (a CUDA graph of back-to-back calls, median
of 5 replays, rotated index sets, random slots into bench's pool).
"""

from __future__ import annotations

import argparse

import torch

from vllm_sparse_mla_blackwell import bench, formats


def measure(model: str, kv_dtype: str, tokens: list[int], copies: list[int]) -> list[dict]:
    """Per token count and copy count: one dict with ``us``, ``tbps_read`` (every copy's bytes),
    ``tbps_unique`` and ``over_one`` (µs against copies = 1); each line also printed."""
    device = torch.device("cuda", torch.cuda.current_device())
    head_size, topk, _, _ = bench.MODELS[model]
    cache, name, _ = bench.random_pool(kv_dtype, head_size, device)
    row_bytes = formats.kv_row_bytes(name, head_size)
    flat = cache.view(torch.uint8).view(bench.POOL_ROWS, row_bytes)
    checksum = torch.zeros(1024, dtype=torch.int32, device=device)
    gen = torch.Generator(device=device).manual_seed(1)
    print(f"{torch.cuda.get_device_name(device)}, {model} rows of {row_bytes} B ({kv_dtype}), topk {topk}")
    print(f"{'tokens':>6} {'copies':>6} {'us':>9} {'TB/s read':>10} {'TB/s unique':>12} {'x one copy':>10}")
    out = []
    for num_tokens in tokens:
        idx_sets = [torch.randint(0, bench.POOL_ROWS, (num_tokens, topk), device=device, dtype=torch.int32,
                                  generator=gen) for _ in range(bench.INDEX_SETS)]
        base_us = None
        for c in copies:
            reps_sets = [idx.repeat_interleave(c, dim=0) for idx in idx_sets]  # token t's rows at t c .. t c + c - 1

            def gather(i, sets=reps_sets):
                torch.ops.sparse_mla_bw.bench_gather_rows(flat, sets[i], checksum)

            us = bench.time_ms(gather) * 1e3
            unique = num_tokens * topk * row_bytes
            base_us = base_us or us
            row = dict(model=model, kv=kv_dtype, tokens=num_tokens, copies=c, us=us,
                       tbps_read=c * unique / us / 1e6, tbps_unique=unique / us / 1e6, over_one=us / base_us)
            print(f"{num_tokens:>6} {c:>6} {us:>9.1f} {row['tbps_read']:>10.2f} {row['tbps_unique']:>12.2f} "
                  f"{row['over_one']:>10.2f}")
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="DeepSeek-V3.2", choices=sorted(bench.MODELS))
    ap.add_argument("--kv", default="bf16", help="bench's cache names: bf16, fp16, fp8_e4m3, fp8_ds_mla")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--copies", default="1,2,4")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("reread_ceiling: needs a CUDA GPU")
    measure(args.model, args.kv, [int(x) for x in args.tokens.split(",")], [int(x) for x in args.copies.split(",")])


if __name__ == "__main__":
    main()
