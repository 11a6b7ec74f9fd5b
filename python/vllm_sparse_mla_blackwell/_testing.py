"""Knobs for the project's tests, ``verify`` and benchmarks; not part of the public API.

They force what the launch planner (``csrc/sparse_mla/planner.h``) otherwise decides, or report
what it plans with, so that every kernel configuration can be run and checked on one GPU.
"""

from __future__ import annotations

import torch

from vllm_sparse_mla_blackwell import ops

VARIANTS = ("main", "one_stage", "decoded_fp8", "paired_scores")


def sparse_mla_fwd(*args, block_heads: int | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.sparse_mla_fwd(*args, **kwargs)`` (same arguments, shapes, dtypes and errors) with the
    heads per kernel block forced: ``block_heads`` 16 or 32 (32 needs ``num_heads > 16``); ``None``
    lets the planner choose (``plan_head_groups``). The result is the same up to rounding. Raises
    ``ValueError`` for any other ``block_heads``."""
    if block_heads is not None and (isinstance(block_heads, bool) or not isinstance(block_heads, int)
                                    or block_heads not in (16, 32)):
        raise ValueError(f"block_heads must be 16, 32 or None, got {block_heads!r}")
    return ops._sparse_mla_fwd(*args, block_heads=block_heads, **kwargs)


def fwd_blocks_per_sm(dtype: torch.dtype, kv_cache_dtype: str, head_size: int, num_heads: int,
                      device: torch.device | str | int | None = None, *, variant: str = "main") -> int:
    """Blocks of the forward kernel one SM of ``device`` (default: the current CUDA device) holds
    at once, from the CUDA occupancy calculator, for q/out ``dtype`` (``torch.bfloat16`` or
    ``torch.float16``), ``kv_cache_dtype`` (``"bfloat16"``, ``"float16"``, ``"fp8_e4m3"`` or
    ``"fp8_ds_mla"``; not ``"auto"``), ``head_size`` (512 or 576) and ``num_heads``, which names
    the block: 1-16 the 16-head kernel, 17-128 the 32-head one. ``variant`` (``VARIANTS``) asks
    for one of the configuration's variants instead of its main kernel (``one_stage``: 16-head
    16-bit caches; ``decoded_fp8``: fp8 caches; ``paired_scores``: 16-head fp8_ds_mla at D = 576); 0 where the
    configuration has none. The planner plans with these counts (docs/kernel.md); with
    ``SPARSE_MLA_SM120_OCCUPANCY=1`` in the process's environment, those of an sm_120 SM. Raises
    ``ValueError`` for any other value, ``RuntimeError`` without the op library."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return int(ops._ops().fwd_blocks_per_sm(dtype, kv_cache_dtype, head_size, num_heads, ops._cuda_device(device),
                                            variant))
