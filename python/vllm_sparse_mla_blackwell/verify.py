"""``python -m vllm_sparse_mla_blackwell verify``: the correctness case matrix on the GPU.

Every case draws fresh random inputs (cases.make_inputs: shuffled block tables, NaN in every cache
row no valid index refers to, NaN-poisoned outputs), runs the installed op and compares it with
the fp32 reference on the same inputs. Each axis of the matrix is a group of cases that sweeps
its values across both head sizes; the remaining axes keep a representative value. Two more
groups replay a captured CUDA graph with padded rows and run 1,000 back-to-back launches under a
timeout (which also checks that the result is bitwise deterministic).

Exit status: 0 all passed, 1 a case failed, 3 no CUDA GPU is visible.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator

import torch

from vllm_sparse_mla_blackwell import _testing, cases, envs, formats, ops
from vllm_sparse_mla_blackwell.cases import Case, CaseResult

EXIT_FAILED = 1
EXIT_NO_GPU = 3
HEAD_SIZES = formats.HEAD_SIZES
KV_16BIT = ("bf16", "fp16")
KV_FP8 = ("fp8_e4m3", "fp8_ds_mla")


def case_groups(quick: bool, kv_dtypes: tuple[str, ...]) -> dict[str, list[Case]]:
    """The matrix as named groups; ``quick`` keeps a few cases of each."""
    g: dict[str, list[Case]] = {}
    g["heads x head_size x q dtype"] = [
        Case(head_size=d, num_heads=h, q_dtype=qd, kv_cache_dtype=qd, topk=2048, num_tokens=7)
        for d in HEAD_SIZES for h in (1, 8, 16, 32, 64, 128) for qd in ("bf16", "fp16")
    ]
    g["topk"] = [
        Case(head_size=d, num_heads=16, topk=k, num_tokens=64) for d in HEAD_SIZES
        for k in (1, 7, 64, 100, 512, 2048, 2176)
    ] + [Case(head_size=d, num_heads=16, topk=2048, index_width=2176, num_tokens=64) for d in HEAD_SIZES]
    g["query tokens"] = [
        Case(head_size=d, num_heads=32, topk=2048, num_tokens=t) for d in HEAD_SIZES
        for t in (1, 2, 7, 64, 513, 4096)
    ]
    g["kv cache dtype"] = [
        Case(head_size=d, num_heads=16, topk=2048, num_tokens=64, q_dtype=qd, kv_cache_dtype=kv)
        for d in HEAD_SIZES for qd in ("bf16", "fp16") for kv in kv_dtypes
    ] + [  # fp8 at 64 heads in the planned blocks and in 32-head ones, and both kernels of each
        # fp8 format (kernel_traits.h): grids of one wave and GPUs before sm_89 decode each tile
        # once, other launches keep tiles raw, in 32-head blocks in the WideWarps kernel (planner.h
        # plan_head_groups, plan_fwd_splits, decoded_fp8_plan; which case runs which depends on
        # the GPU: on the H200 the planned fp8 64-head launches run 16-head blocks at T = 64 and
        # 32-head ones at T = 256; T = 7 decodes once)
        Case(head_size=d, num_heads=h, topk=2048, num_tokens=t, kv_cache_dtype=kv, block_heads=bh, q_dtype=qd)
        for d in HEAD_SIZES for kv in kv_dtypes if kv in KV_FP8
        for h, t, bh, qd in ((64, 64, None, "bf16"), (64, 256, None, "bf16"), (64, 64, 32, "bf16"),
                             (64, 256, 32, "bf16"), (16, 7, None, "bf16"), (64, 256, 32, "fp16"))
    ]  # the last: fp16 out, whose tighter bar sees the WideWarps fp8 kernels' P roundings
    g["32-head blocks"] = [  # the 16-bit caches' 32-head kernels, forced: the planner picks them
        # unless the 32-head plan splits into short blocks (decode; planner.h plan_head_groups)
        Case(head_size=d, num_heads=h, q_dtype=qd, kv_cache_dtype=qd, topk=2048, num_tokens=t, block_heads=32)
        for d in HEAD_SIZES for qd in ("bf16", "fp16") for h, t in ((32, 7), (64, 7), (128, 7), (32, 1), (32, 513))
    ]
    g["decode splits"] = [  # T = 1 and 2 with few rows: one-tile splits where the planner makes
        # them (planner.h kMinTilesPerSplit; on the H200 64 and 68 splits, the decode combine's two
        # variants, params.h combine_decode_loads), and a short topk_len that leaves splits empty;
        # T = 16 at 8 heads: blocks of 5 tiles, two per SM (planner.h co_resident_tile_time; on the
        # H200 14 splits, fp8 tiles raw)
        Case(head_size=d, num_heads=h, topk=k, num_tokens=t, kv_cache_dtype=kv, masking=m)
        for d in HEAD_SIZES for kv in kv_dtypes
        for h, t, k, m in ((16, 1, 2048, "random"), (8, 1, 2176, "topk_len"), (8, 2, 2048, "none"),
                           (8, 16, 2176, "random"))
    ]
    g["masking"] = [
        Case(head_size=d, num_heads=16, topk=512, num_tokens=64, masking=m) for d in HEAD_SIZES
        for m in ("none", "random", "causal", "all_masked", "invalid", "topk_len")
    ] + [  # fp8 in grids of more than one block per SM, which keep tiles raw where the planner
        # does not pick the decode-once kernel (planner.h plan_fwd_splits, decoded_fp8_plan)
        Case(head_size=d, num_heads=16, topk=512, num_tokens=300, masking=m, kv_cache_dtype=kv)
        for d in HEAD_SIZES for kv in kv_dtypes if kv in KV_FP8 for m in ("random", "topk_len")
    ]
    g["paging"] = [
        Case(head_size=d, num_heads=16, topk=2048, num_tokens=64, block_size=bs) for d in HEAD_SIZES
        for bs in (16, 64, 256)
    ]
    g["layout"] = [
        Case(head_size=d, num_heads=16, topk=512, num_tokens=64, layout=lay) for d in HEAD_SIZES
        for lay in ("contiguous", "strided", "split_q") if not (lay == "split_q" and d == 512)
    ]
    g["sm_scale"] = [
        Case(head_size=d, num_heads=16, topk=2048, num_tokens=7, sm_scale=s) for d in HEAD_SIZES
        for s in cases.SM_SCALES
    ]
    if quick:
        g = {name: cs[:: max(1, len(cs) // 3)][:3] for name, cs in g.items()}
    return g


def run_case(case: Case, device: torch.device) -> CaseResult:
    """One matrix case: its inputs (``cases.make_inputs``), the op, the fp32 comparison."""
    inputs = cases.make_inputs(case, device)
    lse = torch.full(inputs.out.shape[:2], float("nan"), dtype=torch.float32, device=device)
    out, lse = _testing.sparse_mla_fwd(
        inputs.q, inputs.kv_cache, inputs.indices, case.sm_scale, block_heads=case.block_heads, q_pe=inputs.q_pe,
        kv_cache_dtype=inputs.kv_cache_dtype, k_scale=inputs.k_scale, topk=case.topk,
        topk_len=inputs.topk_len, out=inputs.out, lse=lse,
    )
    torch.cuda.synchronize(device)
    return cases.compare(case, inputs, out, lse)


def run_graph_case(head_size: int, device: torch.device) -> CaseResult:
    """Capture at batch 8, replay with 6 real and 2 padded rows (indices -1)."""
    case = Case(head_size=head_size, num_heads=16, topk=2048, num_tokens=8, masking="none")
    inputs = cases.make_inputs(case, device)
    q = inputs.q.clone()
    indices = inputs.indices.clone()
    out = torch.empty(8, 16, formats.HEAD_SIZE_V, dtype=q.dtype, device=device)
    lse = torch.empty(8, 16, dtype=torch.float32, device=device)
    workspace = ops.get_workspace(device)

    def launch():
        ops.sparse_mla_fwd(q, inputs.kv_cache, indices, case.sm_scale, kv_cache_dtype=inputs.kv_cache_dtype,
                           k_scale=inputs.k_scale, topk=case.topk, out=out, lse=lse, workspace=workspace)

    launch()  # warm-up outside capture (sets the shared-memory attribute)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    # Replay with the batch's last two rows padded, as vLLM pads a decode batch to its graph size.
    indices[6:] = -1
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(device)
    inputs.indices = indices
    inputs.q = q
    return cases.compare(dataclasses.replace(case, masking="graph 6+2 padded"), inputs, out, lse)


def run_stress(device: torch.device, launches: int, timeout_s: float = 120.0) -> CaseResult:
    """Back-to-back launches polled against a deadline (a hang fails instead of blocking), with
    every out and lse compared bitwise against the first (determinism)."""
    case = Case(head_size=576, num_heads=64, topk=2048, num_tokens=4, masking="random")
    inputs = cases.make_inputs(case, device)
    kwargs = dict(q_pe=inputs.q_pe, kv_cache_dtype=inputs.kv_cache_dtype, k_scale=inputs.k_scale,
                  topk=case.topk, topk_len=inputs.topk_len)
    first, first_lse = ops.sparse_mla_fwd(inputs.q, inputs.kv_cache, inputs.indices, case.sm_scale, **kwargs)
    first, first_lse = first.clone(), first_lse.clone()
    mismatches = torch.zeros((), dtype=torch.int64, device=device)
    out = torch.empty_like(first)
    lse = torch.empty_like(first_lse)
    for _ in range(launches):
        ops.sparse_mla_fwd(inputs.q, inputs.kv_cache, inputs.indices, case.sm_scale, out=out, lse=lse, **kwargs)
        mismatches += (out.view(torch.int16) != first.view(torch.int16)).any()
        mismatches += (lse.view(torch.int32) != first_lse.view(torch.int32)).any()
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            return CaseResult(dataclasses.replace(case, masking=f"{launches} launches"), float("nan"),
                              float("nan"), float("nan"), False, False, False, note="TIMEOUT (hang)")
        time.sleep(0.01)
    result = cases.compare(dataclasses.replace(case, masking=f"{launches} launches"), inputs, out, lse)
    if int(mismatches) != 0:
        result.passed = False
        result.note = f"{int(mismatches)} launches differ bitwise from the first"
    else:
        result.note = "bitwise identical"
    return result


def iter_jobs(quick: bool, kv_dtypes: tuple[str, ...]) -> Iterator[tuple[str, str, Callable[[torch.device], CaseResult]]]:
    """``(group, label, job)`` for every case, then the CUDA-graph and back-to-back checks."""
    for name, cs in case_groups(quick, kv_dtypes).items():
        for c in cs:
            yield name, c.label(), (lambda dev, c=c: run_case(c, dev))
    for d in HEAD_SIZES:
        yield "cuda graph", f"D{d}", (lambda dev, d=d: run_graph_case(d, dev))
    n = 100 if quick else 1000
    yield "back-to-back launches", f"{n}x", (lambda dev, n=n: run_stress(dev, n))


def main(quick: bool = False, json_path: str | None = None, fp8: bool = True) -> int:
    """Run the matrix (``quick``: a few cases per group; ``fp8``: include the fp8 caches), print
    a table per group and a verdict, optionally write every case as JSON to ``json_path``.
    Returns the exit status: 0 all passed, 1 a case failed or the library cannot run on this
    GPU, 3 no CUDA GPU visible."""
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    console = Console()
    if not torch.cuda.is_available():
        console.print("[bold red]verify needs a CUDA GPU and none is visible[/] "
                      f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). Exit {EXIT_NO_GPU}.")
        return EXIT_NO_GPU
    if not ops.extension_available():
        console.print(f"[bold red]the op library is not built: {ops.EXTENSION_ERROR}[/]")
        return EXIT_FAILED
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    reason = ops.unsupported_device_reason((props.major, props.minor))
    if reason is not None:
        console.print(f"[bold red]{props.name}: {reason}[/]")
        return EXIT_FAILED
    console.print(f"verify on {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), "
                  f"library built for {','.join(ops.compiled_targets())}, torch {torch.__version__}\nbars: per-row rel err <= {cases.MAX_REL_ERR} against the fp32 reference "
                  f"({cases.MAX_REL_ERR_FP16} where out and the MMAs are fp16); "
                  f"per-row cosine >= {cases.MIN_COSINE} against the same; "
                  f"lse err <= {cases.MAX_LSE_ERR}; masked rows exact")
    if envs.flag(envs.E4M3_PV_ENV):
        console.print(f"{envs.E4M3_PV_ENV}=1: fp8_ds_mla's P V on e4m3 MMAs where planned, its bar {cases.MAX_REL_ERR}")
    kv_dtypes = KV_16BIT + (KV_FP8 if fp8 else ())
    jobs = list(iter_jobs(quick, kv_dtypes))
    results: dict[str, list[CaseResult]] = {}
    for group, label, job in track(jobs, description="cases", console=console, transient=False):
        device_fault = False
        try:
            r = job(device)
        except Exception as exc:  # a crash is a failed case, reported with its message
            r = CaseResult(Case(), float("nan"), float("nan"), float("nan"), False, False, False,
                           note=f"{label}: {type(exc).__name__}: {exc}")
            device_fault = isinstance(exc, getattr(torch, "AcceleratorError", ()))
        results.setdefault(group, []).append(r)
        if device_fault:
            break  # the CUDA context is unusable after a device fault

    summary = Table(title="verify summary")
    for col in ("group", "cases", "worst rel err", "min cosine", "worst lse err",
                "masked exact", "passed"):
        summary.add_column(col, justify="right" if col not in ("group",) else "left")
    for group, rs in results.items():
        failed = [r for r in rs if not r.passed]
        if failed or not quick:
            t = Table(title=group, show_lines=False)
            for col in ("case", "rel err", "cosine", "lse err", "exact", "ok"):
                t.add_column(col)
            for r in rs:
                t.add_row(r.note if r.note and not r.all_written else r.case.label(), f"{r.max_rel_err:.2e}",
                          f"{r.min_cosine:.7f}", f"{r.max_lse_err:.1e}",
                          str(r.masked_exact), "[green]pass[/]" if r.passed else f"[red]FAIL[/] {r.note}")
            console.print(t)
        summary.add_row(group, str(len(rs)), f"{max(r.max_rel_err for r in rs):.2e}",
                        f"{min(r.min_cosine for r in rs):.7f}",
                        f"{max(r.max_lse_err for r in rs):.1e}",
                        str(all(r.masked_exact for r in rs)),
                        f"[green]{len(rs) - len(failed)}/{len(rs)}[/]" if not failed else f"[red]{len(rs) - len(failed)}/{len(rs)}[/]")
    console.print(summary)
    total = sum(len(rs) for rs in results.values())
    passed = sum(r.passed for rs in results.values() for r in rs)
    verdict = "PASS" if passed == total else "FAIL"
    console.print(f"[bold]{verdict}[/]: {passed}/{total} cases passed on {props.name}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({g: [dict(dataclasses.asdict(r), case=r.case.label()) for r in rs] for g, rs in results.items()},
                      f, indent=1)
    return 0 if verdict == "PASS" else EXIT_FAILED
