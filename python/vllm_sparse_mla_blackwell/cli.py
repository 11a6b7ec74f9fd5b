"""Command line: ``python -m vllm_sparse_mla_blackwell {verify,bench,e2e,serve}``."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_sparse_mla_blackwell",
        description="Sparse-MLA attention for vLLM on consumer and workstation GPUs: check it, time it, run it in vLLM.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="run the correctness case matrix on the GPU against an fp32 reference")
    v.add_argument("--quick", action="store_true", help="a small subset, for smoke tests")
    v.add_argument("--no-fp8", action="store_true", help="16-bit KV caches only")
    v.add_argument("--json", metavar="PATH", help="also write every case's numbers as JSON")
    b = sub.add_parser("bench", help="time GLM-5.3-Flash / DeepSeek-V3.2 shapes against the measured gather and mma.sync ceilings (needs matplotlib)")
    b.add_argument("--quick", action="store_true", help="T in (1, 64, 1024) only, short idle")
    b.add_argument("--json", default="bench.json", metavar="PATH", help="results as JSON (default bench.json)")
    b.add_argument("--png", default="bench_roofline.png", metavar="PATH", help="roofline plot (default bench_roofline.png)")
    # Repeated options add up (--kv bf16 --kv fp8_e4m3); duplicates are dropped below.
    b.add_argument("--tokens", type=_ints, action="extend", metavar="T,T,...",
                   help=f"query-token counts, 1..{MAX_BENCH_TOKENS} (default: the decode and prefill set; --quick: 1,64,1024)")
    b.add_argument("--kv", type=_names, action="extend", metavar="DTYPE,...",
                   help="cache dtypes among bf16,fp16,fp8_e4m3,fp8_ds_mla, or vLLM's bfloat16,float16,fp8 (default all)")
    b.add_argument("--models", type=_names, action="extend", metavar="NAME,...",
                   help="GLM-5.3-Flash and/or DeepSeek-V3.2 (default both)")
    b.add_argument("--no-naive", action="store_true", help="skip the naive PyTorch baseline")
    b.add_argument("--no-peers", action="store_true",
                   help="skip vLLM's own sparse-MLA kernels (timed where vLLM is installed and the GPU has them)")
    e = sub.add_parser("e2e", help="serve tiny DeepSeek-V3.2 and GLM-5.3-Flash models in vLLM through this backend "
                       "and through references; compare greedy tokens, logits, throughput and KV capacity "
                       "(needs vLLM and a GPU)")
    _add_model_run_options(e, "model configs and per-run results")
    e.add_argument("--kv", type=_names, action="extend", metavar="DTYPE,...",
                   help="kv cache dtypes among bfloat16,fp8,fp8_ds_mla (default all)")
    e.add_argument("--modes", type=_names, action="extend", metavar="MODE,...",
                   help="eager and/or graphs (enforce_eager=False: vLLM's default CUDA graphs; default both)")
    e.add_argument("--quick", action="store_true", help="half the prompts, 8 generated steps, a small batch")
    e.add_argument("--time-budget", type=float, default=3600, metavar="SECONDS",
                   help="start no run that would end after this many seconds (default 3600); skipped runs fail")
    s = sub.add_parser("serve", help="write tiny DeepSeek-V3.2 and GLM-5.3-Flash checkpoints, serve them with `vllm serve` "
                       "through this backend, send token-id completions one by one and concurrently, compare with "
                       "vLLM in-process, check the backend in every worker and a clean shutdown (needs vLLM and a GPU)")
    _add_model_run_options(s, "checkpoints, server logs and answers")
    s.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N", help="GPUs per server (default 1)")
    s.add_argument("--timeout", type=float, default=1200, metavar="SECONDS",
                   help="time limit of the whole check (default 1200); each server's shutdown may take 60 s more")
    args = parser.parse_args(argv)
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return _run(args)
    os.environ["COLUMNS"] = "200"  # redirected to a file or a CI log: rich would cut tables to 80 columns
    try:
        return _run(args)
    finally:
        del os.environ["COLUMNS"]


def _run(args: argparse.Namespace) -> int:
    if args.command == "e2e":
        from vllm_sparse_mla_blackwell import e2e

        return e2e.main(models=_unique(args.models), kv_dtypes=_unique(args.kv), modes=_unique(args.modes),
                        quick=args.quick, json_path=args.json, work_dir=args.work_dir,
                        time_budget_s=args.time_budget)
    if args.command == "serve":
        from vllm_sparse_mla_blackwell import serve_check

        return serve_check.main(models=_unique(args.models), tp=args.tensor_parallel_size, json_path=args.json,
                                work_dir=args.work_dir, timeout_s=args.timeout)
    if args.command == "verify":
        from vllm_sparse_mla_blackwell import verify

        return verify.main(quick=args.quick, json_path=args.json, fp8=not args.no_fp8)
    from vllm_sparse_mla_blackwell import bench

    return bench.main(json_path=args.json, png_path=args.png, quick=args.quick, tokens=_unique(args.tokens),
                      kv_dtypes=_unique(args.kv), models=_unique(args.models), naive=not args.no_naive,
                      peers=not args.no_peers)


def _add_model_run_options(parser: argparse.ArgumentParser, work_dir_holds: str) -> None:
    """--models, --json and --work-dir, as e2e and serve take them."""
    parser.add_argument("--models", type=_names, action="extend", metavar="NAME,...",
                        help="deepseek-v3.2, glm-5.3-flash, deepseek-v3.2-fp16 (default: the first two)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--work-dir", metavar="DIR", help=f"{work_dir_holds} (default: a new temp dir)")


MAX_BENCH_TOKENS = 65535  # the gather ceiling kernel puts tokens on grid.y


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_BENCH_TOKENS:
        raise argparse.ArgumentTypeError(f"expected integers in 1..{MAX_BENCH_TOKENS}, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return values


def _unique(values: list | None) -> tuple | None:
    return None if values is None else tuple(dict.fromkeys(values))


if __name__ == "__main__":
    sys.exit(main())
