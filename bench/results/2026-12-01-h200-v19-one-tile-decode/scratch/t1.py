"""Scratch timings (env hooks of scratch/hooks.patch): T = 1 with and without the combine pass,
with one-tile splits; fp8_e4m3 GLM H32 T64 split / decode variants."""
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
    def f(i, bh=None):
        ops.sparse_mla_fwd(q, cache, idx[i], sm_scale, kv_cache_dtype=name, k_scale=k_scale, out=out, lse=lse,
                           workspace=ws, block_heads=bh)
    return f

def timed(f, env, reps=200):
    for k in ("SCRATCH_SKIP_COMBINE", "SCRATCH_MIN_TILES", "SCRATCH_SPLITS", "SCRATCH_DECODED"):
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        return bench._median_ms(f, reps, 4) * 1e3
    finally:
        for k in env: os.environ.pop(k, None)

part = sys.argv[1]
if part == "t1":
    modes = {"normal": {}, "skip_combine": {"SCRATCH_SKIP_COMBINE": "1"}, "min_tiles_1": {"SCRATCH_MIN_TILES": "1"},
             "min1_skip": {"SCRATCH_MIN_TILES": "1", "SCRATCH_SKIP_COMBINE": "1"}}
    print("T=1 us, median of two interleaved rounds")
    print(f"{'shape':24s} {'kv':11s} " + " ".join(f"{m:>12s}" for m in modes))
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
            f = setup(model, H, 1, kv)
            res = {m: [] for m in modes}
            for _ in range(2):
                for m, env in modes.items():
                    res[m].append(timed(f, env))
            print(f"{model[:3]+' H'+str(H):24s} {kv:11s} " + " ".join(f"{statistics.median(v):12.2f}" for v in res.values()), flush=True)
elif part == "h32":
    print("GLM H32 T64: us (A B A B medians); bf16 planned is the denominator")
    fb = setup("GLM-5.3-Flash", 32, 64, "bf16")
    f8 = setup("GLM-5.3-Flash", 32, 64, "fp8_e4m3")
    variants = [("bf16 planned", fb, None, {})]
    for bh in (16, 32):
        variants.append((f"fp8 bh{bh} planned", f8, bh, {}))
        for s in (1, 2, 3, 4, 6):
            for d in ("0", "1"):
                variants.append((f"fp8 bh{bh} splits{s} decoded{d}", f8, bh, {"SCRATCH_SPLITS": str(s), "SCRATCH_DECODED": d}))
    res = {v[0]: [] for v in variants}
    for _ in range(2):
        for name, f, bh, env in variants:
            time.sleep(0.2)
            res[name].append(timed(lambda i: f(i, bh), env, 40))
    base = statistics.median(res["bf16 planned"])
    for name, v in res.items():
        us = statistics.median(v)
        print(f"{name:34s} {us:8.1f} us  bf16/this {base/us:5.3f}  ({' '.join(f'{x:.1f}' for x in v)})")
elif part == "min_tiles":
    print("one-tile splits: SCRATCH_MIN_TILES 2 (old) vs 1, us, A B A B medians")
    print(f"{'shape':16s} {'kv':11s} {'min2':>8s} {'min1':>8s} {'min2/min1':>9s}")
    for model, H, T in (("GLM-5.3-Flash", 8, 1), ("GLM-5.3-Flash", 16, 1), ("DeepSeek-V3.2", 16, 1),
                        ("DeepSeek-V3.2", 32, 1), ("DeepSeek-V3.2", 16, 2), ("DeepSeek-V3.2", 8, 2), ("GLM-5.3-Flash", 8, 2)):
        for kv in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"):
            f = setup(model, H, T, kv)
            r2, r1 = [], []
            for _ in range(2):
                r2.append(timed(f, {"SCRATCH_MIN_TILES": "2"}))
                r1.append(timed(f, {"SCRATCH_MIN_TILES": "1"}))
            a, b = statistics.median(r2), statistics.median(r1)
            print(f"{model[:3]+' H'+str(H)+' T'+str(T):16s} {kv:11s} {a:8.2f} {b:8.2f} {a/b:9.3f}", flush=True)
elif part == "combine":
    import json
    res = {}
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for T in (1, 4, 16):
            for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
                f = setup(model, H, T, kv)
                res[f"{model[:3]} H{H} T{T} {kv}"] = timed(f, {"SCRATCH_MIN_TILES": "2"})
    json.dump(res, open(sys.argv[2], "w"), indent=0)
    print("combine timings written:", sys.argv[2], len(res))
elif part == "decode":
    import json
    res = {}
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 8), ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for T in (1, 2, 4, 16):
            if T == 2 and H > 16: continue
            for kv in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"):
                if kv == "fp16" and T > 2: continue
                f = setup(model, H, T, kv)
                res[f"{model[:3]} H{H} T{T} {kv}"] = timed(f, {})
    json.dump(res, open(sys.argv[2], "w"), indent=0)
    print("decode timings written:", sys.argv[2], len(res))
elif part == "splits":
    print("split sweep (16-head blocks as planned on the H200): us, two interleaved rounds, median; planned marked *")
    for model, H in (("GLM-5.3-Flash", 8), ("GLM-5.3-Flash", 16), ("GLM-5.3-Flash", 32), ("GLM-5.3-Flash", 64),
                     ("DeepSeek-V3.2", 16), ("DeepSeek-V3.2", 64), ("DeepSeek-V3.2", 128)):
        for T in (16, 64):
            for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla"):
                f = setup(model, H, T, kv)
                envs = [("planned", {})] + [(f"s{s}", {"SCRATCH_SPLITS": str(s)}) for s in (1, 2, 3, 4, 6, 8)]
                res = {n: [] for n, _ in envs}
                for _ in range(2):
                    for n, env in envs:
                        res[n].append(timed(f, env, 40))
                med = {n: statistics.median(v) for n, v in res.items()}
                best = min((v, n) for n, v in med.items() if n != "planned")
                print(f"{model[:3]} H{H:<3} T{T:<3} {kv:10s} planned {med['planned']:7.1f}  " +
                      " ".join(f"{n}:{v:7.1f}" for n, v in med.items() if n != "planned") +
                      f"   best {best[1]} planned/best {med['planned']/best[0]:.3f}", flush=True)
