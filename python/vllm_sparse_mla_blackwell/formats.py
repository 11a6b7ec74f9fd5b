"""Model and cache-format constants.

The C++ side defines the same facts in ``csrc/sparse_mla/formats.h``;
``tests/test_ops_cpu.py::test_format_constants_agree_with_cpp`` checks that the two agree through
``torch.ops.sparse_mla_bw.format_constants``.
"""

from __future__ import annotations

import torch

#: Latent (compressed KV) width of MLA, ``kv_lora_rank`` in DeepSeek-V3 / GLM-5 configs.
KV_LORA_RANK = 512
#: Rope part of the key, ``qk_rope_head_dim``: 64 for DeepSeek-V3.2 / GLM-5, 0 for NoPE models.
QK_ROPE_HEAD_DIM = 64
#: Supported ``head_size`` values of the absorbed-MLA cache row: 512 (NoPE) and 576.
HEAD_SIZES = (KV_LORA_RANK, KV_LORA_RANK + QK_ROPE_HEAD_DIM)
#: Value (output) width of absorbed MLA.
HEAD_SIZE_V = KV_LORA_RANK
#: Heads per tensor-parallel rank the kernel accepts.
MAX_NUM_HEADS = 128
#: Opt-in shared memory per block on sm_86/89/120/121: every kernel instantiation fits in it.
SMEM_BUDGET_BYTES = 101_376

# vLLM's ``fp8_ds_mla`` record (vllm/v1/attention/backends/mla/flashmla_sparse.py and
# vLLM's csrc/cache_kernels.cu ``concat_and_cache_ds_mla``): 512 e4m3 latent values, four fp32 scales
# (one per 128 values), 64 bf16 rope values.
FP8_DS_MLA_RECORD_BYTES = 656
FP8_DS_MLA_SCALE_OFFSET = 512
FP8_DS_MLA_ROPE_OFFSET = 528
FP8_DS_MLA_TILE = 128
FP8_E4M3_MAX = 448.0

#: ``kv_cache_dtype`` strings accepted, mapped to the format the kernel reads.
KV_CACHE_DTYPES = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_ds_mla": "fp8_ds_mla",
}


def canonical_kv_cache_dtype(kv_cache_dtype: str, kv_cache: torch.Tensor) -> str:
    """Map a vLLM ``kv_cache_dtype`` string to one of ``bfloat16``, ``float16``, ``fp8_e4m3``,
    ``fp8_ds_mla``. ``auto`` takes the cache tensor's dtype.

    Raises:
        ValueError: an unknown string, or ``auto`` with a cache that is not bf16/fp16.
    """
    name = KV_CACHE_DTYPES.get(kv_cache_dtype)
    if name is None:
        raise ValueError(
            f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    if name == "auto":
        if kv_cache.dtype == torch.bfloat16:
            return "bfloat16"
        if kv_cache.dtype == torch.float16:
            return "float16"
        raise ValueError(
            f"kv_cache_dtype='auto' needs a bfloat16 or float16 kv_cache, got {kv_cache.dtype}"
        )
    return name


def kv_row_bytes(kv_cache_dtype: str, head_size: int) -> int:
    """Bytes of one cache row (one token) for a canonical ``kv_cache_dtype``."""
    if kv_cache_dtype in ("bfloat16", "float16"):
        return 2 * head_size
    if kv_cache_dtype == "fp8_e4m3":
        return head_size
    if kv_cache_dtype == "fp8_ds_mla":
        return FP8_DS_MLA_RECORD_BYTES
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")
