"""Run one bench shape a few times, for a profiler: ``ncu --clock-control none -k regex:sparse_mla
python bench/profile_shape.py --heads 128 --tokens 1024``. Inputs are built as `bench` builds
them (256K-row pool, random slots); the calls are plain launches, so the profiler sees each one.
``--gather`` also runs the gather ceiling kernel on the same rows (``-k regex:"sparse_mla|gather"``),
so that the two can be compared metric by metric.
"""

from __future__ import annotations

import argparse

import torch

from vllm_sparse_mla_blackwell import bench, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="DeepSeek-V3.2", choices=sorted(bench.MODELS))
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--kv", default="bf16", choices=bench.KV_DTYPES)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--gather", action="store_true", help="also run the gather ceiling kernel on the same rows")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be >= 1")
    device = torch.device("cuda")
    head_size, topk, _, sm_scale = bench.MODELS[args.model]
    cache, name, k_scale = bench.random_pool(args.kv, head_size, device)
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(args.tokens, args.heads, head_size, device=device, dtype=torch.bfloat16, generator=gen)
    idx = torch.randint(0, bench.POOL_ROWS, (args.tokens, topk), device=device, dtype=torch.int32, generator=gen)
    rows = cache.view(torch.uint8).view(bench.POOL_ROWS, -1)
    checksum = torch.zeros(1024, dtype=torch.int32, device=device)
    for _ in range(args.calls):
        out, lse = ops.sparse_mla_fwd(q, cache, idx, sm_scale, kv_cache_dtype=name, k_scale=k_scale)
        if args.gather:
            torch.ops.sparse_mla_bw.bench_gather_rows(rows, idx, checksum)
    torch.cuda.synchronize()
    print(f"{args.model} H{args.heads} T{args.tokens} {args.kv}: out finite = {bool(out.isfinite().all())}")


if __name__ == "__main__":
    main()
