#!/usr/bin/env python3
"""Whether two trees compile to the same forward kernels: SASS of every kernel configuration, compared.

A change that leaves every kernel's SASS as it was (instructions, operands and control bits, with
addresses left out) needs no new GPU run of its device code: the GPU already ran that code. This
compiles each of the 32 instantiations of csrc/sparse_mla/instantiations/fwd_instantiation.cu.in
(q dtype x cache format x head size x head groups, as CMakeLists.txt does) for each target, at two
trees, and compares the kernels function by function. A tree is a git revision or WORKTREE (the
files as they are now). What it does not see: host code (launch_template.cuh's grid and variant
choice, dispatch.cu, planner.cpp), the cache-write kernels, and another nvcc than this one (its
version is printed).

Compiled SASS is kept in --cache under the hash of the tree's csrc/, the nvcc version and flags,
so that a base compiled once is not compiled again (about 2 minutes a tree for sm_90 and sm_120a
on 2 cores). Exit 0 if every kernel is the same, 1 if one differs, 2 on an error (nvcc or
cuobjdump missing or failing, a revision git does not know, a bad argument).

Usage: sass_diff.py [--archs sm_90,sm_120a] [--only SUBSTR] [--show N] [--loops] [--jobs N] [--cache DIR]
                    BASE [HEAD]   (HEAD defaults to WORKTREE)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import itertools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_resources import demangle, find_cuobjdump, short_name  # noqa: E402
from sass_waits import kernels, loops, opcode  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKTREE = "WORKTREE"
# CMakeLists.txt's instantiation loops, in its order: (file stem, ELEMENT, FORMAT, HEAD_DIM, HEAD_GROUPS).
CONFIGS = [
    (f"fwd_{dtype}_{fmt}_d{d}_h{g}", element, fmt, d, g)
    for (dtype, element), fmt, d, g in itertools.product(
        (("bf16", "__nv_bfloat16"), ("fp16", "__half")), ("kBFloat16", "kFloat16", "kFp8E4m3", "kFp8DsMla"),
        (512, 576), (1, 2))
]
# The build's flags for kernel code (CMakeLists.txt target_compile_options), as a cubin.
NVCC_FLAGS = ["-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr", "-cubin"]
_NVDISASM = "the pip package's cuobjdump needs nvdisasm on PATH (pip install nvidia-cuda-nvdisasm)"


class Failure(Exception):
    """An error the tool reports in one line and exits 2 for."""


def tree_csrc(rev: str, scratch: pathlib.Path) -> pathlib.Path:
    """The csrc/ folder of `rev`: the repository's own for WORKTREE, else `git archive` into scratch."""
    if rev == WORKTREE:
        return REPO / "csrc"
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                      capture_output=True).returncode != 0:
        raise Failure(f"BASE/HEAD: git does not know revision '{rev}'")
    out = scratch / hashlib.sha256(rev.encode()).hexdigest()[:12]
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "csrc"], capture_output=True)
    if archive.returncode != 0:
        raise Failure(f"BASE/HEAD: revision '{rev}' has no csrc/: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "csrc"


def tree_hash(csrc: pathlib.Path) -> str:
    """sha256 over every file's path and bytes below csrc."""
    h = hashlib.sha256()
    for f in sorted(p for p in csrc.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(csrc)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def nvcc_version(nvcc: str) -> str:
    run = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    if run.returncode != 0:
        raise Failure(f"--nvcc: '{nvcc} --version' failed: {run.stderr.strip()}")
    return run.stdout


Kernels = dict[str, list[tuple[int, str, int]]]  # mangled name -> [(address, instruction, control bits)]


def checked(sass: str, what: str) -> Kernels:
    """The kernels of a SASS dump, if every function in it has instructions (a dump without
    nvdisasm has none)."""
    bodies = kernels(sass)
    if not bodies or any(not body for _, _, body in bodies):
        raise Failure(f"{what}: cuobjdump printed a function without instructions; {_NVDISASM}")
    return {name: body for _, name, body in bodies}


def compile_sass(csrc: pathlib.Path, digest: str, config: tuple, arch: str, nvcc: str, cuobjdump: str,
                 cache: pathlib.Path) -> Kernels:
    """The kernels of one configuration for one target (cuobjdump -sass), from the cache when it
    is there."""
    stem, element, fmt, d, g = config
    what = f"{stem} for {arch}"
    cached = cache / digest[:24] / arch / f"{stem}.sass"
    if cached.exists():
        return checked(cached.read_text(), f"{what} (cached in {cached})")
    template = (csrc / "sparse_mla" / "instantiations" / "fwd_instantiation.cu.in").read_text()
    source = (template.replace("@ELEMENT@", element).replace("@FORMAT@", fmt)
              .replace("@HEAD_DIM@", str(d)).replace("@HEAD_GROUPS@", str(g)))
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = pathlib.Path(tmp) / f"{stem}.cu", pathlib.Path(tmp) / f"{stem}.cubin"
        cu.write_text(source)
        number = arch.removeprefix("sm_")
        cmd = [nvcc, *NVCC_FLAGS, f"-gencode=arch=compute_{number},code={arch}", f"-I{csrc}",
               f"-I{csrc / 'sparse_mla'}", "-o", str(cubin), str(cu)]
        build = subprocess.run(cmd, capture_output=True, text=True)
        if build.returncode != 0:
            raise Failure(f"{what} did not compile:\n{build.stderr[-4000:]}")
        dump = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True)
        if dump.returncode != 0:
            raise Failure(f"{what}: cuobjdump failed: {dump.stderr.strip()[-500:]}; {_NVDISASM}")
    parsed = checked(dump.stdout, what)
    # Written whole or not at all: a run cut short leaves no half file for later runs to trust.
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(dump.stdout)
    os.replace(partial, cached)
    return parsed


def functions(parsed: Kernels) -> dict[str, list[tuple[str, int]]]:
    """Mangled name -> [(instruction, control bits)], addresses left out."""
    return {name: [(text, control) for _, text, control in body] for name, body in parsed.items()}


def tile_loop(body: list[tuple[int, str, int]]) -> tuple[int, int] | None:
    """(instructions, HMMAs) of a kernel's largest loop, its tile loop; None without a loop."""
    spans = loops(body)
    if not spans:
        return None
    first, last = max(spans, key=lambda span: span[1] - span[0])
    return last - first + 1, sum(opcode(text).startswith("HMMA") for _, text, _ in body[first:last + 1])


def compare(base: dict[str, list], head: dict[str, list]) -> list[tuple[str, str]]:
    """(function, what differs) for every function that is not the same in both."""
    out = []
    for name in sorted(set(base) | set(head)):
        if name not in head:
            out.append((name, "only in BASE"))
        elif name not in base:
            out.append((name, "only in HEAD"))
        elif base[name] != head[name]:
            b, h = base[name], head[name]
            first = next((i for i, (x, y) in enumerate(zip(b, h)) if x != y), min(len(b), len(h)))
            out.append((name, f"{len(b)} -> {len(h)} instructions, first difference at instruction {first}"))
    return out


def readable(demangled: str) -> str:
    """check_resources' short kernel name, or the demangled one where its traits do not parse."""
    try:
        return short_name(demangled)[0]
    except ValueError:
        return demangled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", metavar="BASE", help=f"git revision or {WORKTREE}")
    ap.add_argument("head", metavar="HEAD", nargs="?", default=WORKTREE, help=f"git revision or {WORKTREE} (default)")
    ap.add_argument("--archs", default="sm_90,sm_120a", help="targets, comma-separated (default sm_90,sm_120a)")
    ap.add_argument("--only", default="", help="configurations whose file stem contains this, e.g. kFp8DsMla_d576_h2")
    ap.add_argument("--show", type=int, default=0, metavar="N",
                    help="print up to N lines of a unified diff of each differing kernel (instruction, control bits)")
    ap.add_argument("--loops", action="store_true",
                    help="with each differing kernel, its tile loop's instructions and HMMAs at BASE and HEAD")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "sparse_mla_sass_cache"),
                    help="folder of compiled SASS, per tree hash")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args(argv)
    try:
        return run(args)
    except Failure as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    archs = list(dict.fromkeys(a.strip() for a in args.archs.split(",")))
    if not archs or any(not re.fullmatch(r"sm_\d+[af]?", a) for a in archs):
        raise Failure(f"--archs: comma-separated targets such as sm_90,sm_120a, got '{args.archs}'")
    configs = [c for c in CONFIGS if args.only in c[0]]
    if not configs:
        raise Failure(f"--only: no configuration's stem contains '{args.only}' (e.g. fwd_bf16_kFp8DsMla_d576_h2)")
    if args.jobs < 1:
        raise Failure(f"--jobs: at least 1, got {args.jobs}")
    if not os.access(args.nvcc, os.X_OK):
        raise Failure(f"--nvcc: '{args.nvcc}' is not an executable file")
    try:
        cuobjdump = find_cuobjdump(args.cuobjdump)
    except SystemExit as e:
        raise Failure(str(e)) from None
    version = nvcc_version(args.nvcc)
    salt = hashlib.sha256((version + " ".join(NVCC_FLAGS)).encode()).hexdigest()
    cache = pathlib.Path(args.cache)

    with tempfile.TemporaryDirectory() as scratch:
        trees = {}
        for rev in (args.base, args.head):
            csrc = tree_csrc(rev, pathlib.Path(scratch))
            trees[rev] = (csrc, hashlib.sha256((tree_hash(csrc) + salt).encode()).hexdigest())
        pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
        try:
            jobs = {(rev, config[0], arch): pool.submit(compile_sass, csrc, digest, config, arch, args.nvcc, cuobjdump,
                                                       cache)
                    for rev, (csrc, digest) in trees.items() for config in configs for arch in archs}
            parsed = {key: job.result() for key, job in jobs.items()}
        except OSError as e:
            raise Failure(f"--cache '{cache}': {e}") from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    release = re.search(r"release [^\n]*", version)
    print(f"BASE {args.base} against HEAD {args.head}: {len(configs)} configurations x {', '.join(archs)}"
          f" (nvcc {release.group(0) if release else 'version unknown'})")
    print("| configuration | target | kernels | differing |")
    print("| --- | --- | ---: | --- |")
    differing = {arch: 0 for arch in archs}
    for (stem, *_), arch in itertools.product(configs, archs):
        bodies = [parsed[rev, stem, arch] for rev in (args.base, args.head)]
        base, head = functions(bodies[0]), functions(bodies[1])
        diffs = compare(base, head)
        if args.loops:
            for i, (name, what) in enumerate(diffs):
                b, h = (tile_loop(k[name]) if name in k else None for k in bodies)
                if b and h:
                    diffs[i] = (name, f"{what}; tile loop {b[0]} -> {h[0]} instructions, {b[1]} -> {h[1]} HMMA")
        differing[arch] += bool(diffs)
        names = demangle([n for n, _ in diffs])
        listed = "; ".join(f"{readable(d)}: {what}" for d, (_, what) in zip(names, diffs)) or "none"
        print(f"| {stem} | {arch} | {len(set(base) | set(head))} | {listed} |")
        for name, _ in diffs if args.show else []:
            lines = ([f"{text}  [{control:06x}]" for text, control in base.get(name, [])],
                     [f"{text}  [{control:06x}]" for text, control in head.get(name, [])])
            for line in list(difflib.unified_diff(*lines, "BASE", "HEAD", n=2, lineterm=""))[:args.show]:
                print("    " + line)
    for arch in archs:
        print(f"{arch}: {len(configs) - differing[arch]} of {len(configs)} configurations identical")
    return 1 if any(differing.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
