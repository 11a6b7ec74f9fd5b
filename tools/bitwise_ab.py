"""Bitwise A/B check of two builds: the same launches, the same inputs, compared bit for bit.

    PYTHONPATH=/tmp/A python tools/bitwise_ab.py save /tmp/bw_A [--kv bf16,fp16] [--q-dtype fp16]
    PYTHONPATH=/tmp/B python tools/bitwise_ab.py save /tmp/bw_B [--kv bf16,fp16] [--q-dtype fp16]
    python tools/bitwise_ab.py cmp /tmp/bw_A /tmp/bw_B

For a kernel change that should not move a single output bit (addressing, instruction order,
placement of copies), this is a stronger check than ``verify``'s error bars. ``save`` runs the op
on D in {512, 576} x {16, 24, 32, 64, 128} heads x T in {1, 8, 64, 300} tokens x the given caches
(topk 2048, 30 % of the slots masked; inputs from ``cases.make_inputs``, whose seeds do not depend
on the process; q in bf16, fp16 with the fp16 cache, or --q-dtype's for every cache) and writes
each launch's out and lse to FOLDER, whose launches from an earlier ``save`` it removes first.
``cmp`` compares two such folders (NaN-safe: the bits are compared) and prints, per launch that
differs, the largest difference; exit 1 if any launch differs or the folders hold different
launches. Needs a CUDA GPU for ``save``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

HEAD_SIZES = (512, 576)
NUM_HEADS = (16, 24, 32, 64, 128)
NUM_TOKENS = (1, 8, 64, 300)
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")
Q_DTYPES = ("bf16", "fp16")


def q_dtype_for(kv: str, q_dtype: str | None) -> str:
    """q's dtype for a launch on cache ``kv``: ``q_dtype`` where given, else fp16 for the fp16
    cache and bf16 for the others (the models' own pairs)."""
    return q_dtype or ("fp16" if kv == "fp16" else "bf16")


def fresh_folder(folder: str) -> None:
    """Create ``folder`` if it is missing and remove the launch files (``*.pt``) an earlier
    ``save`` left there, so that it holds this run's launches only (a folder reused for other
    caches would otherwise make ``cmp`` report different launch sets)."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.endswith(".pt"):
            os.remove(os.path.join(folder, name))


def save(folder: str, kv_dtypes: list[str], q_dtype: str | None = None) -> None:
    """Run the module docstring's launches for each cache dtype in ``kv_dtypes`` (names of
    ``KV_DTYPES``; q in ``q_dtype_for(kv, q_dtype)``) and write ``(out, lse)`` of each,
    out ``[T, H, 512]`` in q's dtype and lse fp32 ``[T, H]`` on the CPU, to
    ``FOLDER/{kv}_D{head_size}_H{num_heads}_T{num_tokens}.pt``, after ``fresh_folder``. Needs a
    CUDA GPU and the built package; the op's own errors propagate."""
    from vllm_sparse_mla_blackwell import cases, ops

    device = torch.device("cuda")
    fresh_folder(folder)
    n = 0
    for kv, head_size, num_heads, num_tokens in itertools.product(kv_dtypes, HEAD_SIZES, NUM_HEADS, NUM_TOKENS):
        case = cases.Case(head_size=head_size, num_heads=num_heads, num_tokens=num_tokens,
                          q_dtype=q_dtype_for(kv, q_dtype),
                          kv_cache_dtype=kv, masking="random")
        inputs = cases.make_inputs(case, device)
        out, lse = ops.sparse_mla_fwd(inputs.q, inputs.kv_cache, inputs.indices, case.sm_scale,
                                      q_pe=inputs.q_pe, kv_cache_dtype=inputs.kv_cache_dtype,
                                      k_scale=inputs.k_scale, topk=case.topk, out=inputs.out)
        torch.cuda.synchronize(device)
        torch.save((out.cpu(), lse.cpu()), os.path.join(folder, f"{kv}_D{head_size}_H{num_heads}_T{num_tokens}.pt"))
        n += 1
    print(f"saved {n} launches to {folder}")


def cmp(folder_a: str, folder_b: str) -> int:
    """Compare two folders written by ``save``, bit for bit (out as int16, lse as int32, so NaN
    and -inf compare by their bits). Prints each launch that differs with its largest absolute
    difference (inf where either side holds a NaN), then the count. Returns 0 if every launch is
    identical and both folders hold the same launches, else 1."""
    names_a, names_b = set(os.listdir(folder_a)), set(os.listdir(folder_b))
    if names_a != names_b:
        print(f"the folders hold different launches: {sorted(names_a ^ names_b)}")
        return 1
    differ = 0
    for name in sorted(names_a):
        out_a, lse_a = torch.load(os.path.join(folder_a, name))
        out_b, lse_b = torch.load(os.path.join(folder_b, name))
        same_out = torch.equal(out_a.view(torch.int16), out_b.view(torch.int16))
        same_lse = torch.equal(lse_a.view(torch.int32), lse_b.view(torch.int32))
        if not (same_out and same_lse):
            differ += 1
            d_out = (out_a.float() - out_b.float()).abs().nan_to_num(float("inf")).max().item()
            d_lse = (lse_a - lse_b).abs().nan_to_num(float("inf")).max().item()
            print(f"differs: {name}  max |out diff| {d_out:.3g}  max |lse diff| {d_lse:.3g}")
    print(f"bitwise identical: {len(names_a) - differ}/{len(names_a)} launches")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ap_save = sub.add_parser("save", help="run the launches and write their outputs to FOLDER")
    ap_save.add_argument("folder")
    ap_save.add_argument("--kv", default=",".join(KV_DTYPES), help=f"comma-separated cache dtypes of {KV_DTYPES}")
    ap_save.add_argument("--q-dtype", choices=Q_DTYPES,
                         help="q's dtype for every cache (default: fp16 with the fp16 cache, else bf16)")
    ap_cmp = sub.add_parser("cmp", help="compare two folders written by save")
    ap_cmp.add_argument("folder_a")
    ap_cmp.add_argument("folder_b")
    args = ap.parse_args()
    if args.command == "cmp":
        return cmp(args.folder_a, args.folder_b)
    kv_dtypes = args.kv.split(",")
    unknown = [kv for kv in kv_dtypes if kv not in KV_DTYPES]
    if unknown:
        ap.error(f"--kv: unknown cache dtypes {unknown}, expected some of {KV_DTYPES}")
    save(args.folder, kv_dtypes, args.q_dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
