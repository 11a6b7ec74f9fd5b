"""save DIR: run family-shaped launches with fixed inputs and save outputs; cmp DIR1 DIR2."""
import sys, os, itertools, torch
def save(d):
    from vllm_sparse_mla_blackwell import ops
    os.makedirs(d, exist_ok=True)
    n = 0
    for D, H, T, dt, topk in itertools.product((512, 576), (24, 32, 64, 128), (1, 8, 64, 300), ("bf16", "fp16"), (2048,)):
        if D == 512 and H == 128: continue
        g = torch.Generator(device="cuda").manual_seed(D * 100000 + H * 1000 + T * 3 + (dt == "bf16"))
        dtype = torch.bfloat16 if dt == "bf16" else torch.float16
        rows = 8192
        cache = torch.randn(rows, D, device="cuda", generator=g).to(dtype)
        q = torch.randn(T, H, D, device="cuda", generator=g).to(dtype)
        idx = torch.randint(0, rows, (T, topk), device="cuda", generator=g, dtype=torch.int32)
        idx[:, -37:] = -1
        out, lse = ops.sparse_mla_fwd(q, cache, idx, 0.0625, kv_cache_dtype="auto")
        torch.cuda.synchronize()
        torch.save((out.cpu(), lse.cpu()), f"{d}/{D}_{H}_{T}_{dt}.pt"); n += 1
    print("saved", n)
def cmp(a, b):
    same = diff = 0
    for f in sorted(os.listdir(a)):
        oa, la = torch.load(f"{a}/{f}"); ob, lb = torch.load(f"{b}/{f}")
        ok = torch.equal(oa.view(torch.int16), ob.view(torch.int16)) and torch.equal(la.view(torch.int32), lb.view(torch.int32))
        same += ok; diff += not ok
        if not ok: print("DIFF", f)
    print(f"bitwise identical: {same}/{same + diff} launches")
{"save": lambda: save(sys.argv[2]), "cmp": lambda: cmp(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
