"""Scratch: per-block timeline of single planned launches (scratch/stamps.patch: SCRATCH_STAMPS=1 prints, per launch,
block start skew, fill (start -> first tile landed), loop, epilogue, in us), after a warm-up of back-to-back calls."""
import os, sys, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(5)
pools = {}
shapes = [("GLM-5.3-Flash", 16, T, kv) for T in (1, 16, 64, 256, 1024) for kv in ("bf16", "fp8_e4m3")]
shapes += [("GLM-5.3-Flash", 8, 64, "bf16"), ("DeepSeek-V3.2", 16, 64, "bf16"), ("DeepSeek-V3.2", 16, 64, "fp8_e4m3"),
           ("DeepSeek-V3.2", 16, 256, "bf16"), ("DeepSeek-V3.2", 16, 64, "fp8_ds_mla"), ("GLM-5.3-Flash", 32, 64, "bf16")]
for model, H, T, kv in shapes:
    D, topk, _, sm_scale = bench.MODELS[model]
    if (kv, D) not in pools:
        pools[(kv, D)] = bench._pool(kv, D, dev)
    cache, name, k_scale = pools[(kv, D)]
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, generator=gen)
    idx = [torch.randint(0, bench.POOL_ROWS, (T, topk), device=dev, dtype=torch.int32, generator=gen) for _ in range(4)]
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    f = lambda i: ops.sparse_mla_fwd(q, cache, idx[i % 4], sm_scale, kv_cache_dtype=name, k_scale=k_scale, out=out,
                                     lse=lse, workspace=ws)
    us = bench._median_ms(f, 50, 4) * 1e3
    print(f"== {model[:3]} H{H} T{T} {kv}: graph-timed {us:.1f} us", flush=True)
    for rep in range(3):
        for i in range(20): f(i)   # back-to-back warm-up, then one stamped launch
        os.environ["SCRATCH_STAMPS"] = "1"
        f(rep)
        os.environ.pop("SCRATCH_STAMPS")
        torch.cuda.synchronize()
