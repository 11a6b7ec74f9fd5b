"""Times the forward kernel with 16- and 32-head blocks forced, beside the planner's own choice,
for every shape of more than 16 heads: the measurement behind the planner's head-block rule
(csrc/sparse_mla/planner.h `plan_head_groups`). Needs a GPU and the op library; run with
SPARSE_MLA_SM120_OCCUPANCY=1 to plan and launch at an sm_120 SM's occupancy.

    python tools/head_block_sweep.py [--kv bf16,fp16,fp8_e4m3,fp8_ds_mla] [--tokens 64,256,1024,4096]
                                     [--json PATH]

Prints, per (model, heads, tokens, cache), µs with 16-head blocks, with 32-head blocks and as
planned, and t16 / t32 (above 1: 32-head blocks are faster). Timing as bench's (a CUDA graph of
back-to-back calls, median of 5 replays, rotated index sets).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from vllm_sparse_mla_blackwell import _testing, bench, ops


def sweep(kv_dtypes: list[str], tokens: list[int]) -> list[dict]:
    """Per model of bench.MODELS, cache dtype of ``kv_dtypes`` (bench names), head count above 16
    and token count of ``tokens``: one dict with µs per call (``us_16``, ``us_32``,
    ``us_planned``) and ``t16_over_t32``; each line also printed. Needs a CUDA GPU."""
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(1)
    ws = ops.get_workspace(device)
    rows = []
    for model, (head_size, topk, heads, sm_scale) in bench.MODELS.items():
        for kv_dtype in kv_dtypes:
            cache, name, k_scale = bench.random_pool(kv_dtype, head_size, device)
            for num_heads in (h for h in heads if h > 16):
                for num_tokens in tokens:
                    q = torch.randn(num_tokens, num_heads, head_size, device=device, dtype=torch.bfloat16,
                                    generator=gen)
                    idx = [torch.randint(0, bench.POOL_ROWS, (num_tokens, topk), device=device, dtype=torch.int32,
                                         generator=gen) for _ in range(bench.INDEX_SETS)]
                    out = torch.empty(num_tokens, num_heads, 512, device=device, dtype=torch.bfloat16)
                    lse = torch.empty(num_tokens, num_heads, device=device)
                    us = {}
                    for label, block_heads in (("16", 16), ("32", 32), ("planned", None)):
                        def attn(i, block_heads=block_heads):
                            _testing.sparse_mla_fwd(q, cache, idx[i], sm_scale, kv_cache_dtype=name, k_scale=k_scale,
                                                    out=out, lse=lse, workspace=ws, block_heads=block_heads)

                        time.sleep(0.2)
                        us[label] = bench.time_ms(attn) * 1e3
                    rows.append(dict(model=model, num_heads=num_heads, num_tokens=num_tokens, kv_cache_dtype=kv_dtype,
                                     us_16=us["16"], us_32=us["32"], us_planned=us["planned"],
                                     t16_over_t32=us["16"] / us["32"]))
                    print(f"{model:14s} H{num_heads:<4d} T{num_tokens:<5d} {kv_dtype:10s} 16: {us['16']:9.1f}  "
                          f"32: {us['32']:9.1f}  planned: {us['planned']:9.1f}  t16/t32 {us['16'] / us['32']:.3f}",
                          flush=True)
            del cache
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="16- against 32-head blocks per shape, beside the planner's choice "
                                     "(planner.h plan_head_groups); needs a GPU")
    parser.add_argument("--kv", default=",".join(bench.KV_DTYPES),
                        help=f"cache dtypes, comma-separated, among {','.join(bench.KV_DTYPES)} (vLLM's names too)")
    parser.add_argument("--tokens", default="64,256,1024,4096", help="query tokens, comma-separated")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    kv_dtypes = [bench.KV_ALIASES.get(k, k) for k in args.kv.split(",")]
    if unknown := [k for k in kv_dtypes if k not in bench.KV_DTYPES]:
        parser.error(f"--kv: unknown cache dtypes {unknown} (known: {', '.join(bench.KV_DTYPES)})")
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens: comma-separated integers, got {args.tokens!r}")
    if any(t < 1 for t in tokens):
        parser.error(f"--tokens: each at least 1, got {args.tokens!r}")
    rows = sweep(kv_dtypes, tokens)
    if args.json:
        meta = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                    sm120_occupancy=os.environ.get("SPARSE_MLA_SM120_OCCUPANCY") == "1")
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
