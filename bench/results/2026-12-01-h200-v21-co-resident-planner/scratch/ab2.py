"""Scratch A/B timings of one build: writes {shape: us} to argv[1]; argv[2] 'h200' or 'sm120' picks the shape list of
ab2_shapes.json (the plans the new co-resident rule changes, then unchanged controls). Prints each shape's plan once."""
import json, os, sys, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(7)
pools = {}
MODEL = {"GLM": "GLM-5.3-Flash", "Dee": "DeepSeek-V3.2"}

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

shapes = json.load(open(os.path.join(os.path.dirname(__file__), "ab2_shapes.json")))[sys.argv[2]]
res = {}
for key in shapes:
    m, H, T, kv = key.split()
    H, T = int(H[1:]), int(T[1:])
    f = setup(MODEL[m], H, T, kv)
    os.environ["SCRATCH_PRINT_PLAN"] = "1"
    print(key, end=": ", flush=True)
    f(0); torch.cuda.synchronize()
    os.environ.pop("SCRATCH_PRINT_PLAN")
    time.sleep(0.05)
    res[key] = bench._median_ms(f, 100 if T * H <= 4096 else 30, 4) * 1e3
json.dump(res, open(sys.argv[1], "w"), indent=0)
print("written", sys.argv[1], len(res), flush=True)
