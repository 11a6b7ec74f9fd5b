"""Scratch A/B timings of one build: writes {shape: us} to argv[1] (graph-timed, bench._median_ms)."""
import json, sys, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(7)
pools = {}
MODEL = {"GLM": "GLM-5.3-Flash", "Dee": "DeepSeek-V3.2"}
shapes = [f"{m} H{H} T{T} {kv}" for m, H in (("GLM", 8), ("GLM", 16), ("GLM", 32), ("Dee", 16), ("Dee", 64), ("Dee", 128))
          for T in (1, 2, 4, 16, 64, 256, 1024) for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla")]
if len(sys.argv) > 2: shapes = [s for s in shapes if any(f" T{t} " in s for t in sys.argv[2].split(","))]
res = {}
for key in shapes:
    m, H, T, kv = key.split()
    H, T = int(H[1:]), int(T[1:])
    D, topk, _, sm_scale = bench.MODELS[MODEL[m]]
    if (kv, D) not in pools:
        pools[(kv, D)] = bench._pool(kv, D, dev)
    cache, name, k_scale = pools[(kv, D)]
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, generator=gen)
    idx = [torch.randint(0, bench.POOL_ROWS, (T, topk), device=dev, dtype=torch.int32, generator=gen) for _ in range(4)]
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    f = lambda i: ops.sparse_mla_fwd(q, cache, idx[i], sm_scale, kv_cache_dtype=name, k_scale=k_scale, out=out, lse=lse,
                                     workspace=ws)
    time.sleep(0.05)
    res[key] = bench._median_ms(f, 100 if T * H <= 1024 else (30 if T * H <= 16384 else 6), 4) * 1e3
json.dump(res, open(sys.argv[1], "w"), indent=0)
print("written", sys.argv[1], len(res), flush=True)
