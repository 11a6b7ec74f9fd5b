"""Scratch: split sweep after v20's combine (SCRATCH_SPLITS of hooks2.patch). us, median of two interleaved rounds."""
import os, statistics, sys, time, math
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(7)
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
    return f, topk

def timed(f, splits):
    os.environ.pop("SCRATCH_SPLITS", None)
    if splits: os.environ["SCRATCH_SPLITS"] = str(splits)
    try:
        return bench._median_ms(f, 100, 4) * 1e3
    finally:
        os.environ.pop("SCRATCH_SPLITS", None)

print("split sweep after v20's combine: us (median of 2 rounds); planned vs forced splits (effective count)")
for T in (1, 2, 4, 16):
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
            f, topk = setup(model, H, T, kv)
            tiles = (topk + 31) // 32
            cands = (8, 16, 23, 34, 68) if T == 1 else (4, 8, 16, 34, 68) if T <= 4 else (2, 3, 4, 6, 8, 12, 16)
            eff = []
            for n in cands:
                tps = math.ceil(tiles / n); e = math.ceil(tiles / tps)
                if e not in eff: eff.append(e)
            res = {n: [] for n in [0] + eff}
            for _ in range(2):
                for n in res:
                    res[n].append(timed(f, n))
            med = {n: statistics.median(v) for n, v in res.items()}
            best = min((v, n) for n, v in med.items() if n)
            print(f"{model[:3]} H{H:<3} T{T:<3} {kv:10s} planned {med[0]:7.2f}  " + " ".join(f"s{n}:{v:7.2f}" for n, v in med.items() if n) +
                  f"   best s{best[1]} planned/best {med[0]/best[0]:.3f}", flush=True)
