"""Scratch: T = 1 with the combine pass cut down (SCRATCH_COMBINE_MODE of scratch/combine_modes.patch)."""
import os, statistics, sys, time
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
    return f

modes = {"full": "0", "no_lse_chain": "1", "no_partial_loads": "2", "empty_combine": "3", "no_combine": "9"}
print("T us (median of 2 interleaved rounds); SCRATCH_COMBINE_MODE: 1 no lse reduction, 2 no partial loads, 3 empty combine, 9 no combine launch")
print(f"{'shape':18s} {'kv':11s} " + " ".join(f"{m:>16s}" for m in modes))
for T in (1, 4):
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
            f = setup(model, H, T, kv)
            res = {m: [] for m in modes}
            for _ in range(2):
                for m, v in modes.items():
                    os.environ["SCRATCH_COMBINE_MODE"] = v
                    time.sleep(0.05)
                    res[m].append(bench._median_ms(f, 200, 4) * 1e3)
            print(f"{model[:3]+' H'+str(H)+' T'+str(T):18s} {kv:11s} " + " ".join(f"{statistics.median(x):16.2f}" for x in res.values()), flush=True)
