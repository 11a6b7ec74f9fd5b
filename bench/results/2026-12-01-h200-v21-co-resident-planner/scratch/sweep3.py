"""Scratch: split sweep for the planner's co-resident rule (SCRATCH_SPLITS of hooks3.patch), T 2-64, four formats.
Round 1 times every effective split count; rounds 2-3 re-time the planned count and round 1's best three,
interleaved. us per call: median replay of a 50-call CUDA graph."""
import json, math, os, statistics, sys, time
import torch
from vllm_sparse_mla_blackwell import bench, ops

dev = torch.device("cuda")
ws = ops.get_workspace(dev)
gen = torch.Generator(device=dev).manual_seed(11)
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

def timed(f, splits, reps=50):
    os.environ.pop("SCRATCH_SPLITS", None)
    if splits: os.environ["SCRATCH_SPLITS"] = str(splits)
    try:
        for i in range(3): f(i % 4)
        torch.cuda.synchronize()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            for i in range(reps): f(i % 4)
        torch.cuda.current_stream().wait_stream(s)
        t = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize()
            t.append(a.elapsed_time(b) / reps * 1e3)
        return statistics.median(t)
    finally:
        os.environ.pop("SCRATCH_SPLITS", None)

only_kv = sys.argv[2].split(",") if len(sys.argv) > 2 else ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")
out = {}
t0 = time.time()
for T in (16, 64, 4, 8, 32, 2):
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for kv in only_kv:
            f, topk = setup(model, H, T, kv)
            tiles = (topk + 31) // 32
            base = T * math.ceil(H / 16)
            eff = []
            for n in range(1, tiles + 1):
                tps = math.ceil(tiles / n); e = math.ceil(tiles / tps)
                if e > 1 and tps < 2 and T * H > 16: continue
                if base * e > 3 * 132 or e * T * H * 513 * 4 > ws.numel() * ws.element_size(): continue
                if T <= 8 and e < 4 and e != 1: continue
                if e not in eff: eff.append(e)
            if len(eff) < 2: continue
            os.environ["SCRATCH_PRINT_PLAN"] = "1"
            print(f"{model[:3]} H{H} T{T} {kv}: ", end="", flush=True)
            f(0); torch.cuda.synchronize()
            os.environ.pop("SCRATCH_PRINT_PLAN")
            r1 = {n: timed(f, n) for n in [0] + eff}
            top = sorted((v, n) for n, v in r1.items() if n)[:3]
            res = {n: [r1[n]] for n in [0] + [n for _, n in top]}
            for _ in range(2):
                for n in res: res[n].append(timed(f, n))
            med = {n: statistics.median(v) for n, v in res.items()}
            best = min((v, n) for n, v in med.items() if n)
            key = f"{model[:3]} H{H} T{T} {kv}"
            out[key] = {"round1": r1, "median3": med}
            print(f"{key:26s} planned {med[0]:7.2f}  best s{best[1]} {best[0]:7.2f}  planned/best {med[0]/best[0]:.3f}  r1: " +
                  " ".join(f"s{n}:{v:.2f}" for n, v in r1.items() if n), flush=True)
            json.dump(out, open(sys.argv[1], "w"), indent=0)
print(f"done {time.time() - t0:.0f} s")
