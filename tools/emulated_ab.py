"""A/B of kernel changes on the CPU, through the kernel emulation (tests/emulation): the same
launches on the same inputs in this tree and in a copy per change, each against verify's bars,
and whether the outputs are the same bit for bit.

    python tools/emulated_ab.py clocks=bench/candidates/v34-phase-clocks.diff [NAME=DIFF ...]

For each NAME=DIFF: the tracked files of this tree (with its uncommitted changes) copied to
scratch, DIFF applied there (git apply), the emulator built there, and every launch of LAUNCHES
run in both trees (three warp schedules for each). Prints one row per launch and change: each
tree's worst relative error and whether it passes verify's bars (cases.compare), and whether out
and lse are bitwise equal to this tree's. Exit 0 if every change passes everywhere, 1 if one
fails a bar (bitwise differences are reported, not failed: a change may round otherwise), 2 on
an error (a diff that does not apply, a build that fails). Bitwise equality here is the
emulation's (its MMAs sum in double): where a change runs the same MMAs on the same operands in
the same order, it shows; it does not replace tools/bitwise_ab.py on the GPU. About a minute per
change on 2 cores (the build is most of it).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import subprocess
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import emulation  # noqa: E402

from vllm_sparse_mla_blackwell import cases  # noqa: E402

# Every configuration at 32 heads per block (WideWarps but for fp16 q with a bf16 cache) and at
# 16, 4 tiles with random masking; the lazy rescale's rising maxima; a split launch.
LAUNCHES = [
    (cases.Case(head_size=d, num_heads=h, topk=128, num_tokens=2, q_dtype=q, kv_cache_dtype=kv, masking="random",
                block_heads=h), {})
    for q, kv, d, h in itertools.product(("bf16", "fp16"), ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"), (512, 576),
                                         (16, 32))
] + [
    (cases.Case(num_heads=32, topk=256, num_tokens=2, q_dtype=q, kv_cache_dtype=kv, row_ramp=3.0, block_heads=32), {})
    for q, kv in (("fp16", "fp16"), ("bf16", "fp8_e4m3"), ("fp16", "fp8_e4m3"), ("bf16", "fp8_ds_mla"),
                  ("fp16", "fp8_ds_mla"))
] + [(cases.Case(num_heads=32, topk=256, num_tokens=2, block_heads=32), dict(num_splits=3))]


def copy_tree(dest: pathlib.Path) -> None:
    """This tree's tracked files as they are on disk (uncommitted changes included) into dest."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tar = subprocess.run(["tar", "-c", "--null", "-T", "-"], cwd=ROOT, input=files, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar.stdout, check=True)


def run_launches(emulator: emulation.Emulator) -> list[tuple[cases.CaseResult, torch.Tensor, torch.Tensor]]:
    results = []
    for (case, launch), schedule in itertools.product(LAUNCHES, emulation.SCHEDULES):
        try:
            inputs, lse = emulator.run_case(case, schedule=schedule, **launch)
        except emulation.EmulationError as e:  # a hang or the like: a failed launch, named in the table
            nan = float("nan")
            results.append((cases.CaseResult(case, nan, nan, nan, False, False, False, note=str(e)),
                            torch.empty(0), torch.empty(0)))
            continue
        results.append((cases.compare(case, inputs, inputs.out, lse), inputs.out.clone(), lse))
    return results


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).all())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("changes", nargs="+", metavar="NAME=DIFF", help="a name and a diff (git apply -p1) against this tree")
    args = ap.parse_args()
    changes = []
    for spec in args.changes:
        name, sep, diff = spec.partition("=")
        if not sep or not name or not pathlib.Path(diff).is_file():
            print(f"emulated_ab: NAME=DIFF with an existing diff file expected, got '{spec}'", file=sys.stderr)
            return 2
        changes.append((name, pathlib.Path(diff).resolve()))
    with tempfile.TemporaryDirectory(prefix="emulated_ab_") as scratch:
        scratch = pathlib.Path(scratch)
        try:
            base = run_launches(emulation.Emulator(emulation.build(scratch / "build-base")))
        except subprocess.CalledProcessError as e:
            print(f"emulated_ab: this tree's emulator did not build:\n{e.stdout}\n{e.stderr}", file=sys.stderr)
            return 2
        failed = any(not r.passed for r, _, _ in base)
        rows = []
        for name, diff in changes:
            tree = scratch / f"tree-{name}"
            tree.mkdir()
            copy_tree(tree)
            applied = subprocess.run(["git", "apply", "-p1", str(diff)], cwd=tree, capture_output=True, text=True)
            if applied.returncode != 0:
                print(f"emulated_ab: {name}: {diff} does not apply: {applied.stderr.strip()}", file=sys.stderr)
                return 2
            try:
                library = emulation.build(scratch / f"build-{name}", root=tree)
            except subprocess.CalledProcessError as e:
                print(f"emulated_ab: {name}: the emulator did not build:\n{e.stdout}\n{e.stderr}", file=sys.stderr)
                return 2
            for (b, b_out, b_lse), (c, c_out, c_lse) in zip(base, run_launches(emulation.Emulator(library))):
                same = bitwise_equal(b_out, c_out) and bitwise_equal(b_lse, c_lse)
                rows.append((name, b, c, same))
                failed |= not c.passed
    launches_per_change = len(base)
    print("| change | launch (x 3 schedules) | base rel err | change rel err | passes | bitwise same |")
    print("| --- | --- | ---: | ---: | --- | --- |")
    for i in range(0, len(rows), len(emulation.SCHEDULES)):
        group = rows[i : i + len(emulation.SCHEDULES)]
        name, b, c, _ = group[0]
        print(f"| {name} | {b.case.label()} | {max(r[1].max_rel_err for r in group):.3g} | "
              f"{max(r[2].max_rel_err for r in group):.3g} | {all(r[2].passed for r in group)} | "
              f"{all(r[3] for r in group)} |")
    for name, b, c, _ in rows:
        for which, r in (("this tree", b), (name, c)):
            if r.note:
                print(f"{which}: {r.case.label()}: {r.note}")
    for name, _ in changes:
        mine = [r for r in rows if r[0] == name]
        print(f"{name}: {sum(r[2].passed for r in mine)} of {launches_per_change} launches pass, "
              f"{sum(r[3] for r in mine)} bitwise the same as this tree's")
    if any(not r.passed for r, _, _ in base):
        print("this tree itself fails a launch", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
