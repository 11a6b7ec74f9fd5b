"""Command line: ``python -m vllm_sparse_mla_blackwell {verify,bench}``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_sparse_mla_blackwell", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="run the correctness case matrix on the GPU against an fp32 reference")
    v.add_argument("--quick", action="store_true", help="a small subset, for smoke tests")
    v.add_argument("--no-fp8", action="store_true", help="16-bit KV caches only")
    v.add_argument("--json", metavar="PATH", help="also write every case's numbers as JSON")
    b = sub.add_parser("bench", help="time GLM-5.3-Flash / DeepSeek-V3.2 shapes against the measured gather and mma.sync ceilings (needs matplotlib)")
    b.add_argument("--quick", action="store_true", help="T in (1, 64, 1024) only, short idle")
    b.add_argument("--json", default="bench.json", metavar="PATH", help="results as JSON (default bench.json)")
    b.add_argument("--png", default="bench_roofline.png", metavar="PATH", help="roofline plot (default bench_roofline.png)")
    args = parser.parse_args(argv)
    if args.command == "verify":
        from vllm_sparse_mla_blackwell import verify

        return verify.main(quick=args.quick, json_path=args.json, fp8=not args.no_fp8)
    from vllm_sparse_mla_blackwell import bench

    return bench.main(json_path=args.json, png_path=args.png, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
