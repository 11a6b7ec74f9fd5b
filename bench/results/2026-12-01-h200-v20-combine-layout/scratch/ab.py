"""Scratch A/B timings of one build: writes {shape: us} to argv[1]. argv[2]: 'main' or 't1'."""
import json, sys, time
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

shapes = []
for kv in ("fp8_e4m3", "fp8_ds_mla"):
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("DeepSeek-V3.2", 16)):
        for T in (1, 4, 16, 64, 256, 1024):
            shapes.append((model, H, T, kv))
    for model, H in (("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for T in (4, 64, 1024):
            shapes.append((model, H, T, kv))
for model, H, T, kv in (("GLM-5.3-Flash", 16, 256, "bf16"), ("DeepSeek-V3.2", 16, 256, "fp16"),
                        ("DeepSeek-V3.2", 128, 1024, "bf16"), ("GLM-5.3-Flash", 32, 64, "bf16")):
    shapes.append((model, H, T, kv))
if len(sys.argv) > 2 and sys.argv[2] == "sm120":
    shapes = [s for s in shapes if s[1] <= 16 and s[3] != "bf16" and s[3] != "fp16" and s[2] >= 16]
if len(sys.argv) > 2 and sys.argv[2] == "h16":
    shapes = [s for s in shapes if s[1] <= 16 and s[3].startswith("fp8") and s[2] >= 64]
if len(sys.argv) > 2 and sys.argv[2] == "decode":
    shapes = []
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 8), ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for T in (1, 2, 4, 16, 64):
            if T == 2 and H > 16: continue
            for kv in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"):
                if kv == "fp16" and T not in (1, 64): continue
                shapes.append((model, H, T, kv))
if len(sys.argv) > 2 and sys.argv[2] == "large":
    shapes = []
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("DeepSeek-V3.2", 16), ("GLM-5.3-Flash", 32),
                     ("DeepSeek-V3.2", 128)):
        for T in (256, 1024):
            for kv in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"):
                shapes.append((model, H, T, kv))
res = {}
for model, H, T, kv in shapes:
    f = setup(model, H, T, kv)
    time.sleep(0.1)
    reps = 100 if T * H <= 4096 else 30
    res[f"{model[:3]} H{H} T{T} {kv}"] = bench._median_ms(f, reps, 4) * 1e3
json.dump(res, open(sys.argv[1], "w"), indent=0)
print("written", sys.argv[1], len(res), flush=True)
