"""The vLLM sparse-MLA attention backend over this package's ops.

One file in the shape of vLLM's own backends (``vllm/v1/attention/backends/mla/``):

- ``SparseMLABlackwellBackend``: static facts (name, dtypes, head sizes, cache layout, compute
  capability) that vLLM's selector checks through ``AttentionBackend.validate_configuration``.
- ``SparseMLABlackwellMetadataBuilder``: vLLM's shared sparse-MLA builder
  (``SparseMLACommonMetadataBuilder``) plus a CPU path for ``req_id_per_token``.
- ``SparseMLABlackwellImpl``: vLLM's shared sparse-MLA impl (``SparseMLACommonImpl``: top-k
  buffer sharing, index groups) with a ``forward_mqa`` that converts the indexer's logical top-k
  to physical cache rows and runs ``ops.sparse_mla_fwd`` for prefill and decode tokens alike.
- ``register()``: called by the ``vllm.general_plugins`` entry point (``plugins.py``) when
  ``VLLM_GLM53_CUDA_SPARSE_MLA=1``; registers the backend under ``SPARSE_MLA_BLACKWELL`` and puts
  it first in the CUDA platform's MLA priority list, so that sparse-MLA models pick it without
  ``--attention-backend``.

Written against vLLM 0.33.0; see ``docs/vllm_backend.md`` for what older releases lack.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.sparse_utils import triton_convert_req_index_to_global_index
from vllm.v1.worker.workspace import current_workspace_manager, is_workspace_manager_initialized

from vllm_sparse_mla_blackwell import formats, ops, reference

# Newer than the shared sparse-MLA base; where a vLLM release lacks one, the backend does without
# (docs/vllm_backend.md). Only vLLM 0.33.0, which has them all, is tested.
try:
    from vllm.v1.attention.backend import max_decode_query_len
except ImportError:  # pragma: no cover - older vLLM
    max_decode_query_len = None
try:
    from vllm.v1.attention.backends.mla.index_group import HiSparseMLAIndexGroup
except ImportError:  # pragma: no cover - older vLLM: no HiSparse host caches, no index groups
    HiSparseMLAIndexGroup = ()
try:
    from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows, flat_kv_row_view
except ImportError:  # pragma: no cover - older vLLM: one contiguous cache tensor per layer
    align_blocks_to_rows = None

    def flat_kv_row_view(kv_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
        return kv_cache.view(-1, kv_cache.shape[-1]), block_size


if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheSpec

# Under the "vllm." namespace so that the line goes through vLLM's handler and format.
logger = init_logger(f"vllm.{__name__}")

#: Name in ``AttentionBackendEnum`` (``--attention-backend SPARSE_MLA_BLACKWELL``).
BACKEND_NAME = "SPARSE_MLA_BLACKWELL"
#: Qualified name vLLM resolves the enum member to.
BACKEND_CLASS_PATH = f"{__name__}.SparseMLABlackwellBackend"
#: Lowest compute capability the kernels are built for (sm_80, the mma.sync path).
MIN_COMPUTE_CAPABILITY = DeviceCapability(8, 0)
#: ``kv_cache_dtype`` values accepted (vLLM's ``CacheDType`` spelling).
SUPPORTED_KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_ds_mla",
)
_FP8_PER_TENSOR = ("fp8", "fp8_e4m3")


# --------------------------------------------------------------------------------------------
# Logical top-k -> physical cache rows
# --------------------------------------------------------------------------------------------


def convert_req_index_to_global_index_torch(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    block_size: int,
    block_stride_rows: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of vLLM's ``triton_convert_req_index_to_global_index``.

    ``out[t, j] = block_table[req_id[t], idx // block_size] * block_stride_rows
    + idx % block_size`` with ``idx = token_indices[t, j]``; ``-1`` where ``idx < 0`` or its block
    is past the block table's width. Same contract as the Triton kernel in
    ``vllm/v1/attention/backends/mla/sparse_utils.py`` (without DCP, prefill workspaces or valid
    counts), for devices where Triton does not run (CPU).

    Args:
        req_id: int32 ``[T]``, request row of ``block_table`` for each query token.
        block_table: int32 ``[num_reqs, max_blocks_per_req]`` physical block ids.
        token_indices: int32 ``[T, W]`` logical token positions inside the request; negative =
            invalid. W is the indexer buffer's width (it may exceed the model's ``index_topk``).
        block_size: tokens per cache block.
        block_stride_rows: cache rows between consecutive blocks in the flat row view
            (``flat_kv_row_view``), default ``block_size``.
        out: optional int32 ``[T, W]`` destination.

    Returns:
        int32 ``[T, W]`` physical row ids (``out`` when given).
    """
    stride = block_size if block_stride_rows is None else block_stride_rows
    num_tokens = token_indices.shape[0]
    max_blocks = block_table.shape[1]
    tok = token_indices.long()
    block = torch.div(tok, block_size, rounding_mode="floor")
    valid = (tok >= 0) & (block < max_blocks)
    rows = block_table.long().index_select(0, req_id[:num_tokens].long())
    base = torch.gather(rows, 1, block.clamp(0, max_blocks - 1)) if max_blocks else block
    physical = torch.where(valid, base * stride + tok.remainder(block_size), -1)
    if out is None:
        return physical.to(torch.int32)
    out.copy_(physical)
    return out


