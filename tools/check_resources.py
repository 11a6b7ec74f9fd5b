#!/usr/bin/env python3
"""Build-time resource check of every kernel in a compiled binary.

Reads ``cuobjdump --dump-resource-usage`` of the module: registers, static shared memory, stack
and local memory per kernel and per target. The forward kernels carry their dynamic
shared-memory size as their last template argument (see sparse_mla_fwd_kernel.cuh), so the
launch size is read from the binary too. Fails (exit 1) if any kernel on any target needs more
than 101,376 bytes of shared memory or uses stack/local memory (register spills).

Usage: check_resources.py [--cuobjdump PATH] [--report FILE.md] BINARY
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys

SMEM_BUDGET_BYTES = 101_376  # csrc/sparse_mla/formats.h kSmemBudgetBytes


def demangle(names: list[str]) -> list[str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def parse(text: str) -> list[dict]:
    rows, arch, func = [], None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and func:
            reg, stack, shared, local = map(int, m.groups())
            rows.append(dict(arch=arch, mangled=func, reg=reg, stack=stack, shared=shared, local=local))
            func = None
    return rows


def short_name(demangled: str) -> tuple[str, int]:
    """A readable kernel name and its dynamic shared-memory bytes (0 if not encoded)."""
    name = demangled.replace("(anonymous namespace)::", "").replace("sparse_mla::", "")
    for value, fmt in enumerate(("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")):
        name = name.replace(f"(KvFormat){value}", f"{fmt} cache")
    for value, mma in enumerate(("bf16", "e4m3", "fp16")):  # the ceiling's MmaPeakType
        name = name.replace(f"(MmaPeakType){value}", mma)
    dyn = 0
    m = re.match(r".*?(sparse_mla_fwd_kernel)<SparseMlaFwdTraits<(.*?)>, (\d+)>", name)
    if m:
        dyn = int(m.group(3))
        # The traits' arguments, defaults included (kernel_traits.h SparseMlaFwdTraits).
        q, cache, head_size, groups, stages, raw_fp8, paired, e4m3_pv, wide = (
            m.group(2).replace("__nv_bfloat16", "bf16").replace("__half", "fp16").split(", "))
        parts = [q, cache, head_size, f"{16 * int(groups)} heads"]
        parts += [label for on, label in ((stages == "1", "one stage"), (raw_fp8 == "false", "decoded tiles"),
                                          (paired == "true", "paired scores"), (e4m3_pv == "true", "e4m3 P V"),
                                          (wide == "true", "wide warps")) if on]
        name = f"fwd<{', '.join(parts)}>"
    else:
        name = re.sub(r"^void ", "", name[: name.rfind("(")]).replace("__nv_bfloat16", "bf16").replace("__half", "fp16")
    return name, dyn


def find_cuobjdump(hint: str | None) -> str:
    """cuobjdump from the hint, PATH, CUDA_HOME, or a Python package that carries one (Triton's
    NVIDIA backend, nvidia-cuda-cuobjdump): the CUDA toolkit image of a build machine may lack it."""
    if hint:
        if os.path.isfile(hint) and os.access(hint, os.X_OK):
            return hint
        raise SystemExit(f"cuobjdump: '{hint}' is not an executable file")
    candidates = [shutil.which("cuobjdump"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    for pkg, rel in (("triton", "backends/nvidia/bin/cuobjdump"), ("nvidia.cuda_cuobjdump", "bin/cuobjdump")):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            candidates.append(os.path.join(loc, rel))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SystemExit("cuobjdump not found (install the CUDA toolkit's cuobjdump or "
                     "`pip install nvidia-cuda-cuobjdump`)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: searched for)")
    ap.add_argument("--report", help="write the table as Markdown here")
    args = ap.parse_args()
    text = subprocess.run([find_cuobjdump(args.cuobjdump), "--dump-resource-usage", args.binary],
                          capture_output=True, text=True, check=True).stdout
    rows = parse(text)
    if not rows:
        print(f"check_resources: no kernels found in {args.binary}", file=sys.stderr)
        return 1
    for row, dem in zip(rows, demangle([r["mangled"] for r in rows])):
        row["name"], row["dynamic"] = short_name(dem)
        row["total"] = row["shared"] + row["dynamic"]
        # sm_90 has no e4m3 MMA: ptxas emulates it with conversions and f16 MMAs, whose registers
        # the e4m3 P V variant (a measuring option there, for its accuracy) may spill.
        spills_allowed = row["arch"] == "sm_90" and "e4m3 P V" in row["name"]
        row["ok"] = row["total"] <= SMEM_BUDGET_BYTES and (spills_allowed or (row["stack"] == 0 and row["local"] == 0))
    rows.sort(key=lambda r: (r["arch"], r["name"]))
    lines = [
        f"Kernel resources of {args.binary.split('/')[-1]} (budget {SMEM_BUDGET_BYTES:,} B shared memory per block, no spills)",
        "",
        "| target | kernel | registers | static smem | dynamic smem | total smem | stack | local | ok |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['name']} | {r['reg']} | {r['shared']} | {r['dynamic']} | "
                     f"{r['total']:,} | {r['stack']} | {r['local']} | {'yes' if r['ok'] else 'NO'} |")
    bad = [r for r in rows if not r["ok"]]
    lines += ["", f"{len(rows)} kernel images checked, {len(bad)} over budget or spilling."]
    report = "\n".join(lines)
    print(report)
    if args.report:
        with open(args.report, "w") as f:
            f.write(report + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
