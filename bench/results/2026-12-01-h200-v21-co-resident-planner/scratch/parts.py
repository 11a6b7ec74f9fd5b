"""Scratch: planned launches with and without the combine pass (SCRATCH_NO_COMBINE of no_combine.patch: timing only,
wrong output), T 4 / 16 / 64; us per call, median of three interleaved rounds."""
import os, statistics, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(5)
pools = {}

def setup(model, H, T, kv):
    D, topk, _, sm_scale = bench.MODELS[model]
    if (kv, D) not in pools:
        pools[(kv, D)] = bench._pool(kv, D, dev)
    cache, name, k_scale = pools[(kv, D)]
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, generator=gen)
    idx = [torch.randint(0, bench.POOL_ROWS, (T, topk), device=dev, dtype=torch.int32, generator=gen) for _ in range(4)]
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    def f(i):
        ops.sparse_mla_fwd(q, cache, idx[i], sm_scale, kv_cache_dtype=name, k_scale=k_scale, out=out, lse=lse, workspace=ws)
    return f

def timed(f, no_combine):
    os.environ.pop("SCRATCH_NO_COMBINE", None)
    if no_combine: os.environ["SCRATCH_NO_COMBINE"] = "1"
    try:
        return bench._median_ms(f, 100, 4) * 1e3
    finally:
        os.environ.pop("SCRATCH_NO_COMBINE", None)

print(f"{'shape':28s} {'full':>8s} {'forward':>8s} {'combine':>8s}")
for T in (4, 16, 64):
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64)):
        for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
            f = setup(model, H, T, kv)
            res = {0: [], 1: []}
            for _ in range(3):
                for m in (0, 1):
                    res[m].append(timed(f, m))
            full, fwd = statistics.median(res[0]), statistics.median(res[1])
            print(f"{model[:3]} H{H:<3} T{T:<3} {kv:10s}   {full:8.2f} {fwd:8.2f} {full - fwd:8.2f}", flush=True)
