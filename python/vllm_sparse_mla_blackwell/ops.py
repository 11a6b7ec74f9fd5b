"""PyTorch ops of the sparse-MLA kernel library.

The ops are registered in C++ (``csrc/torch_binding.cpp``) under ``torch.ops.sparse_mla_bw``
with ``TORCH_LIBRARY``; this module loads that library, adds fake (meta) implementations for
``torch.compile`` and a CPU implementation (the fp32 reference) so the vLLM backend runs in CPU
tests, and wraps the ops in functions with keyword arguments.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import torch

from vllm_sparse_mla_blackwell import formats, reference

NAMESPACE = "sparse_mla_bw"

LIBRARY_PATH = Path(__file__).with_name("_sparse_mla_bw.so")


def _load_library() -> Exception | None:
    # The module has no Python bindings: loading it runs its TORCH_LIBRARY registrations.
    if not LIBRARY_PATH.exists():
        return ImportError(f"{LIBRARY_PATH} not found")
    try:
        torch.ops.load_library(str(LIBRARY_PATH))
    except OSError as exc:
        return exc
    return None


EXTENSION_ERROR: Exception | None = _load_library()


def extension_available() -> bool:
    """True when the compiled op library loaded (it is built by ``pip install .``)."""
    return EXTENSION_ERROR is None


def _ops():
    if EXTENSION_ERROR is not None:
        raise RuntimeError(
            f"the sparse-MLA op library could not be loaded ({EXTENSION_ERROR}); install the "
            "package with `pip install --no-build-isolation .`"
        ) from EXTENSION_ERROR
    return getattr(torch.ops, NAMESPACE)


if EXTENSION_ERROR is None:

    def _same_device(**tensors) -> None:
        # The dispatcher sends a call with any meta tensor here, CPU tensors beside it included:
        # name the odd one out instead of returning as if it had run.
        (first, ref), *rest = [(n, t) for n, t in tensors.items() if t is not None]
        for name, t in rest:
            if t.device != ref.device:
                raise ValueError(f"{name} must be on the same device as {first} ({ref.device}), got {t.device}")

    @torch.library.register_fake(f"{NAMESPACE}::sparse_mla_fwd")
    def _sparse_mla_fwd_fake(q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace,
                             sm_scale, topk, kv_cache_dtype, block_heads=0):
        _same_device(q=q, q_pe=q_pe, kv_cache=kv_cache, indices=indices, topk_len=topk_len, k_scale=k_scale,
                     out=out, lse=lse, workspace=workspace)
        return None

    @torch.library.register_fake(f"{NAMESPACE}::concat_and_cache_sparse_mla")
    def _concat_and_cache_fake(kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype):
        _same_device(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, k_scale=k_scale)
        return None

    @torch.library.impl(f"{NAMESPACE}::sparse_mla_fwd", "CPU")
    def _sparse_mla_fwd_cpu(q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace,
                            sm_scale, topk, kv_cache_dtype, block_heads=0):
        # Same argument checks as the CUDA path, then the fp32 reference.
        torch.ops.sparse_mla_bw.check_sparse_mla_fwd(
            q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace, sm_scale, topk, kv_cache_dtype,
            block_heads,
        )
        head_size = q.shape[-1] + (0 if q_pe is None else q_pe.shape[-1])
        rows = reference.dequantize_kv_cache(kv_cache, kv_cache_dtype, head_size, k_scale)
        ref_out, ref_lse = reference.sparse_mla_reference(
            q, rows, indices, sm_scale, topk=topk if topk > 0 else None, topk_len=topk_len, q_pe=q_pe
        )
        out.copy_(ref_out)
        lse.copy_(ref_lse)

    @torch.library.impl(f"{NAMESPACE}::concat_and_cache_sparse_mla", "CPU")
    def _concat_and_cache_cpu(kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype):
        torch.ops.sparse_mla_bw.check_concat_and_cache_sparse_mla(
            kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype
        )
        reference.write_kv_cache_reference(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)


def compiled_targets() -> list[str]:
    """CUDA targets the op library was built for (``GLM53_ARCHS``), e.g. ``["120a"]`` or
    ``["80", "86", "89", "90", "120", "ptx80"]``."""
    return _ops().compiled_targets().split(",")


def unsupported_device_reason(capability: tuple[int, int]) -> str | None:
    """Why the built library cannot run on a GPU of this compute capability, or ``None``.

    CUDA's rules: machine code for ``sm_XY`` runs on X.Y and later minors of major X; an
    arch-specific ``sm_XYa`` only on X.Y itself; embedded PTX ``compute_XY`` is compiled by the
    driver for any X.Y or newer.
    """
    if not extension_available():
        return f"the sparse-MLA op library did not load ({EXTENSION_ERROR})"
    major, minor = capability
    for target in compiled_targets():
        digits = target.removeprefix("ptx").rstrip("af")
        t_major, t_minor = int(digits[:-1]), int(digits[-1])
        if target.startswith("ptx"):
            ok = (major, minor) >= (t_major, t_minor)
        elif target.endswith("a"):
            ok = (major, minor) == (t_major, t_minor)
        else:  # plain sm_XY, and family targets XYf
            ok = major == t_major and minor >= t_minor
        if ok:
            return None
    return (f"the op library was built for {','.join(compiled_targets())} (GLM53_ARCHS), which cannot run on "
            f"compute capability {major}.{minor}; rebuild with GLM53_ARCHS={major}{minor}"
            f"{'a' if major >= 9 else ''}")


def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    """``device`` as ``torch.device("cuda", index)``: an index, a CUDA device or its name
    (``"cuda:1"``); ``None`` or ``"cuda"`` is the current CUDA device. Raises ``ValueError`` for a
    device of another type."""
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


_WORKSPACES: dict[int, torch.Tensor] = {}


def get_workspace(device: torch.device | str | int | None = None) -> torch.Tensor:
    """The split-top-k workspace of a CUDA device: uint8, sized once from its SM count.

    The kernel splits the top-k axis across blocks when there are too few query tokens to fill
    the GPU (flash-decoding) and combines the partial results through this buffer. Its size
    depends only on the device, so a buffer made before CUDA-graph capture serves every batch.
    """
    device = _cuda_device(device)
    ws = _WORKSPACES.get(device.index)
    if ws is None:
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        nbytes = _ops().workspace_size(num_sms)
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
        _WORKSPACES[device.index] = ws
    return ws


def sparse_mla_fwd(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    q_pe: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    topk: int | None = None,
    topk_len: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA attention over ``topk`` gathered cache rows per query token.

    ``out[t,h] = softmax_j(sm_scale * q[t,h]·K(idx[t,j])) @ V(idx[t,j])`` over the valid slots j,
    with ``K = row[:D]``, ``V = row[:512]`` of the absorbed-MLA cache (DeepSeek-V3.2 paper, §2.1;
    vLLM ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` for the cache layout).

    Args:
        q: bf16/fp16 ``[T, H, D]`` with D in {512, 576} and H in 1..128, or the latent part
            ``[T, H, 512]`` when ``q_pe`` is given. Last dim contiguous, 16-byte aligned rows.
        kv_cache: ``[num_blocks, block_size, W]`` or ``[num_rows, W]``: bf16/fp16 rows of D values,
            fp8 e4m3 rows of D bytes (uint8 or float8_e4m3fn), or 656-byte ``fp8_ds_mla`` records.
        indices: int32 ``[T, >= topk]`` physical row ids (``block_id * block_size + offset``).
            Values outside ``[0, num_rows)`` are masked and never read.
        sm_scale: softmax scale (float; e.g. 0.135234 for DeepSeek-V3.2 with YaRN, 1/16 for GLM).
        q_pe: optional bf16/fp16 ``[T, H, 64]`` rope part of q (vLLM passes q in two parts).
        kv_cache_dtype: vLLM string: ``auto``, ``bfloat16``, ``float16``, ``fp8``, ``fp8_e4m3``,
            ``fp8_ds_mla``.
        k_scale: fp32 tensor with one element, the per-tensor scale of ``fp8``/``fp8_e4m3``.
        topk: slots per token, default ``indices.shape[1]`` (>= 1).
        topk_len: optional int32 ``[T]``: slots ``j >= topk_len[t]`` are masked.
        out: optional ``[T, H, 512]`` output in q's dtype (any strides, last dim contiguous).
        lse: optional fp32 ``[T, H]`` output, natural-log sum-exp of the valid scaled scores.
        workspace: optional uint8 buffer of ``workspace_size`` bytes; default one per device
            from ``get_workspace``.

    Returns:
        ``(out, lse)``. A token with no valid slot gets ``out = 0``, ``lse = -inf``.

    Raises:
        ValueError: any bad argument (dtype, rank, shape, device, alignment, unsupported H or
            D, topk < 1, sm_scale not a finite float32, tensors on different devices, meta ones
            included), naming the argument, before any launch; nothing is written then.
        RuntimeError: the op library is not built, or a CUDA error.
    """
    return _sparse_mla_fwd(q, kv_cache, indices, sm_scale, q_pe=q_pe, kv_cache_dtype=kv_cache_dtype, k_scale=k_scale,
                           topk=topk, topk_len=topk_len, out=out, lse=lse, workspace=workspace)


