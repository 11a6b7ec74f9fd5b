// Argument checks of the sparse-MLA entry points (see api.h); the launch plan is planner.cpp's.
#include "api.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "env_flag.h"

namespace sparse_mla {

namespace {

// Messages are built with std::string and std::to_string only: no iostreams in the host API,
// whose state a host process (Python with its own libstdc++) may not share with this module.
void append(std::string& s, const char* v) { s += v; }
void append(std::string& s, const std::string& v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
void append(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string msg;
  (append(msg, parts), ...);
  throw ArgumentError(msg);
}

std::string shape_str(const TensorDesc& t) {
  std::string s = "[";
  for (int i = 0; i < t.dim; ++i) s += (i ? ", " : "") + std::to_string(t.sizes[i]);
  return s + "]";
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void require_defined(const TensorDesc& t, const char* name) {
  if (!t.defined) fail(name, " is required");
}

void require_dim(const TensorDesc& t, const char* name, int dim, const char* layout) {
  if (t.dim != dim) fail(name, " must have ", dim, " dims ", layout, ", got shape ", shape_str(t));
}

const char* dtype_str(const TensorDesc& t) {
  return t.dtype == ScalarType::kOther && t.dtype_name != nullptr ? t.dtype_name : scalar_type_name(t.dtype);
}

void require_dtype(const TensorDesc& t, const char* name, ScalarType want) {
  if (t.dtype != want) fail(name, " must be ", scalar_type_name(want), ", got ", dtype_str(t));
}

// An output must not write one element twice (stride 0, overlapping strides).
void require_non_overlapping(const TensorDesc& t, const char* name) {
  int order[4] = {0, 1, 2, 3};
  std::sort(order, order + t.dim, [&](int a, int b) { return t.strides[a] < t.strides[b]; });
  int64_t extent = 1;  // elements spanned by the dims seen so far
  for (int i = 0; i < t.dim; ++i) {
    const int d = order[i];
    if (t.sizes[d] <= 1) continue;
    if (t.strides[d] < extent) fail(name, " must not overlap itself (stride ", t.strides[d], " in dim ", d, ")");
    extent = t.strides[d] * t.sizes[d];
  }
}

// Byte range [begin, end) a tensor's elements occupy.
std::pair<uintptr_t, uintptr_t> byte_range(const TensorDesc& t) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  int64_t last = 0;
  for (int d = 0; d < t.dim; ++d) {
    if (t.sizes[d] == 0) return {begin, begin};
    last += (t.sizes[d] - 1) * t.strides[d];
  }
  return {begin, begin + static_cast<uintptr_t>((last + 1) * t.element_size)};
}

void require_disjoint(const TensorDesc& out, const char* out_name, const TensorDesc& other, const char* other_name) {
  if (!out.defined || !other.defined || out.is_cuda != other.is_cuda) return;
  const auto a = byte_range(out), b = byte_range(other);
  if (a.first < b.second && b.first < a.second) fail(out_name, " must not overlap ", other_name);
}

void require_size(const TensorDesc& t, const char* name, int d, int64_t want, const char* what) {
  if (t.sizes[d] != want)
    fail(name, ".shape[", d, "] must be ", want, " (", what, "), got shape ", shape_str(t));
}

// Rows read or written with 16-byte vectors: contiguous last dim, 16-byte aligned start, and
// every other stride a multiple of 16 bytes.
void require_vector_rows(const TensorDesc& t, const char* name) {
  if (t.strides[t.dim - 1] != 1 && t.sizes[t.dim - 1] > 1)
    fail(name, " must have a contiguous last dim (stride 1), got stride ", t.strides[t.dim - 1]);
  if (!aligned16(t.data)) fail(name, " must start at a 16-byte aligned address");
  for (int d = 0; d + 1 < t.dim; ++d)
    if ((t.strides[d] * t.element_size) % 16 != 0 && t.sizes[d] > 1)
      fail(name, ".stride(", d, ") must be a multiple of 16 bytes, got ", t.strides[d], " elements");
}

class DeviceCheck {
 public:
  DeviceCheck(bool require_cuda) : require_cuda_(require_cuda) {}
  void operator()(const TensorDesc& t, const char* name) {
    if (!t.defined) return;
    if (require_cuda_ && !t.is_cuda) fail(name, " must be a CUDA tensor");
    if (first_ == nullptr) {
      first_ = name;
      is_cuda_ = t.is_cuda;
      index_ = t.device_index;
    } else if (t.is_cuda != is_cuda_ || (t.is_cuda && t.device_index != index_)) {
      fail(name, " must be on the same device as ", first_);
    }
  }

 private:
  bool require_cuda_;
  const char* first_ = nullptr;
  bool is_cuda_ = false;
  int index_ = -1;
};

DType element_dtype(const TensorDesc& t, const char* name) {
  if (t.dtype == ScalarType::kBFloat16) return DType::kBFloat16;
  if (t.dtype == ScalarType::kFloat16) return DType::kFloat16;
  fail(name, " must be bfloat16 or float16, got ", dtype_str(t));
}

// The cache's row width and dtype for its format; returns the number of rows. The forward reads
// rows by flat id, so its blocks must be evenly spaced rows; the cache writer maps a slot to
// (block, offset) as vLLM does and also takes the block-outer views whose block stride is larger
// than block_size rows (vLLM lays a layer's blocks out that way when several caches share a block).
enum class BlockStride { kEvenRows, kAtLeastBlock };
int64_t check_kv_cache(const TensorDesc& kv, KvFormat fmt, int head_size, BlockStride block_stride) {
  require_defined(kv, "kv_cache");
  if (kv.dim != 2 && kv.dim != 3)
    fail("kv_cache must be [num_blocks, block_size, row] or [num_rows, row], got shape ", shape_str(kv));
  switch (fmt) {
    case KvFormat::kBFloat16: require_dtype(kv, "kv_cache", ScalarType::kBFloat16); break;
    case KvFormat::kFloat16: require_dtype(kv, "kv_cache", ScalarType::kFloat16); break;
    default:
      if (kv.dtype != ScalarType::kUInt8 && kv.dtype != ScalarType::kFloat8E4m3)
        fail("kv_cache must be uint8 or float8_e4m3fn for an fp8 kv_cache_dtype, got ", dtype_str(kv));
  }
  const int64_t width = kv_row_bytes(fmt, head_size) / kv.element_size;
  if (kv.sizes[kv.dim - 1] != width)
    fail("kv_cache last dim must be ", width, " for this kv_cache_dtype and head_size ", head_size,
         ", got shape ", shape_str(kv));
  require_vector_rows(kv, "kv_cache");
  // Rows must not overlap: a write would race with another, a read see another row's tail.
  const int64_t row_stride = kv.strides[kv.dim - 2];
  const int64_t rows_here = kv.dim == 3 ? (block_stride == BlockStride::kEvenRows ? kv.sizes[0] * kv.sizes[1]
                                                                                  : kv.sizes[1])
                                        : kv.sizes[0];
  if (rows_here > 1 && row_stride < width)
    fail("kv_cache rows must not overlap (stride(", kv.dim - 2, ") >= ", width, "), got shape ", shape_str(kv),
         " and stride ", row_stride);
  if (kv.dim == 3 && kv.sizes[0] > 1 && kv.sizes[1] > 0) {
    const int64_t block_rows_span = kv.sizes[1] * kv.strides[1];
    if (block_stride == BlockStride::kEvenRows && kv.strides[0] != block_rows_span)
      fail("kv_cache blocks must be evenly spaced rows (stride(0) == shape[1] * stride(1)), got shape ",
           shape_str(kv), " strides (", kv.strides[0], ", ", kv.strides[1], ", ", kv.strides[2], ")");
    if (block_stride == BlockStride::kAtLeastBlock && kv.strides[0] < block_rows_span - kv.strides[1] + width)
      fail("kv_cache blocks must not overlap (stride(0) >= (shape[1] - 1) * stride(1) + shape[2]), got shape ",
           shape_str(kv), " strides (", kv.strides[0], ", ", kv.strides[1], ", ", kv.strides[2], ")");
  }
  return kv.dim == 3 ? kv.sizes[0] * kv.sizes[1] : kv.sizes[0];
}

// The optional per-tensor fp8 scale: one fp32 value, only with kv_cache_dtype fp8 / fp8_e4m3,
// on the launch's device.
void check_k_scale(const TensorDesc& k_scale, KvFormat format, DeviceCheck& same_device) {
  if (!k_scale.defined) return;
  require_dtype(k_scale, "k_scale", ScalarType::kFloat32);
  int64_t n = 1;
  for (int d = 0; d < k_scale.dim; ++d) n *= k_scale.sizes[d];
  if (n != 1) fail("k_scale must hold one element (a per-tensor scale)");
  if (format != KvFormat::kFp8E4m3) fail("k_scale is only used with kv_cache_dtype fp8 / fp8_e4m3");
  same_device(k_scale, "k_scale");
}

}  // namespace

const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::kBFloat16: return "bfloat16";
    case ScalarType::kFloat16: return "float16";
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kInt32: return "int32";
    case ScalarType::kInt64: return "int64";
    case ScalarType::kUInt8: return "uint8";
    case ScalarType::kFloat8E4m3: return "float8_e4m3fn";
    default: return "an unsupported dtype";
  }
}

