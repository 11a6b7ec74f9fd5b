"""Scratch A/B timings of one build for the paired partial scores (fp8_ds_mla, DeepSeek-V3.2 D = 576): writes
{shape: us} to argv[1]; run once as is (H200 occupancy) and once with SPARSE_MLA_SM120_OCCUPANCY=1."""
import json, sys, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(7)
model = "DeepSeek-V3.2"
D, topk, _, sm_scale = bench.MODELS[model]
cache, name, k_scale = bench._pool("fp8_ds_mla", D, dev)
res = {}
for H, Ts in ((16, (1, 4, 16, 64, 256, 1024)), (64, (4, 64, 1024)), (128, (4, 64, 1024))):
    for T in Ts:
        q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, generator=gen)
        idx = [torch.randint(0, bench.POOL_ROWS, (T, topk), device=dev, dtype=torch.int32, generator=gen) for _ in range(4)]
        out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
        lse = torch.empty(T, H, device=dev)
        def f(i):
            ops.sparse_mla_fwd(q, cache, idx[i], sm_scale, kv_cache_dtype=name, out=out, lse=lse, workspace=ws)
        time.sleep(0.1)
        res[f"Dee H{H} T{T} fp8_ds_mla"] = bench._median_ms(f, 100 if T * H <= 4096 else 20, 4) * 1e3
json.dump(res, open(sys.argv[1], "w"), indent=0)
print("written", sys.argv[1], len(res), flush=True)