def _sparse_mla_fwd(q, kv_cache, indices, sm_scale, *, q_pe=None, kv_cache_dtype="auto", k_scale=None, topk=None,
                    topk_len=None, out=None, lse=None, workspace=None, block_heads=None):
    """sparse_mla_fwd, with the heads per kernel block forced where ``block_heads`` is 16 or 32
    (``_testing.sparse_mla_fwd`` checks it)."""
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int)):
        raise ValueError(f"topk must be an int or None, got {topk!r}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise ValueError(f"sm_scale must be a finite float32 (a real number, not a tensor), got {sm_scale!r}")
    if q.dim() != 3 and (out is None or lse is None):
        raise ValueError(f"q must have 3 dims [num_tokens, num_heads, head_size], got shape {tuple(q.shape)}")
    num_tokens, num_heads = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty(num_tokens, num_heads, formats.HEAD_SIZE_V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if workspace is None and q.is_cuda:
        workspace = get_workspace(q.device)
    _ops().sparse_mla_fwd(
        q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace,
        float(sm_scale), -1 if topk is None else topk, kv_cache_dtype,
        0 if block_heads is None else block_heads,
    )
    return out, lse


def concat_and_cache_sparse_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | None = None,
) -> None:
    """Write new tokens into the sparse-MLA cache (vLLM ``concat_and_cache_mla`` convention).

    Args:
        kv_c: bf16/fp16 ``[T, 512]`` latent.
        k_pe: bf16/fp16 ``[T, 64]`` rope part, or ``None`` for NoPE (head_size 512).
        kv_cache: cache rows as in ``sparse_mla_fwd`` (bf16/fp16 rows, uint8 or float8_e4m3fn
            fp8 rows, or uint8 656-byte ``fp8_ds_mla`` records), ``[num_rows, W]`` or
            ``[num_blocks, block_size, W]``, written in place. The block stride may exceed
            ``block_size`` rows (vLLM's block-outer layouts, where a layer's view skips the other
            caches that share each block); blocks must not overlap.
        slot_mapping: int64 ``[T]`` slots, row ``s % block_size`` of block ``s // block_size``
            as in vLLM's ``concat_and_cache_mla``; ``-1`` skips a token, and so does any slot
            outside the cache (never written out of bounds).
        kv_cache_dtype: as in ``sparse_mla_fwd``. ``fp8_ds_mla`` scales follow vLLM (per 128
            values ``amax / 448``); NoPE records get zero rope bytes.
        k_scale: fp32 one-element tensor for ``fp8``/``fp8_e4m3`` (stored values are ``x / k_scale``).

    Raises:
        ValueError: bad arguments, naming the argument, before anything is written.
        RuntimeError: the op library is not built, or a CUDA error.
    """
    _ops().concat_and_cache_sparse_mla(kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype)
