// Model constants and KV-cache formats of sparse MLA. One source of truth: the
// kernel, the host checks and (through the `format_constants` op) the Python side read these.
#pragma once

#include <cstdint>

namespace sparse_mla {

// Latent width of absorbed MLA (`kv_lora_rank` in DeepSeek-V3 / GLM-5 configs); also V's width.
constexpr int kKvLoraRank = 512;
// Rope part of K (`qk_rope_head_dim`): 64, or 0 for NoPE models (GLM-5.3-Flash).
constexpr int kQkRopeHeadDim = 64;
constexpr int kHeadSizeNoPE = kKvLoraRank;                   // 512
constexpr int kHeadSizeRoPE = kKvLoraRank + kQkRopeHeadDim;  // 576
constexpr int kHeadSizeV = kKvLoraRank;
constexpr int kMaxNumHeads = 128;

// Opt-in shared memory per block on sm_86 / sm_89 / sm_120 / sm_121, the smallest of the targets.
constexpr int kSmemBudgetBytes = 101376;
// Shared memory of one sm_120 / sm_121 SM, and what the driver reserves of it per resident block
// (CUDA occupancy rules): blocks per SM by shared memory = 102,400 / (block's bytes + 1,024).
constexpr int kSm120SmemPerSm = 102400;
constexpr int kSmemReservedPerBlock = 1024;
constexpr int sm120_blocks_by_smem(int smem_bytes) {
  return kSm120SmemPerSm / (smem_bytes + kSmemReservedPerBlock);
}

// vLLM's `fp8_ds_mla` record (`concat_and_cache_ds_mla` in vLLM's csrc/cache_kernels.cu,
// vllm/v1/attention/backends/mla/flashmla_sparse.py): 512 e4m3 latent values, four fp32 scales
// (one per 128 values), 64 bf16 rope values. NoPE writes the rope bytes as zeros.
constexpr int kDsMlaRecordBytes = 656;
constexpr int kDsMlaScaleOffset = 512;
constexpr int kDsMlaRopeOffset = 528;
constexpr int kDsMlaTile = 128;
constexpr float kFp8E4m3Max = 448.f;

// Element type of q / out and of 16-bit caches.
enum class DType : int { kBFloat16 = 0, kFloat16 = 1 };

// How a cache row is stored.
enum class KvFormat : int {
  kBFloat16 = 0,  // D bf16 values
  kFloat16 = 1,   // D fp16 values
  kFp8E4m3 = 2,   // D e4m3 bytes, one per-tensor fp32 scale (vLLM `k_scale`)
  kFp8DsMla = 3,  // the 656-byte record above
};

// fp8_e4m3 or fp8_ds_mla: rows decoded to fp16 for the MMAs (kernel_traits.h).
constexpr bool is_fp8(KvFormat fmt) { return fmt == KvFormat::kFp8E4m3 || fmt == KvFormat::kFp8DsMla; }

// Bytes of one cache row for a format and head size.
constexpr int kv_row_bytes(KvFormat fmt, int head_size) {
  return fmt == KvFormat::kFp8DsMla ? kDsMlaRecordBytes
         : fmt == KvFormat::kFp8E4m3 ? head_size
                                      : 2 * head_size;
}

}  // namespace sparse_mla
