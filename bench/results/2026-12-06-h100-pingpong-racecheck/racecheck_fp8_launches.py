"""racecheck of the fp8 32-head raw-tile launches (the ping-pong kernel) only."""
import torch
from vllm_sparse_mla_blackwell import cases, verify
dev = torch.device("cuda")
n = 2 * torch.cuda.get_device_properties(dev).multi_processor_count + 8
bad = []
for kv in ("fp8_e4m3", "fp8_ds_mla"):
    for d in (512, 576):
        c = cases.Case(head_size=d, num_heads=32, topk=96, num_tokens=n, kv_cache_dtype=kv, masking="topk_len", block_heads=32)
        r = verify.run_case(c, dev)
        print(c.label(), r.passed, flush=True)
        if not r.passed: bad.append(c.label())
print("rc_fp8:", "all passed" if not bad else bad)
raise SystemExit(1 if bad else 0)
