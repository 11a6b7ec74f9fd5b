"""``python -m vllm_sparse_mla_blackwell bench``: decode/prefill timing against measured
ceilings.

For every shape (model x heads x query tokens) and cache dtype it times the kernel as vLLM runs
it, in a CUDA graph of back-to-back calls (median of 5 replays after ~50 ms of warm-up; index
sets rotated so that calls do not hit each other's rows in L2; about a second of idle before
each (shape, cache dtype) timing, as a GPU slows under sustained load: bench/HISTORY.md v16), and
in the same run measures the ceilings with the project's own kernels: the random-row gather of
the same rows at the same slots, the mma.sync bf16 and fp16 peaks and, on GPUs of compute
capability 8.9 or newer, the mma.sync e4m3 one (sm_90 has no e4m3 mma.sync: there ptxas emulates
it with conversions and f16 MMAs, the figure measures that emulation and is no roof for the fp8
rows, ``mma_sync_e4m3_emulated``). It prints a table and writes a JSON file (run metadata
``mma_sync_peak_tflops`` (bf16), ``mma_sync_fp16_peak_tflops``, ``mma_sync_e4m3_peak_tflops``:
None where not measured or, in older files, absent; ``e4m3_pv``: whether the e4m3 P V option was
set, docs/kernel.md) and a roofline PNG.

Reported per shape: µs, gathered GB/s (T·topk·row_bytes / time) and its fraction of the gather
ceiling, TFLOP/s (2·T·H·topk·(D+512)) and its fraction of the bf16 mma.sync peak (for the fp8
caches also of a native e4m3 one), fp8/bf16 time ratio, and the speed-up over the naive PyTorch
formulation (index_select + einsum + softmax).
Where vLLM is installed and the GPU has them, vLLM's own sparse-MLA kernels are timed the same way
on the same cache rows and indices (``PEERS``), each checked against this kernel's output first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time

import torch

from vllm_sparse_mla_blackwell import cases, envs, formats, ops

MODELS = {
    # name: (head_size D, topk, heads per rank, sm_scale)
    "GLM-5.3-Flash": (512, 2176, (64, 32, 16, 8), 1.0 / 16),
    "DeepSeek-V3.2": (576, 2048, (128, 64, 16), 0.135234),
}
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")  # every cache format the kernel reads
KV_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8_e4m3"}  # vLLM's --kv-cache-dtype names
POOL_ROWS = 1 << 18  # 256K rows: 302 MB at 1152 B/row, far beyond L2
INDEX_SETS = 4
NAIVE_MAX_TOKENS = 64


@dataclasses.dataclass
class Row:
    model: str
    head_size: int
    num_heads: int
    topk: int
    num_tokens: int
    kv_cache_dtype: str
    us: float
    gather_us: float
    gathered_gbps: float
    gather_frac: float
    tflops: float
    mma_frac: float  # of the bf16 mma.sync peak
    e4m3_frac: float | None = None  # of the e4m3 one: fp8 caches where it is native (not sm_90)
    fp8_over_bf16: float | None = None
    naive_us: float | None = None
    peer_us: dict[str, float] = dataclasses.field(default_factory=dict)  # vLLM kernel -> µs
    peer_rel_err: dict[str, float] = dataclasses.field(default_factory=dict)  # its worst row vs ours


def _median_ms(fn, reps: int, sets: int) -> float:
    """Per-call time of fn(i % sets), as vLLM runs decode: `reps` calls captured in one CUDA
    graph, replayed 5 times after a warm-up long enough for the clocks to ramp up; the median
    replay over reps."""
    torch.cuda.synchronize()
    deadline = time.monotonic() + 0.05  # ~50 ms of work: clocks up after the idle
    i = 0
    while time.monotonic() < deadline or i < 3:
        fn(i % sets)
        i += 1
        if i % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(reps):
            fn(i % sets)
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def _reps(estimate_ms: float) -> int:
    """Enough calls per graph for ~20 ms of work, between 4 and 200."""
    return int(min(200, max(4, 20 / max(estimate_ms, 1e-3))))


def time_ms(fn, sets: int = INDEX_SETS) -> float:
    """Per-call time in ms of fn(i % sets), timed as ``_median_ms`` does with enough calls per graph
    for ~20 ms of work (from a 2-call estimate)."""
    return _median_ms(fn, _reps(_median_ms(fn, 2, sets)), sets)


def measure_mma_peak(device, dtype: str = "bf16") -> float | None:
    """mma.sync peak in TFLOP/s of ``dtype``: "bf16" or "fp16" (m16n8k16) or "e4m3" (m16n8k32),
    fp32 accumulators, register-only loop on every SM. None for e4m3 where the GPU (compute
    capability below 8.9) or the library's build for it has no e4m3 MMA."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = sms * 4
    sink = torch.zeros(blocks * 8, device=device)
    iters = 20000
    try:
        flops = torch.ops.sparse_mla_bw.bench_mma_sync_peak(sink, blocks, iters, dtype)
    except NotImplementedError:  # raised before anything is launched
        return None
    ms = _median_ms(lambda _: torch.ops.sparse_mla_bw.bench_mma_sync_peak(sink, blocks, iters, dtype), 4, 1)
    return flops / (ms * 1e-3) / 1e12