def logical_to_physical_topk(
    token_indices: torch.Tensor,
    attn_metadata: SparseMLACommonMetadata,
    *,
    block_stride_rows: int | None = None,
    out: torch.Tensor | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Convert the indexer's per-request top-k to physical cache rows, keeping ``-1``.

    With Triton (default: on CUDA tensors) this is vLLM's
    ``triton_convert_req_index_to_global_index`` without valid counts, so every column stays
    where the indexer put it; otherwise ``convert_req_index_to_global_index_torch``.

    Args:
        token_indices: int32 ``[T, W]`` slice of the layer's ``topk_indices_buffer``.
        attn_metadata: the builder's metadata (``req_id_per_token``, ``block_table``,
            ``block_size``).
        block_stride_rows: as in ``flat_kv_row_view``; default ``block_size``.
        out: optional int32 ``[T, W]`` destination (contiguous); no allocation when given.
        use_triton: force the Triton helper (True) or the PyTorch one (False).

    Returns:
        int32 ``[T, W]`` physical row ids for ``ops.sparse_mla_fwd``.

    Raises:
        RuntimeError: from torch or Triton when the metadata does not match ``token_indices``
            (fewer ``req_id_per_token`` entries than T, ``out`` of another shape).
    """
    num_tokens, width = token_indices.shape
    req_id = attn_metadata.req_id_per_token[:num_tokens]
    if token_indices.is_cuda if use_triton is None else use_triton:
        return triton_convert_req_index_to_global_index(
            req_id,
            attn_metadata.block_table,
            token_indices,
            BLOCK_SIZE=attn_metadata.block_size,
            BLOCK_STRIDE_ROWS=block_stride_rows,
            NUM_TOPK_TOKENS=width,
            BLOCK_N=_column_tile(width),
            out=out,
        )
    return convert_req_index_to_global_index_torch(
        req_id,
        attn_metadata.block_table,
        token_indices,
        attn_metadata.block_size,
        block_stride_rows,
        out=out,
    )


def _column_tile(width: int) -> int:
    """Largest power of two <= 128 dividing ``width`` (the Triton helper's ``BLOCK_N`` rule)."""
    tile = 128
    while width % tile:
        tile //= 2
    return tile


# --------------------------------------------------------------------------------------------
# Backend: static facts
# --------------------------------------------------------------------------------------------


class SparseMLABlackwellBackend(AttentionBackend):
    """Sparse MLA (DeepSeek-V3.2, GLM-5.x) on the mma.sync kernels of this package.

    Head sizes 512 (NoPE) and 576; bf16/fp16 models; kv-cache dtypes ``auto``, ``bfloat16``,
    ``float16``, ``fp8``/``fp8_e4m3`` (per-tensor scale) and ``fp8_ds_mla`` (656-byte records);
    any block size; compute capability 8.0 and up.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = list(SUPPORTED_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[SparseMLABlackwellImpl]:
        return SparseMLABlackwellImpl

    @staticmethod
    def get_builder_cls() -> type[SparseMLABlackwellMetadataBuilder]:
        return SparseMLABlackwellMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(
        kv_cache_spec: KVCacheSpec | None = None,
    ) -> list[int | MultipleOf]:
        # Indices are physical rows: the kernel never sees the page size.
        return [MultipleOf(1)]

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """``[num_blocks, block_size, W]``: W = 656 bytes for ``fp8_ds_mla``, else ``head_size``
        elements (bf16/fp16, or e4m3 bytes for ``fp8``/``fp8_e4m3``).

        vLLM 0.33 derives the same layout from the layer's ``MLAAttentionSpec``
        (``vllm/v1/kv_cache_interface.py``; the tests check that both agree); releases that ask
        the backend for the cache shape call this.
        """
        assert num_kv_heads == 1, "MLA caches hold one latent row per token"
        if cache_dtype_str == "fp8_ds_mla":
            return (num_blocks, block_size, formats.FP8_DS_MLA_RECORD_BYTES)
        return (num_blocks, block_size, head_size)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        # The op reads the cache as flat rows (``flat_kv_row_view``): blocks must be whole rows
        # apart, also when other layers' pages are packed in between.
        return spec if align_blocks_to_rows is None else align_blocks_to_rows(spec)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(formats.HEAD_SIZES)

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return (capability.major, capability.minor) >= tuple(MIN_COMPUTE_CAPABILITY)

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        reason = ops.unsupported_device_reason((device_capability.major, device_capability.minor))
        if reason is not None:
            return f"{BACKEND_NAME}: {reason}"
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
        model_config = None if vllm_config is None else vllm_config.model_config
        if model_config is not None:
            hf_text_config = model_config.hf_text_config
            kv_lora_rank = getattr(hf_text_config, "kv_lora_rank", formats.KV_LORA_RANK)
            rope = getattr(hf_text_config, "qk_rope_head_dim", head_size - kv_lora_rank)
            if kv_lora_rank != formats.KV_LORA_RANK or rope not in (0, formats.QK_ROPE_HEAD_DIM):
                return (
                    f"{BACKEND_NAME} needs kv_lora_rank {formats.KV_LORA_RANK} and "
                    f"qk_rope_head_dim 0 or {formats.QK_ROPE_HEAD_DIM}, got {kv_lora_rank} "
                    f"and {rope}"
                )
        return None


# --------------------------------------------------------------------------------------------
# Metadata builder: host-side preparation once per batch
# --------------------------------------------------------------------------------------------


@dataclass
class SparseMLABlackwellMetadata(SparseMLACommonMetadata):
    """vLLM's sparse-MLA metadata as is: ``req_id_per_token``, ``block_table``, ``block_size``
    and the decode/prefill split are all the forward needs."""


class SparseMLABlackwellMetadataBuilder(SparseMLACommonMetadataBuilder[SparseMLABlackwellMetadata]):
    """vLLM's ``SparseMLACommonMetadataBuilder`` with a CPU path for ``req_id_per_token``.

    CUDA graphs: ``UNIFORM_BATCH``. A decode batch (each request 1 + num_speculative_tokens
    queries, padding requests 0) replays cleanly: every tensor the forward reads is a persistent
    buffer (``req_id_per_token``, ``block_table``, the top-k buffer, the workspace), the op
    allocates nothing and does not synchronise, and padded rows (indices -1) produce ``out = 0``
    without reading the cache. Mixed prefill batches run eagerly or piecewise, like vLLM's other
    sparse-MLA backends (the indexer's own builder needs that too).
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    metadata_cls = SparseMLABlackwellMetadata

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Prefill and decode tokens go through the same launch; the split only decides which
        # batches count as uniform decodes (CUDA graphs, spec decode).
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)

    @classmethod
    def get_varlen_cudagraph_max_query_len(
        cls, vllm_config: VllmConfig, kv_cache_spec: KVCacheSpec
    ) -> int | None:
        # Nothing in the forward depends on per-request query lengths.
        return None if max_decode_query_len is None else max_decode_query_len(vllm_config)

    def _build_req_id_per_token(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> torch.Tensor:
        if self.device.type == "cuda":
            return super()._build_req_id_per_token(common_attn_metadata)
        # vLLM's helper is a Triton kernel; same mapping in PyTorch (tokens past the last
        # request, i.e. padding, map to request 0).
        num_tokens = common_attn_metadata.num_actual_tokens
        qsl = common_attn_metadata.query_start_loc_cpu
        query_lens = (qsl[1:] - qsl[:-1]).long()
        req_ids = torch.repeat_interleave(torch.arange(len(query_lens)), query_lens)[:num_tokens]
        out = self.req_id_per_token_buffer[:num_tokens]
        out.zero_()
        out[: len(req_ids)].copy_(req_ids)
        return out


# --------------------------------------------------------------------------------------------
# Impl: the forward
# --------------------------------------------------------------------------------------------


class SparseMLABlackwellImpl(SparseMLACommonImpl[SparseMLABlackwellMetadata]):
    """Absorbed sparse MLA: ``forward_mqa`` for every token, prefill included.

    Per layer and batch: logical top-k (``topk_indices_buffer``, shared with the layers that have
    no indexer of their own) -> physical rows (vLLM's index-group conversion, done once per
    group, or ``logical_to_physical_topk``) -> ``ops.sparse_mla_fwd`` into a persistent
    workspace (``current_workspace_manager``). Nothing is allocated on the CUDA path.
    """

    #: Run the fp32 PyTorch reference (``reference.sparse_mla_reference``) instead of the
    #: kernel: the exact baseline of the end-to-end check (``e2e.py``) on GPUs where vLLM has no
    #: sparse-MLA kernel of its own. Eager mode only; set in-process by that check, not a user knob.
    _exact_reference: ClassVar[bool] = False
    _exact_calls: ClassVar[int] = 0  # forwards it served, which the check asserts

    is_sparse = True
    supports_dense_mha_prefill = False
    supports_pcp = False
    supports_dcp = False
    supports_quant_query_input = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla_args,
    ) -> None:
        if alibi_slopes or sliding_window or logits_soft_cap:
            raise NotImplementedError(
                f"{BACKEND_NAME} does not support alibi_slopes, sliding_window or logits_soft_cap"
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"{BACKEND_NAME} supports decoder self-attention only")
        if kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
            raise NotImplementedError(
                f"{BACKEND_NAME}: kv_cache_dtype must be one of {SUPPORTED_KV_CACHE_DTYPES}, "
                f"got {kv_cache_dtype!r}"
            )
        if head_size not in formats.HEAD_SIZES or not 1 <= num_heads <= formats.MAX_NUM_HEADS:
            raise NotImplementedError(
                f"{BACKEND_NAME}: head_size must be one of {formats.HEAD_SIZES} and num_heads in "
                f"1..{formats.MAX_NUM_HEADS}, got {head_size} and {num_heads}"
            )
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        if isinstance(getattr(self, "index_group", None), HiSparseMLAIndexGroup):
            raise NotImplementedError(f"{BACKEND_NAME} does not support HiSparse host caches")
        if self.dcp_world_size > 1:
            raise NotImplementedError(f"{BACKEND_NAME} does not support decode context parallel")
        if self.topk_indices_buffer is None:
            raise ValueError(f"{BACKEND_NAME} needs the model's topk_indices_buffer")

        from vllm.config import get_current_vllm_config

        vllm_config = get_current_vllm_config()
        self._max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self._model_dtype = vllm_config.model_config.dtype
        self._topk_width = self.topk_indices_buffer.shape[1]
        self._op_workspace: torch.Tensor | None = None
        self.reserve_workspace()

    # -- buffers ------------------------------------------------------------------------------

    def _workspace_specs(
        self, dtype: torch.dtype, width: int
    ) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """out ``[T, H, 512]`` (q dtype), lse ``[T, H]`` fp32, physical top-k ``[T, W]`` int32,
        for T = ``max_num_batched_tokens``."""
        tokens = self._max_tokens
        return [
            ((tokens, self.num_heads, formats.HEAD_SIZE_V), dtype),
            ((tokens, self.num_heads), torch.float32),
            ((tokens, width), torch.int32),
        ]

    def reserve_workspace(self) -> None:
        """Claim the shared workspace (and the op's split-top-k buffer) before the manager is
        locked and before CUDA-graph capture; the forward only takes views of them."""
        if is_workspace_manager_initialized():
            current_workspace_manager().get_simultaneous(
                *self._workspace_specs(self._model_dtype, self._topk_width)
            )
        device = self.topk_indices_buffer.device
        if device.type == "cuda" and ops.extension_available():
            self._op_workspace = ops.get_workspace(device)

    # -- cache write --------------------------------------------------------------------------

    def _vllm_writes_cache(self, kv_c: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """Whether vLLM's ``concat_and_cache_mla`` writes this cache: rows with rope in the
        model dtype, per-tensor e4m3, and ``fp8_ds_mla`` from bf16 (the combinations vLLM's own
        sparse backends use). NoPE rows, dtype conversions and CPU caches are ours."""
        if not kv_cache.is_cuda or self.qk_rope_head_dim != formats.QK_ROPE_HEAD_DIM:
            return False
        if self.kv_cache_dtype in ("auto", "bfloat16", "float16"):
            return kv_cache.dtype == kv_c.dtype
        if self.kv_cache_dtype == "fp8_ds_mla":
            return kv_c.dtype == torch.bfloat16
        return True

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
        skip_scale: bool = False,
    ) -> None:
        """Write ``kv_c_normed`` ``[T, 512]`` and ``k_pe`` ``[T, 1, R]`` at ``slot_mapping``
        (``-1`` skipped): vLLM's ``concat_and_cache_mla`` where it supports the format, else
        ``ops.concat_and_cache_sparse_mla`` (CPU, NoPE fp8 / fp8_ds_mla, dtype conversion).

        Raises:
            ValueError: on the package's path, a bad shape, dtype or kv_cache_dtype, named,
                before anything is written (``ops.concat_and_cache_sparse_mla``).
            RuntimeError: a CUDA error, or vLLM's kernel rejecting its arguments.
        """
        if kv_cache.numel() == 0:
            return
        if self._vllm_writes_cache(kv_c_normed, kv_cache):
            # vLLM's kernel spells "same dtype as the model" as "auto".
            fmt = "auto" if kv_cache_dtype in ("bfloat16", "float16") else kv_cache_dtype
            super().do_kv_cache_update(
                kv_c_normed, k_pe, kv_cache, slot_mapping, fmt, k_scale, skip_scale
            )
            return
        rope = None if self.qk_rope_head_dim == 0 else k_pe.reshape(k_pe.shape[0], -1)
        ops.concat_and_cache_sparse_mla(
            kv_c_normed,
            rope,
            kv_cache,
            slot_mapping.flatten(),
            kv_cache_dtype,
            k_scale if kv_cache_dtype in _FP8_PER_TENSOR else None,
        )

    # -- attention ----------------------------------------------------------------------------

    def _physical_topk(
        self,
        logical: torch.Tensor,
        attn_metadata: SparseMLABlackwellMetadata,
        block_stride_rows: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        group = getattr(self, "index_group", None)
        if (
            logical.is_cuda
            and group is not None
            and logical.shape[0] <= group.physical_topk_indices.shape[0]
            and logical.shape[1] % 128 == 0  # the group converts with vLLM's default tile
        ):
            # vLLM converts once per index group (on a side stream) for all layers reading the
            # same indexer result, into the group's persistent buffer; no valid counts, so -1
            # stays in place. Larger batches (prefill) convert per layer into the workspace.
            return self._convert_logical_to_physical_topk(
                logical,
                attn_metadata,
                block_stride_rows=block_stride_rows,
                return_valid_counts=False,
            )
        return logical_to_physical_topk(
            logical, attn_metadata, block_stride_rows=block_stride_rows, out=out
        )

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: SparseMLABlackwellMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sparse MQA over the top-k rows of each token.

        Args:
            q: ``(ql_nope [T, H, 512], q_pe [T, H, R])`` as ``MLAAttention.forward_impl`` passes
                it (R = 0 for NoPE), or one ``[T, H, 512 + R]`` tensor.
            kv_c_and_k_pe_cache: ``[num_blocks, block_size, W]`` (fp8 caches viewed as e4m3).
            attn_metadata: this builder's metadata.
            layer: the ``MLAAttention`` layer (``_k_scale`` for fp8 caches).

        Returns:
            ``(out [T, H, 512] in q's dtype, lse [T, H] fp32, natural log)``, views of vLLM's
            workspace; a token with no valid index gets ``out = 0``, ``lse = -inf``.

        Raises:
            AssertionError: the layer has no ``topk_indices_buffer`` (not a sparse-MLA layer).
            ValueError: from ``ops.sparse_mla_fwd``, a bad shape, dtype or device, named,
                before any launch.
            RuntimeError: a CUDA error.
        """
        if isinstance(q, tuple):
            q_nope, q_pe = q
            if q_pe.shape[-1] == 0:
                q_pe = None
        else:
            q_nope, q_pe = q, None
        num_tokens = q_nope.shape[0]
        assert self.topk_indices_buffer is not None
        # All of the buffer's width counts: GLM-5.x fills index_topk + kpool tail columns.
        logical = self.topk_indices_buffer[:num_tokens]
        width = logical.shape[1]

        out_ws, lse_ws, idx_ws = current_workspace_manager().get_simultaneous(
            *self._workspace_specs(q_nope.dtype, width)
        )
        kv_rows, block_stride_rows = flat_kv_row_view(
            kv_c_and_k_pe_cache, attn_metadata.block_size
        )
        physical = self._physical_topk(
            logical, attn_metadata, block_stride_rows, idx_ws[:num_tokens]
        )
        if self._exact_reference:
            return self._forward_exact(
                q_nope, q_pe, kv_rows, physical, layer, out_ws[:num_tokens], lse_ws[:num_tokens]
            )
        return ops.sparse_mla_fwd(
            q_nope,
            kv_rows,
            physical,
            self.scale,
            q_pe=q_pe,
            kv_cache_dtype=self.kv_cache_dtype,
            k_scale=layer._k_scale if self.kv_cache_dtype in _FP8_PER_TENSOR else None,
            topk=width,
            out=out_ws[:num_tokens],
            lse=lse_ws[:num_tokens],
            workspace=self._op_workspace,
        )

    def _forward_exact(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor | None,
        kv_rows: torch.Tensor,
        physical: torch.Tensor,
        layer: AttentionLayer,
        out: torch.Tensor,
        lse: torch.Tensor,
        tokens_per_chunk: int = 128,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_mqa`` through the fp32 reference: per chunk of tokens, gather and decode only
        the rows the indices name (the cache itself may be tens of GB), then attend in fp32."""
        SparseMLABlackwellImpl._exact_calls += 1
        head_size = formats.KV_LORA_RANK + (0 if q_pe is None else q_pe.shape[-1])
        k_scale = layer._k_scale if self.kv_cache_dtype in _FP8_PER_TENSOR else None
        num_rows = kv_rows.shape[0]
        for t0 in range(0, q_nope.shape[0], tokens_per_chunk):
            t1 = min(q_nope.shape[0], t0 + tokens_per_chunk)
            idx = physical[t0:t1]
            valid = (idx >= 0) & (idx < num_rows)
            rows = reference.dequantize_kv_cache(
                kv_rows[torch.where(valid, idx, 0).flatten().long()],
                self.kv_cache_dtype,
                head_size,
                k_scale,
            )
            local = torch.arange(idx.numel(), device=idx.device, dtype=torch.int32).view_as(idx)
            chunk_out, chunk_lse = reference.sparse_mla_reference(
                q_nope[t0:t1],
                rows,
                torch.where(valid, local, -1),
                self.scale,
                q_pe=None if q_pe is None else q_pe[t0:t1],
            )
            out[t0:t1].copy_(chunk_out)
            lse[t0:t1].copy_(chunk_lse)
        return out, lse


# --------------------------------------------------------------------------------------------
# Registration (vllm.general_plugins entry point)
# --------------------------------------------------------------------------------------------

_REGISTERED = False


def register() -> None:
    """Register ``SPARSE_MLA_BLACKWELL`` with vLLM and make it the first MLA choice on CUDA.

    Idempotent (vLLM calls its general plugins in every process). Uses
    ``vllm.v1.attention.backends.registry.register_backend`` for the name, and wraps
    ``vllm.platforms.cuda._get_backend_priorities`` so that, for MLA layers, this backend is
    tried first; vLLM's ``validate_configuration`` still rejects it for dense MLA, non-MLA, head
    sizes other than 512/576 and compute capability below 8.0, which then fall through to vLLM's
    own list unchanged. Logs one line through vLLM's logger when it acts.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[BACKEND_NAME], BACKEND_CLASS_PATH)
    else:
        register_backend(BACKEND_NAME, BACKEND_CLASS_PATH)
    unavailable = _prefer_for_sparse_mla()
    _REGISTERED = True
    logger.info(
        "vllm_sparse_mla_blackwell: registered attention backend %s (%s)%s",
        BACKEND_NAME,
        BACKEND_CLASS_PATH,
        "; first choice for MLA on CUDA compute capability >= 8.0"
        if unavailable is None
        else f"; automatic selection unavailable ({unavailable}), use --attention-backend",
    )


def _prefer_for_sparse_mla() -> str | None:
    """Put this backend first in the CUDA platform's MLA priorities; the reason if it cannot."""
    try:
        import vllm.platforms.cuda as cuda_platform
    except (ImportError, OSError) as exc:  # no CUDA build or driver: nothing to select on
        return f"vllm.platforms.cuda: {exc}"
    original = getattr(cuda_platform, "_get_backend_priorities", None)
    if original is None:
        return "this vLLM has no vllm.platforms.cuda._get_backend_priorities"
    if not getattr(original, "_sparse_mla_blackwell", False):
        cuda_platform._get_backend_priorities = _with_backend_first(original)
    return None


def _with_backend_first(original):
    """Wrap a ``_get_backend_priorities(use_mla, device_capability, ...)`` function so that MLA
    lists start with this backend."""
    signature = inspect.signature(original)

    @functools.cache
    def priorities(*args, **kwargs):
        backends = list(original(*args, **kwargs))
        if not signature.bind(*args, **kwargs).arguments.get("use_mla", False):
            return backends
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        ours = AttentionBackendEnum[BACKEND_NAME]
        return [ours, *(b for b in backends if b is not ours)]

    priorities._sparse_mla_blackwell = True  # type: ignore[attr-defined]
    priorities.__wrapped__ = original  # type: ignore[attr-defined]
    return priorities