KvFormat parse_kv_cache_dtype(const std::string& s, const TensorDesc& kv_cache) {
  if (s == "auto") {
    if (kv_cache.dtype == ScalarType::kBFloat16) return KvFormat::kBFloat16;
    if (kv_cache.dtype == ScalarType::kFloat16) return KvFormat::kFloat16;
    fail("kv_cache_dtype 'auto' needs a bfloat16 or float16 kv_cache, got ", dtype_str(kv_cache));
  }
  if (s == "bfloat16" || s == "bf16") return KvFormat::kBFloat16;
  if (s == "float16" || s == "half" || s == "fp16") return KvFormat::kFloat16;
  if (s == "fp8" || s == "fp8_e4m3") return KvFormat::kFp8E4m3;
  if (s == "fp8_ds_mla") return KvFormat::kFp8DsMla;
  fail("kv_cache_dtype must be one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_ds_mla; got '", s, "'");
}

SparseMlaFwdLaunch plan_sparse_mla_fwd(const SparseMlaFwdArgs& a, bool require_cuda, int num_sms,
                                       BlocksPerSmFn blocks_per_sm, int sm_version) {
  DeviceCheck same_device(require_cuda);
  // q (and q_pe): [T, H, D] or [T, H, 512] + [T, H, 64].
  require_defined(a.q, "q");
  require_dim(a.q, "q", 3, "[num_tokens, num_heads, head_size]");
  const DType dtype = element_dtype(a.q, "q");
  const int64_t T = a.q.sizes[0], H = a.q.sizes[1];
  if (H < 1 || H > kMaxNumHeads) fail("q.shape[1] (num_heads) must be in 1..", kMaxNumHeads, ", got ", H);
  int64_t head_size = a.q.sizes[2];
  // q_pe and out: [T, H, width] in q's dtype, rows of contiguous values.
  const auto require_per_head = [&](const TensorDesc& t, const char* name, int64_t width, const char* width_name,
                                    const char* shape) {
    require_dim(t, name, 3, shape);
    require_dtype(t, name, a.q.dtype);
    require_size(t, name, 0, T, "num_tokens of q");
    require_size(t, name, 1, H, "num_heads of q");
    require_size(t, name, 2, width, width_name);
    require_vector_rows(t, name);
  };
  if (a.q_pe.defined) {
    require_size(a.q, "q", 2, kKvLoraRank, "kv_lora_rank when q_pe is given");
    require_per_head(a.q_pe, "q_pe", kQkRopeHeadDim, "qk_rope_head_dim", "[num_tokens, num_heads, qk_rope_head_dim]");
    head_size += kQkRopeHeadDim;
  } else if (head_size != kHeadSizeNoPE && head_size != kHeadSizeRoPE) {
    fail("q.shape[2] (head_size) must be 512 or 576, got ", head_size);
  }
  require_vector_rows(a.q, "q");
  same_device(a.q, "q");
  same_device(a.q_pe, "q_pe");

  const KvFormat format = parse_kv_cache_dtype(a.kv_cache_dtype, a.kv_cache);
  const int64_t num_kv_rows =
      check_kv_cache(a.kv_cache, format, static_cast<int>(head_size), BlockStride::kEvenRows);
  same_device(a.kv_cache, "kv_cache");
  check_k_scale(a.k_scale, format, same_device);

  require_defined(a.indices, "indices");
  require_dim(a.indices, "indices", 2, "[num_tokens, topk]");
  require_dtype(a.indices, "indices", ScalarType::kInt32);
  require_size(a.indices, "indices", 0, T, "num_tokens of q");
  if (a.indices.strides[1] != 1 && a.indices.sizes[1] > 1)
    fail("indices must have a contiguous last dim (stride 1), got stride ", a.indices.strides[1]);
  same_device(a.indices, "indices");
  if (a.topk < -1) fail("topk must be >= 1 (or -1 for indices.shape[1]), got ", a.topk);
  const int64_t topk = a.topk < 0 ? a.indices.sizes[1] : a.topk;
  if (topk < 1) fail("topk must be >= 1, got ", topk, " (the default is indices.shape[1])");
  if (topk > a.indices.sizes[1])
    fail("topk (", topk, ") must be <= indices.shape[1] (", a.indices.sizes[1], ")");
  if (topk > (int64_t{1} << 30)) fail("topk must be <= 2^30, got ", topk);

  if (a.topk_len.defined) {
    require_dim(a.topk_len, "topk_len", 1, "[num_tokens]");
    require_dtype(a.topk_len, "topk_len", ScalarType::kInt32);
    require_size(a.topk_len, "topk_len", 0, T, "num_tokens of q");
    if (a.topk_len.strides[0] != 1 && T > 1) fail("topk_len must be contiguous");
    same_device(a.topk_len, "topk_len");
  }

  require_defined(a.out, "out");
  require_per_head(a.out, "out", kHeadSizeV, "kv_lora_rank", "[num_tokens, num_heads, 512]");
  require_non_overlapping(a.out, "out");
  same_device(a.out, "out");

  require_defined(a.lse, "lse");
  require_dim(a.lse, "lse", 2, "[num_tokens, num_heads]");
  require_dtype(a.lse, "lse", ScalarType::kFloat32);
  require_size(a.lse, "lse", 0, T, "num_tokens of q");
  require_size(a.lse, "lse", 1, H, "num_heads of q");
  require_non_overlapping(a.lse, "lse");
  same_device(a.lse, "lse");
  // What the launch writes (the workspace when it splits) must not overlap what it reads, nor
  // each other.
  for (const auto& [out, out_name] :
       {std::pair{&a.out, "out"}, std::pair{&a.lse, "lse"}, std::pair{&a.workspace, "workspace"}}) {
    require_disjoint(*out, out_name, a.q, "q");
    require_disjoint(*out, out_name, a.q_pe, "q_pe");
    require_disjoint(*out, out_name, a.kv_cache, "kv_cache");
    require_disjoint(*out, out_name, a.indices, "indices");
    require_disjoint(*out, out_name, a.topk_len, "topk_len");
    require_disjoint(*out, out_name, a.k_scale, "k_scale");
  }
  require_disjoint(a.out, "out", a.lse, "lse");
  require_disjoint(a.out, "out", a.workspace, "workspace");
  require_disjoint(a.lse, "lse", a.workspace, "workspace");

  int64_t workspace_bytes = 0;
  if (a.workspace.defined) {
    require_dtype(a.workspace, "workspace", ScalarType::kUInt8);
    require_dim(a.workspace, "workspace", 1, "[bytes]");
    if (a.workspace.strides[0] != 1) fail("workspace must be contiguous");
    if (!aligned16(a.workspace.data)) fail("workspace must start at a 16-byte aligned address");
    same_device(a.workspace, "workspace");
    workspace_bytes = a.workspace.sizes[0];
  }
  if (!std::isfinite(a.sm_scale) || std::fabs(a.sm_scale) > 3.0e38)
    fail("sm_scale must be a finite float32 value, got ", a.sm_scale);
  if (a.block_heads != 0 && a.block_heads != 16 && a.block_heads != kMaxBlockH)
    fail("block_heads must be 0 (planned), 16 or ", kMaxBlockH, ", got ", a.block_heads);
  if (a.block_heads > 16 && H <= 16)
    fail("block_heads ", a.block_heads, " needs num_heads > 16 (q.shape[1] is ", H, ")");

  SparseMlaFwdLaunch launch{};
  launch.dtype = dtype;
  launch.format = format;
  launch.empty = T == 0;
  SparseMlaFwdParams& p = launch.params;
  p.q_nope = a.q.data;
  p.q_nope_stride_t = a.q.strides[0];
  p.q_nope_stride_h = a.q.strides[1];
  p.q_nope_dim = static_cast<int>(a.q.sizes[2]);
  if (a.q_pe.defined) {
    p.q_pe = a.q_pe.data;
    p.q_pe_stride_t = a.q_pe.strides[0];
    p.q_pe_stride_h = a.q_pe.strides[1];
  }
  p.kv = static_cast<const uint8_t*>(a.kv_cache.data);
  p.kv_row_stride = a.kv_cache.strides[a.kv_cache.dim - 2] * a.kv_cache.element_size;
  p.num_kv_rows = num_kv_rows;
  p.k_scale = a.k_scale.defined ? static_cast<const float*>(a.k_scale.data) : nullptr;
  p.indices = static_cast<const int32_t*>(a.indices.data);
  p.indices_stride_t = a.indices.strides[0];
  p.topk_len = a.topk_len.defined ? static_cast<const int32_t*>(a.topk_len.data) : nullptr;
  p.topk = static_cast<int>(topk);
  p.out = const_cast<void*>(a.out.data);
  p.out_stride_t = a.out.strides[0];
  p.out_stride_h = a.out.strides[1];
  p.lse = static_cast<float*>(const_cast<void*>(a.lse.data));
  p.lse_stride_t = a.lse.strides[0];
  p.lse_stride_h = a.lse.strides[1];
  p.num_tokens = static_cast<int>(T);
  p.num_heads = static_cast<int>(H);
  p.head_size = static_cast<int>(head_size);
  p.sm_scale_log2 = static_cast<float>(a.sm_scale * 1.4426950408889634);
  if (T > (int64_t{1} << 30) / ((H + 15) / 16)) fail("q.shape[0] (num_tokens) is too large");
  const FwdPlan plan = plan_fwd(dtype, format, p.head_size, p.num_tokens, p.num_heads, p.topk, num_sms,
                                workspace_bytes, static_cast<int>(a.block_heads), blocks_per_sm, sm_version);
  p.head_groups = plan.head_groups;
  p.num_splits = plan.num_splits;
  p.tiles_per_split = plan.tiles_per_split;
  p.variant = plan.variant;
  // SPARSE_MLA_E4M3_PV=1, a measuring option (docs/kernel.md): fp8_ds_mla launches planned with
  // their main kernel run its e4m3 P V variant where the device's image has e4m3 MMAs (sm_89+;
  // sm_90 emulates them); the occupancy query answers 0 where it has not.
  if (format == KvFormat::kFp8DsMla && plan.variant == FwdVariant::kMain && env_flag("SPARSE_MLA_E4M3_PV") &&
      sm_version >= 89 && blocks_per_sm != nullptr &&
      blocks_per_sm(dtype, format, p.head_size, plan.head_groups, FwdVariant::kE4m3Pv) > 0)
    p.variant = FwdVariant::kE4m3Pv;
  p.combine_split_groups = plan.combine_split_groups;
  if (p.num_splits > 1) {
    float* ws = static_cast<float*>(const_cast<void*>(a.workspace.data));
    p.partial_out = ws;
    p.partial_lse = ws + static_cast<int64_t>(p.num_splits) * T * H * kHeadSizeV;
  }
  return launch;
}