def cache_layout(kv_dtype: str, head_size: int) -> tuple[torch.dtype, int]:
    """The pool's element dtype and elements per row for a bench cache dtype (``KV_DTYPES``):
    16-bit caches hold ``head_size`` values of their dtype (``cases.DTYPES``), fp8 ones their row
    bytes as uint8 (``formats.kv_row_bytes``: 576 / 512, or fp8_ds_mla's 656-byte record)."""
    width = formats.kv_row_bytes(formats.KV_CACHE_DTYPES[kv_dtype], head_size)
    if kv_dtype in cases.DTYPES:
        return cases.DTYPES[kv_dtype], width // 2
    return torch.uint8, width


def random_pool(kv_dtype: str, head_size: int, device) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """bench's cache: POOL_ROWS rows of random bf16 latent (and rope) values (seed 0) written in
    ``kv_dtype``'s format (a ``KV_DTYPES`` name) by the project's cache writer, as
    [POOL_ROWS / 64, 64, row width] (``cache_layout``). Returns the cache, the vLLM
    ``kv_cache_dtype`` name, and fp8_e4m3's per-tensor ``k_scale`` (0.02; None otherwise)."""
    gen = torch.Generator(device=device).manual_seed(0)
    kv_c = torch.randn(POOL_ROWS, 512, device=device, generator=gen, dtype=torch.bfloat16)
    k_pe = (torch.randn(POOL_ROWS, head_size - 512, device=device, generator=gen, dtype=torch.bfloat16)
            if head_size > 512 else None)
    name = formats.KV_CACHE_DTYPES[kv_dtype]
    dtype, width = cache_layout(kv_dtype, head_size)
    cache = torch.empty(POOL_ROWS // 64, 64, width, dtype=dtype, device=device)
    k_scale = torch.tensor([0.02], device=device) if kv_dtype == "fp8_e4m3" else None
    ops.concat_and_cache_sparse_mla(kv_c, k_pe, cache, torch.arange(POOL_ROWS, device=device), name, k_scale)
    return cache, name, k_scale


def _naive(q, rows, idx, sm_scale):
    """What a user would write: gather, two einsums, softmax (bf16 math)."""
    k = rows.index_select(0, idx.flatten().long()).view(idx.shape[0], idx.shape[1], -1)
    s = torch.einsum("thd,tjd->thj", q, k[..., : q.shape[-1]]).float() * sm_scale
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.einsum("thj,tjd->thd", p, k[..., :512])


# vLLM's sparse-MLA kernels, by the cache dtype they read (vLLM 0.33: FlashMLA's sparse prefill
# and fp8 decode, sm_90 / sm_100; FA3's paged attention with the indices as a page-1 block
# table, sm_90, as vllm/v1/attention/backends/mla/flashmla_sparse.py and flashattn_mla_sparse.py
# call them).
PEERS = {"bf16": ("FlashMLA-sparse", "FA3-sparse"), "fp16": ("FA3-sparse",), "fp8_ds_mla": ("FlashMLA-fp8",)}
# A peer whose output differs more from this kernel's (per row) is reported, not timed: a misused
# interface (a wrong layout, a missing normalisation) differs by far more. Within them a peer may
# compute in less precision (FlashMLA's fp8 decode differed by 2.2-3.0 % on the H200) and is
# timed with its difference reported (Row.peer_rel_err).
PEER_MIN_COSINE = 0.999
PEER_MAX_REL_ERR = 5e-2


def _peer_call(peer: str, q, cache, idx_sets, sm_scale, num_heads: int):
    """A callable ``f(i) -> out [T, num_heads, 512]`` running vLLM's kernel ``peer`` on index set
    i, with its operands prepared outside the timed call (heads padded to what the kernel takes,
    as vLLM does; q in the cache's dtype for FA3). Raises ImportError / RuntimeError where vLLM or
    the kernel is not available."""
    num_tokens, _, head_size = q.shape
    if peer == "FlashMLA-sparse":
        from vllm.v1.attention.ops.flashmla import flash_mla_sparse_fwd, is_flashmla_sparse_supported

        ok, why = is_flashmla_sparse_supported()
        if not ok:
            raise RuntimeError(why)
        kv = cache.view(-1, 1, head_size)
        idx3 = [i.view(num_tokens, 1, -1) for i in idx_sets]
        # sm_90 takes 8-128 heads, sm_100 multiples of 64 (vLLM pads there).
        padded = num_heads if torch.cuda.get_device_capability(q.device)[0] != 10 else -(-num_heads // 64) * 64
        qp = q if padded == num_heads else torch.cat([q, q.new_zeros(num_tokens, padded - num_heads, head_size)], 1)
        return lambda i: flash_mla_sparse_fwd(qp, kv, idx3[i], sm_scale)[0][:, :num_heads]
    if peer == "FlashMLA-fp8":
        from vllm.v1.attention.ops.flashmla import (flash_mla_with_kvcache, get_mla_metadata,
                                                    is_flashmla_sparse_supported)

        ok, why = is_flashmla_sparse_supported()
        if not ok or head_size != 576:
            raise RuntimeError(why or "FlashMLA's fp8 sparse decode reads DeepSeek's 576-wide record only")
        padded = 64 if num_heads <= 64 else 128  # the heads its fp8 decode kernel takes
        qp = q.new_zeros(num_tokens, 1, padded, head_size)
        qp[:, 0, :num_heads] = q
        records = cache.view(torch.uint8)
        k_cache = records.view(-1, 64, 1, records.shape[-1])
        block_table = torch.zeros(num_tokens, 1, dtype=torch.int32, device=q.device)
        seqlens = torch.full((num_tokens,), POOL_ROWS, dtype=torch.int32, device=q.device)
        meta = get_mla_metadata()[0]  # filled by the first call, reused for this shape
        idx3 = [i.view(num_tokens, 1, -1) for i in idx_sets]
        return lambda i: flash_mla_with_kvcache(qp, k_cache, block_table, seqlens, 512, meta, softmax_scale=sm_scale,
                                                is_fp8_kvcache=True, indices=idx3[i])[0][:, 0, :num_heads]
    if peer == "FA3-sparse":
        from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func, is_fa_version_supported

        if not is_fa_version_supported(3):
            raise RuntimeError("FA3 is not supported on this GPU")
        rows = cache.view(-1, head_size)
        v = rows[:, :512].unsqueeze(1).unsqueeze(1)
        q = q.to(rows.dtype)  # FA3 takes q, k and v of one dtype
        q_nope = q[..., :512].contiguous()
        if head_size > 512:
            q_rope, k = q[..., 512:].contiguous(), rows[:, 512:].unsqueeze(1).unsqueeze(1)
        else:  # NoPE: FA3 needs a 64-wide q/k part; zeros leave the scores to q_v
            q_rope, k = q.new_zeros(num_tokens, num_heads, 64), v[..., :64]
        cu_seqlens_q = torch.arange(num_tokens + 1, dtype=torch.int32, device=q.device)
        topk = idx_sets[0].shape[1]
        seqused = torch.full((num_tokens,), topk, dtype=torch.int32, device=q.device)
        return lambda i: flash_attn_varlen_func(q=q_rope, k=k, v=v, q_v=q_nope, max_seqlen_q=1, cu_seqlens_q=cu_seqlens_q,
                                                max_seqlen_k=topk, seqused_k=seqused, block_table=idx_sets[i],
                                                softmax_scale=sm_scale, causal=True, fa_version=3)
    raise ValueError(f"unknown peer {peer!r}")


def _time_peers(kv_dtype, q, cache, idx_sets, sm_scale, ours: torch.Tensor, est_ms: float,
                notes: dict[str, str], rel_errs: dict[str, float]) -> dict[str, float]:
    """µs per call of each of vLLM's kernels for ``kv_dtype`` (PEERS) on the same rows and index
    sets. A peer that cannot run, or whose output on index set 0 has a per-row cosine below
    PEER_MIN_COSINE or a per-row relative error above PEER_MAX_REL_ERR against ``ours`` (this
    kernel's, same inputs), is left out with a line in ``notes``; the relative error of each timed
    one goes into ``rel_errs``."""
    timed = {}
    for peer in PEERS.get(kv_dtype, ()):
        try:
            call = _peer_call(peer, q, cache, idx_sets, sm_scale, ours.shape[1])
            rel, cos = cases.row_metrics(call(0).float(), ours.float())
            if not (cos >= PEER_MIN_COSINE and rel <= PEER_MAX_REL_ERR):
                raise RuntimeError(f"output differs from this kernel's (min row cosine {cos:.4f}, "
                                   f"max row relative error {rel:.2e})")
            timed[peer] = _median_ms(call, _reps(est_ms), INDEX_SETS) * 1e3
            rel_errs[peer] = rel
        except Exception as exc:  # reported, never fatal: the peers are optional
            notes.setdefault(f"{peer} ({kv_dtype}, D={q.shape[-1]}, H={q.shape[1]})", f"{type(exc).__name__}: {exc}"[:300])
    return timed


def run(models=MODELS, tokens=TOKENS, kv_dtypes=KV_DTYPES, idle_s: float = 1.0, naive: bool = True,
        peers: bool = True, progress=None) -> tuple[list[Row], dict]:
    """Time every (model, heads, tokens) shape for each cache dtype, with the gather ceiling at
    the same slots, each after ``idle_s`` seconds of idle (without it between dtypes, the third
    of four ran up to 1.31x slower: bench/HISTORY.md v16); ``naive`` adds the PyTorch baseline for
    T <= 64 (bf16 only), ``peers`` vLLM's kernels where they run (PEERS). ``progress`` wraps the
    shape list (e.g. ``rich.progress.track``).
    Returns the rows (µs, GB/s, TFLOP/s and their fractions of the ceilings) and run metadata
    (device, measured mma.sync bf16, fp16 and e4m3 peaks, date)."""
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    mma_peak = measure_mma_peak(device)
    fp16_peak = measure_mma_peak(device, "fp16")  # beside bf16's: the fp16 cache's and fp8's MMA
    e4m3_peak = measure_mma_peak(device, "e4m3")
    e4m3_emulated = e4m3_peak is not None and props.major == 9  # Hopper: conversions + f16 MMAs
    rows_out: list[Row] = []
    gen = torch.Generator(device=device).manual_seed(1)
    checksum = torch.zeros(1024, dtype=torch.int32, device=device)
    ws = ops.get_workspace(device)
    shapes = [(m, h, t) for m, (d, k, hs, s) in models.items() for h in hs for t in tokens]
    pools: dict[tuple[str, int], tuple] = {}
    peer_notes: dict[str, str] = {}
    for model, num_heads, num_tokens in (progress(shapes) if progress else shapes):
        head_size, topk, _, sm_scale = models[model]
        q = torch.randn(num_tokens, num_heads, head_size, device=device, dtype=torch.bfloat16, generator=gen)
        idx_sets = [torch.randint(0, POOL_ROWS, (num_tokens, topk), device=device, dtype=torch.int32, generator=gen)
                    for _ in range(INDEX_SETS)]
        out = torch.empty(num_tokens, num_heads, 512, device=device, dtype=torch.bfloat16)
        lse = torch.empty(num_tokens, num_heads, device=device)
        flops = 2.0 * num_tokens * num_heads * topk * (head_size + 512)
        by_dtype: dict[str, Row] = {}
        for kv_dtype in kv_dtypes:
            key = (kv_dtype, head_size)
            if key not in pools:
                pools[key] = random_pool(kv_dtype, head_size, device)
            cache, name, k_scale = pools[key]
            row_bytes = formats.kv_row_bytes(name, head_size)
            flat = cache.view(torch.uint8).view(POOL_ROWS, row_bytes)

            def attn(i):
                ops.sparse_mla_fwd(q, cache, idx_sets[i], sm_scale, kv_cache_dtype=name, k_scale=k_scale,
                                   out=out, lse=lse, workspace=ws)

            def gather(i):
                torch.ops.sparse_mla_bw.bench_gather_rows(flat, idx_sets[i], checksum)

            time.sleep(idle_s)
            est = _median_ms(attn, 2, INDEX_SETS)
            ms = _median_ms(attn, _reps(est), INDEX_SETS)
            gms = _median_ms(gather, _reps(est), INDEX_SETS)
            nbytes = num_tokens * topk * row_bytes
            tflops = flops / (ms * 1e-3) / 1e12
            row = Row(model, head_size, num_heads, topk, num_tokens, kv_dtype, ms * 1e3, gms * 1e3,
                      nbytes / (ms * 1e-3) / 1e9, gms / ms, tflops, tflops / mma_peak)
            if kv_dtype.startswith("fp8") and e4m3_peak is not None and not e4m3_emulated:
                row.e4m3_frac = tflops / e4m3_peak
            if kv_dtype.startswith("fp8") and "bf16" in by_dtype:
                row.fp8_over_bf16 = by_dtype["bf16"].us / row.us
            if naive and kv_dtype == "bf16" and num_tokens <= NAIVE_MAX_TOKENS:
                rows_bf16 = cache.view(POOL_ROWS, head_size)
                row.naive_us = _median_ms(lambda i: _naive(q, rows_bf16, idx_sets[i], sm_scale), 4, INDEX_SETS) * 1e3
            if peers:
                attn(0)
                row.peer_us = _time_peers(kv_dtype, q, cache, idx_sets, sm_scale, out, est, peer_notes,
                                          row.peer_rel_err)
            by_dtype[kv_dtype] = row
            rows_out.append(row)
    meta = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                mma_sync_peak_tflops=mma_peak, mma_sync_fp16_peak_tflops=fp16_peak,
                mma_sync_e4m3_peak_tflops=e4m3_peak, mma_sync_e4m3_emulated=e4m3_emulated, pool_rows=POOL_ROWS,
                date=time.strftime("%Y-%m-%d"), peers_not_run=peer_notes,
                e4m3_pv=envs.flag(envs.E4M3_PV_ENV))
    return rows_out, meta


def roofline_png(rows: list[Row], meta: dict, path: str) -> None:
    """Write a log-log roofline (FLOP per gathered byte against TFLOP/s) with one point per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    gather_peak = max(r.gathered_gbps / r.gather_frac for r in rows)  # best gather ceiling seen
    xs = [10 ** (i / 20) for i in range(-20, 81)]
    ax.plot(xs, [min(meta["mma_sync_peak_tflops"], x * gather_peak / 1e3) for x in xs], "k-",
            label=f"roofline: gather {gather_peak:.0f} GB/s, mma.sync {meta['mma_sync_peak_tflops']:.0f} TFLOP/s")
    e4m3_peak = meta.get("mma_sync_e4m3_peak_tflops")  # absent in older files
    if e4m3_peak is not None and not meta.get("mma_sync_e4m3_emulated"):
        ax.plot(xs, [min(e4m3_peak, x * gather_peak / 1e3) for x in xs], "k--",
                label=f"the fp8 caches' roof: mma.sync e4m3 {e4m3_peak:.0f} TFLOP/s")
    markers = {"bf16": "o", "fp16": "D", "fp8_e4m3": "s", "fp8_ds_mla": "^"}
    for r in rows:
        intensity = 2.0 * r.num_heads * (r.head_size + 512) / formats.kv_row_bytes(
            formats.KV_CACHE_DTYPES[r.kv_cache_dtype], r.head_size)
        ax.scatter(intensity, r.tflops, marker=markers[r.kv_cache_dtype], s=12 + 4 * math.log2(r.num_tokens + 1),
                   c="C0" if r.head_size == 512 else "C1", alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per gathered byte (2·H·(D+512) / row bytes)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"sparse-MLA on {meta['device']} ({meta['date']}): blue D=512, orange D=576; "
                 "o bf16, D fp16, s fp8_e4m3, ^ fp8_ds_mla; size ~ log T", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _percent(frac: float | None) -> str:
    return "" if frac is None else f"{100 * frac:.0f}"


def results_table(rows: list[Row], meta: dict):
    """The printed table: one line per row under a title with the measured peaks. ``meta``: of
    ``run`` or of a bench JSON file; needs ``device``, ``date`` and ``mma_sync_peak_tflops``
    (KeyError otherwise), the fp16 and e4m3 peaks may be absent (older files)."""
    from rich.table import Table

    def peak(key):
        value = meta.get(key)
        return "not measured" if value is None else f"{value:.0f}"

    e4m3 = peak("mma_sync_e4m3_peak_tflops")
    if meta.get("mma_sync_e4m3_emulated"):
        e4m3 += " (emulated: conversions + f16 MMAs, not the fp8 rows' roof)"
    option = f"; {envs.E4M3_PV_ENV}=1 (fp8_ds_mla's P V on e4m3 MMAs)" if meta.get("e4m3_pv") else ""
    table = Table(title=f"sparse-MLA on {meta['device']}, {meta['date']}; measured mma.sync peaks, TFLOP/s: bf16 "
                        f"{meta['mma_sync_peak_tflops']:.0f}, fp16 {peak('mma_sync_fp16_peak_tflops')}, e4m3 {e4m3}"
                        f"{option}")
    for col in ("model", "H", "T", "kv", "µs", "gather µs", "GB/s", "% gather", "TFLOP/s", "% bf16 mma", "% e4m3 mma",
                "fp8 speed-up", "naive µs", "x naive", "vLLM kernel µs (its time / ours; differs from ours by)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.model, str(r.num_heads), str(r.num_tokens), r.kv_cache_dtype, f"{r.us:.1f}", f"{r.gather_us:.1f}",
                      f"{r.gathered_gbps:.0f}", _percent(r.gather_frac), f"{r.tflops:.1f}", _percent(r.mma_frac),
                      _percent(r.e4m3_frac), "" if r.fp8_over_bf16 is None else f"{r.fp8_over_bf16:.2f}",
                      "" if r.naive_us is None else f"{r.naive_us:.0f}",
                      "" if r.naive_us is None else f"{r.naive_us / r.us:.0f}",
                      "; ".join(f"{k} {v:.1f} ({v / r.us:.2f}; {r.peer_rel_err.get(k, math.nan):.1e})"
                                for k, v in r.peer_us.items()))
    return table


def main(json_path: str = "bench.json", png_path: str = "bench_roofline.png", quick: bool = False,
         tokens: tuple[int, ...] | None = None, kv_dtypes: tuple[str, ...] | None = None,
         models: tuple[str, ...] | None = None, naive: bool = True, peers: bool = True) -> int:
    """Run ``run`` (``quick``: T in 1, 64, 1024 and a short idle; ``tokens``, ``kv_dtypes``,
    ``models`` narrow the shapes, ``naive`` adds the PyTorch baseline, ``peers`` vLLM's kernels
    where vLLM is installed), print the table, write JSON and PNG. Returns the exit status: 0 done,
    1 matplotlib missing or the library cannot run on this GPU, 2 an unknown model or cache dtype,
    3 no GPU."""
    from rich.console import Console
    from rich.progress import track

    console = Console()
    kv_dtypes = None if kv_dtypes is None else tuple(KV_ALIASES.get(k, k) for k in kv_dtypes)
    by_lower = {m.lower(): m for m in MODELS}  # e2e spells them in lower case
    models = None if models is None else tuple(by_lower.get(m.lower(), m) for m in models)
    unknown = sorted(set(kv_dtypes or ()) - set(KV_DTYPES)) + sorted(set(models or ()) - set(MODELS))
    if unknown:
        console.print(f"[bold red]bench: unknown cache dtype or model: {', '.join(unknown)}[/] "
                      f"(cache dtypes: {', '.join(KV_DTYPES)} or vLLM's {', '.join(KV_ALIASES)}; "
                      f"models: {', '.join(MODELS)})")
        return 2
    if not torch.cuda.is_available():
        console.print("[bold red]bench needs a CUDA GPU and none is visible.[/] Exit 3.")
        return 3
    try:
        import matplotlib  # noqa: F401  (checked before the run, used for the roofline PNG)
    except ImportError:
        console.print("[bold red]bench writes a roofline PNG with matplotlib: pip install matplotlib[/]")
        return 1
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    reason = ops.unsupported_device_reason((props.major, props.minor))
    if reason is not None:
        console.print(f"[bold red]{props.name}: {reason}[/]")
        return 1
    tokens = tokens or ((1, 64, 1024) if quick else TOKENS)
    kv_dtypes = tuple(k for k in KV_DTYPES if k in (kv_dtypes or KV_DTYPES))  # bf16 first: fp8 ratios
    rows, meta = run(models={m: MODELS[m] for m in (models or MODELS)}, tokens=tokens, kv_dtypes=kv_dtypes,
                     idle_s=0.2 if quick else 1.0, naive=naive, peers=peers,
                     progress=lambda s: track(s, description="shapes", console=console))
    table = results_table(rows, meta)
    console.print(table)
    for peer, why in meta["peers_not_run"].items():
        console.print(f"not timed: {peer}: {why}")
    with open(json_path, "w") as f:
        json.dump(dict(meta=meta, rows=[dataclasses.asdict(r) for r in rows]), f, indent=1)
    roofline_png(rows, meta, png_path)
    console.print(f"wrote {json_path} and {png_path}")
    return 0
