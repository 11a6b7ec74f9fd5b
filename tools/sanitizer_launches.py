"""Small launches of every kernel configuration class, for compute-sanitizer's shared-memory and
barrier checks (racecheck and synccheck instrument every shared access, so verify's cases are too
big for them):

    compute-sanitizer --tool racecheck python tools/sanitizer_launches.py
    compute-sanitizer --tool synccheck python tools/sanitizer_launches.py

Every cache format x D (512, 576) x 8 and 32 heads (one and two head groups), one token with the
top-k axis split across blocks and three tokens without, random indices with -1 (masked) among
them and a topk_len that cuts the last tile. Needs a CUDA GPU and the built package.
"""

import torch

from vllm_sparse_mla_blackwell import formats, ops

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
ROWS = 4096
for kv in ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"):
    for D in (512, 576):
        name = formats.KV_CACHE_DTYPES[kv]
        width = formats.kv_row_bytes(name, D)
        kv_c = torch.randn(ROWS, 512, device=dev, generator=g, dtype=torch.bfloat16)
        k_pe = torch.randn(ROWS, D - 512, device=dev, generator=g, dtype=torch.bfloat16) if D > 512 else None
        if kv in ("bf16", "fp16"):
            dt = torch.bfloat16 if kv == "bf16" else torch.float16
            cache = torch.empty(ROWS, width // 2, dtype=dt, device=dev)
            kv_c = kv_c.to(dt); k_pe = None if k_pe is None else k_pe.to(dt)
        else:
            cache = torch.empty(ROWS, width, dtype=torch.uint8, device=dev)
        ks = torch.tensor([0.05], device=dev) if kv == "fp8_e4m3" else None
        ops.concat_and_cache_sparse_mla(kv_c, k_pe, cache, torch.arange(ROWS, device=dev), name, ks)
        for H in (8, 32):
            for T, topk in ((1, 200), (3, 96)):  # split launch, and unsplit with masked tail
                q = torch.randn(T, H, D, device=dev, generator=g, dtype=torch.bfloat16)
                idx = torch.randint(-1, ROWS, (T, topk), device=dev, dtype=torch.int32, generator=g)
                out, lse = ops.sparse_mla_fwd(q, cache, idx, D ** -0.5, kv_cache_dtype=name, k_scale=ks,
                                              topk_len=torch.full((T,), topk - 5, dtype=torch.int32, device=dev))
                assert out.isfinite().all(), (kv, D, H, T)
torch.cuda.synchronize()
print("sanitizer launches done")