ConcatAndCacheLaunch check_concat_and_cache(const ConcatAndCacheArgs& a, bool require_cuda) {
  DeviceCheck same_device(require_cuda);
  require_defined(a.kv_c, "kv_c");
  require_dim(a.kv_c, "kv_c", 2, "[num_tokens, kv_lora_rank]");
  ConcatAndCacheLaunch launch{};
  launch.dtype = element_dtype(a.kv_c, "kv_c");
  const int64_t T = a.kv_c.sizes[0];
  require_size(a.kv_c, "kv_c", 1, kKvLoraRank, "kv_lora_rank");
  require_vector_rows(a.kv_c, "kv_c");
  same_device(a.kv_c, "kv_c");
  int head_size = kHeadSizeNoPE;
  if (a.k_pe.defined) {
    require_dim(a.k_pe, "k_pe", 2, "[num_tokens, qk_rope_head_dim]");
    require_dtype(a.k_pe, "k_pe", a.kv_c.dtype);
    require_size(a.k_pe, "k_pe", 0, T, "num_tokens of kv_c");
    require_size(a.k_pe, "k_pe", 1, kQkRopeHeadDim, "qk_rope_head_dim");
    require_vector_rows(a.k_pe, "k_pe");
    same_device(a.k_pe, "k_pe");
    head_size = kHeadSizeRoPE;
  }
  launch.format = parse_kv_cache_dtype(a.kv_cache_dtype, a.kv_cache);
  launch.num_rows = check_kv_cache(a.kv_cache, launch.format, head_size, BlockStride::kAtLeastBlock);
  launch.block_size = a.kv_cache.dim == 3 ? a.kv_cache.sizes[1] : launch.num_rows;
  same_device(a.kv_cache, "kv_cache");
  require_defined(a.slot_mapping, "slot_mapping");
  require_dim(a.slot_mapping, "slot_mapping", 1, "[num_tokens]");
  require_dtype(a.slot_mapping, "slot_mapping", ScalarType::kInt64);
  require_size(a.slot_mapping, "slot_mapping", 0, T, "num_tokens of kv_c");
  if (a.slot_mapping.strides[0] != 1 && T > 1) fail("slot_mapping must be contiguous");
  same_device(a.slot_mapping, "slot_mapping");
  check_k_scale(a.k_scale, launch.format, same_device);
  require_disjoint(a.kv_cache, "kv_cache", a.kv_c, "kv_c");
  require_disjoint(a.kv_cache, "kv_cache", a.k_pe, "k_pe");
  require_disjoint(a.kv_cache, "kv_cache", a.slot_mapping, "slot_mapping");
  require_disjoint(a.kv_cache, "kv_cache", a.k_scale, "k_scale");
  ConcatAndCacheParams& p = launch.params;
  p.kv_c = a.kv_c.data;
  p.kv_c_stride = a.kv_c.strides[0];
  p.k_pe = a.k_pe.defined ? a.k_pe.data : nullptr;
  p.k_pe_stride = a.k_pe.defined ? a.k_pe.strides[0] : 0;
  p.kv_cache = static_cast<uint8_t*>(const_cast<void*>(a.kv_cache.data));
  p.kv_row_stride = a.kv_cache.strides[a.kv_cache.dim - 2] * a.kv_cache.element_size;
  p.kv_block_stride = a.kv_cache.dim == 3 ? a.kv_cache.strides[0] * a.kv_cache.element_size : 0;
  p.block_size = launch.block_size;
  p.slot_mapping = static_cast<const int64_t*>(a.slot_mapping.data);
  p.num_rows = launch.num_rows;
  p.k_scale = a.k_scale.defined ? static_cast<const float*>(a.k_scale.data) : nullptr;
  p.num_tokens = static_cast<int>(T);
  return launch;
}

}  // namespace sparse_mla
