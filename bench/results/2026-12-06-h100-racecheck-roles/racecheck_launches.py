"""racecheck bisect: fp8 32-head launches of several shapes; a CASE line after each launch."""
import os, torch
from vllm_sparse_mla_blackwell import cases, verify
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
shapes = [(96, 2 * sms + 8, "topk_len"), (96, 2 * sms + 8, "none"), (32, 2 * sms + 8, "none"),
          (64, 2 * sms + 8, "none"), (256, 2 * sms + 8, "none"), (96, 8, "none"), (96, 1, "none")]
if os.environ.get("RC_SHAPES"):  # topk:T:masking,...
    shapes = [(int(a), int(b), c) for a, b, c in (x.split(":") for x in os.environ["RC_SHAPES"].split(","))]
for kv in os.environ.get("RC_KV", "fp8_e4m3,fp8_ds_mla").split(","):
    for topk, n, masking in shapes:
        c = cases.Case(head_size=512, num_heads=32, topk=topk, num_tokens=n, kv_cache_dtype=kv, masking=masking, block_heads=32)
        r = verify.run_case(c, dev)
        print("CASE", kv, f"topk{topk} T{n} {masking}", "passed" if r.passed else "FAILED", flush=True)
