// PyTorch ops over the kernel library: torch.ops.sparse_mla_bw.*.
// Tensors are described to the framework-free host API (sparse_mla/api.h), which checks every
// argument before anything is launched; this file only translates types and errors.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ceilings/ceilings.h"
#include "sparse_mla/api.h"
#include "sparse_mla/cache_write.h"
#include "sparse_mla/kernel_traits.h"
#include "sparse_mla/launch.h"

namespace {

using sparse_mla::ScalarType;
using sparse_mla::TensorDesc;

ScalarType to_scalar_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return ScalarType::kBFloat16;
    case at::kHalf: return ScalarType::kFloat16;
    case at::kFloat: return ScalarType::kFloat32;
    case at::kInt: return ScalarType::kInt32;
    case at::kLong: return ScalarType::kInt64;
    case at::kByte: return ScalarType::kUInt8;
    case at::kFloat8_e4m3fn: return ScalarType::kFloat8E4m3;
    default: return ScalarType::kOther;
  }
}

TensorDesc describe(const at::Tensor& t, const char* name) {
  TensorDesc d;
  d.defined = t.defined();
  if (!d.defined) return d;
  if (t.dim() > 4) {
    // Messages carry only strings: integers formatted through iostreams in this module crashed
    // in a host process whose libstdc++ differs from the compiler's (seen with torch 2.11).
    std::string shape;
    for (int64_t s : t.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
    TORCH_CHECK_VALUE(false, std::string(name) + " must have at most 4 dims, got shape [" + shape + "]");
  }
  d.dtype_name = c10::toString(t.scalar_type());
  d.data = t.data_ptr();
  d.dtype = to_scalar_type(t.scalar_type());
  d.dim = static_cast<int>(t.dim());
  for (int i = 0; i < d.dim; ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  d.is_cuda = t.is_cuda();
  d.device_index = t.is_cuda() ? t.get_device() : -1;
  d.element_size = static_cast<int64_t>(t.element_size());
  return d;
}

TensorDesc describe(const std::optional<at::Tensor>& t, const char* name) {
  return t.has_value() ? describe(*t, name) : TensorDesc{};
}

// ArgumentError -> Python ValueError, with the message naming the argument.
template <typename F>
auto checked(F&& f) {
  try {
    return f();
  } catch (const sparse_mla::ArgumentError& e) {
    TORCH_CHECK_VALUE(false, std::string(e.what()));
  }
}

// Argument `name` described under its own name, as the checks' messages call it.
#define DESCRIBE(name) (a.name = describe(name, #name))

sparse_mla::SparseMlaFwdArgs fwd_args(const at::Tensor& q, const std::optional<at::Tensor>& q_pe,
                                      const at::Tensor& kv_cache, const at::Tensor& indices,
                                      const std::optional<at::Tensor>& topk_len,
                                      const std::optional<at::Tensor>& k_scale, const at::Tensor& out,
                                      const at::Tensor& lse, const std::optional<at::Tensor>& workspace,
                                      double sm_scale, int64_t topk, const std::string& kv_cache_dtype,
                                      int64_t block_heads) {
  sparse_mla::SparseMlaFwdArgs a;
  DESCRIBE(q), DESCRIBE(q_pe), DESCRIBE(kv_cache), DESCRIBE(indices), DESCRIBE(topk_len), DESCRIBE(k_scale);
  DESCRIBE(out), DESCRIBE(lse), DESCRIBE(workspace);
  a.sm_scale = sm_scale;
  a.topk = topk;
  a.kv_cache_dtype = kv_cache_dtype;
  a.block_heads = block_heads;
  return a;
}

// The forward op on CUDA (kLaunch) and its argument check alone, which the CPU path runs first:
// one signature, the op schema's.
template <bool kLaunch>
void sparse_mla_fwd_op(const at::Tensor& q, const std::optional<at::Tensor>& q_pe, const at::Tensor& kv_cache,
                       const at::Tensor& indices, const std::optional<at::Tensor>& topk_len,
                       const std::optional<at::Tensor>& k_scale, const at::Tensor& out, const at::Tensor& lse,
                       const std::optional<at::Tensor>& workspace, double sm_scale, int64_t topk,
                       const std::string& kv_cache_dtype, int64_t block_heads) {
  const auto args = fwd_args(q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace,
                             sm_scale, topk, kv_cache_dtype, block_heads);
  if constexpr (!kLaunch) {
    checked([&] { return sparse_mla::plan_sparse_mla_fwd(args, false, 0); });
  } else {
    TORCH_CHECK_VALUE(q.is_cuda(), "q must be a CUDA tensor");
    const c10::cuda::CUDAGuard guard(q.device());
    const cudaDeviceProp* props = at::cuda::getDeviceProperties(q.get_device());
    const auto launch = checked([&] {
      return sparse_mla::plan_sparse_mla_fwd(args, true, props->multiProcessorCount, &sparse_mla::fwd_blocks_per_sm,
                                             10 * props->major + props->minor);
    });
    if (launch.empty) return;
    const cudaError_t err = sparse_mla::dispatch_sparse_mla_fwd(
        launch.params, launch.dtype, launch.format, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "sparse_mla_fwd launch failed: ", cudaGetErrorString(err));
  }
}

sparse_mla::ConcatAndCacheArgs cache_args(const at::Tensor& kv_c, const std::optional<at::Tensor>& k_pe,
                                          const at::Tensor& kv_cache, const at::Tensor& slot_mapping,
                                          const std::optional<at::Tensor>& k_scale,
                                          const std::string& kv_cache_dtype) {
  sparse_mla::ConcatAndCacheArgs a;
  DESCRIBE(kv_c), DESCRIBE(k_pe), DESCRIBE(kv_cache), DESCRIBE(slot_mapping), DESCRIBE(k_scale);
  a.kv_cache_dtype = kv_cache_dtype;
  return a;
}
#undef DESCRIBE

void concat_and_cache_cuda(const at::Tensor& kv_c, const std::optional<at::Tensor>& k_pe,
                           const at::Tensor& kv_cache, const at::Tensor& slot_mapping,
                           const std::optional<at::Tensor>& k_scale, const std::string& kv_cache_dtype) {
  const auto args = cache_args(kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype);
  const auto launch = checked([&] { return sparse_mla::check_concat_and_cache(args, true); });
  const c10::cuda::CUDAGuard guard(kv_c.device());
  const cudaError_t err = sparse_mla::launch_concat_and_cache(launch.params, launch.dtype, launch.format,
                                                              at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "concat_and_cache_sparse_mla launch failed: ", cudaGetErrorString(err));
}

void check_concat_and_cache(const at::Tensor& kv_c, const std::optional<at::Tensor>& k_pe,
                            const at::Tensor& kv_cache, const at::Tensor& slot_mapping,
                            const std::optional<at::Tensor>& k_scale, const std::string& kv_cache_dtype) {
  const auto args = cache_args(kv_c, k_pe, kv_cache, slot_mapping, k_scale, kv_cache_dtype);
  checked([&] { return sparse_mla::check_concat_and_cache(args, false); });
}

// Benchmark ceilings (bench/ and `python -m vllm_sparse_mla_blackwell bench`).
void bench_gather_rows(const at::Tensor& rows, const at::Tensor& indices, const at::Tensor& checksum) {
  TORCH_CHECK_VALUE(rows.is_cuda() && rows.dim() == 2 && rows.scalar_type() == at::kByte && rows.stride(1) == 1 &&
                        rows.size(1) % 16 == 0 && rows.stride(0) % 16 == 0,
                    "rows must be a CUDA uint8 [num_rows, row_bytes] tensor, row_bytes a multiple of 16");
  TORCH_CHECK_VALUE(indices.is_cuda() && indices.dim() == 2 && indices.scalar_type() == at::kInt && indices.is_contiguous(),
                    "indices must be a contiguous CUDA int32 [num_tokens, topk] tensor");
  TORCH_CHECK_VALUE(checksum.is_cuda() && checksum.scalar_type() == at::kInt && checksum.numel() > 0,
                    "checksum must be a non-empty CUDA int32 tensor");
  const c10::cuda::CUDAGuard guard(rows.device());
  const cudaError_t err = sparse_mla::launch_gather_rows(
      rows.data_ptr<uint8_t>(), rows.stride(0), static_cast<int>(rows.size(1)), indices.data_ptr<int32_t>(),
      static_cast<int>(indices.size(0)), static_cast<int>(indices.size(1)),
      reinterpret_cast<uint32_t*>(checksum.data_ptr<int32_t>()), static_cast<int>(checksum.numel()),
      at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "bench_gather_rows: ", cudaGetErrorString(err));
}

int64_t bench_mma_sync_peak(const at::Tensor& sink, int64_t num_blocks, int64_t iters, const std::string& dtype) {
  using sparse_mla::MmaPeakType;
  TORCH_CHECK_VALUE(dtype == "bf16" || dtype == "fp16" || dtype == "e4m3",
                    "bench_mma_sync_peak: dtype must be bf16, fp16 or e4m3, got '" + dtype + "'");
  const MmaPeakType type = dtype == "e4m3"   ? MmaPeakType::kE4m3
                           : dtype == "fp16" ? MmaPeakType::kFp16
                                             : MmaPeakType::kBf16;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK_VALUE(num_blocks >= 1 && num_blocks <= kIntMax / sparse_mla::kPeakWarpsPerBlock,
                    "bench_mma_sync_peak: num_blocks must be in [1, ", kIntMax / sparse_mla::kPeakWarpsPerBlock,
                    "], got ", num_blocks);
  TORCH_CHECK_VALUE(iters >= 1 && iters <= kIntMax, "bench_mma_sync_peak: iters must be in [1, ", kIntMax, "], got ",
                    iters);
  TORCH_CHECK_VALUE(sink.is_cuda() && sink.scalar_type() == at::kFloat &&
                        sink.numel() >= num_blocks * sparse_mla::kPeakWarpsPerBlock,
                    "bench_mma_sync_peak: sink must be a CUDA float32 tensor of at least num_blocks * 8 = ",
                    num_blocks * sparse_mla::kPeakWarpsPerBlock, " elements, got ", sink.scalar_type(), " ",
                    sink.device(), " of ", sink.numel());
  const c10::cuda::CUDAGuard guard(sink.device());
  const cudaError_t err = sparse_mla::launch_mma_sync_peak(sink.data_ptr<float>(), static_cast<int>(num_blocks),
                                                           static_cast<int>(iters), type,
                                                           at::cuda::getCurrentCUDAStream());
  if (type == MmaPeakType::kE4m3) {
    // NotImplementedError: callers that measure every peak the GPU has skip e4m3 where it is missing.
    TORCH_CHECK_NOT_IMPLEMENTED(err != cudaErrorNotSupported,
                                "bench_mma_sync_peak: dtype e4m3 needs a GPU of compute capability 8.9 or newer "
                                "(mma.sync e4m3)");
    TORCH_CHECK_NOT_IMPLEMENTED(err != cudaErrorNoKernelImageForDevice,
                                "bench_mma_sync_peak: dtype e4m3 needs an sm_89 or newer build for this GPU; the "
                                "library was built for " SPARSE_MLA_TARGETS " (GLM53_ARCHS)");
  }
  TORCH_CHECK(err == cudaSuccess, "bench_mma_sync_peak: ", cudaGetErrorString(err));
  return num_blocks * sparse_mla::kPeakWarpsPerBlock * iters * sparse_mla::kPeakMmasPerIter *
         sparse_mla::peak_flop_per_mma(type);
}

int64_t workspace_size(int64_t num_sms) { return sparse_mla::workspace_size(static_cast<int>(num_sms)); }

// Blocks of the forward kernel for (q dtype, cache format, head_size, a block of num_heads heads:
// 16-head for 1-16, 32-head for 17-128) that one SM of `device` holds at once, or those of its
// `variant` (0 where it has none): what the planner plans with. For tests and benchmarks.
int64_t fwd_blocks_per_sm(at::ScalarType dtype, const std::string& kv_cache_dtype, int64_t head_size,
                          int64_t num_heads, at::Device device, const std::string& variant) {
  using sparse_mla::FwdVariant;
  const FwdVariant v = variant == "main"            ? FwdVariant::kMain
                       : variant == "one_stage"     ? FwdVariant::kOneStage
                       : variant == "decoded_fp8"   ? FwdVariant::kDecodedFp8
                       : variant == "paired_scores" ? FwdVariant::kPairedScores
                                                    : static_cast<FwdVariant>(-1);
  TORCH_CHECK_VALUE(v != static_cast<FwdVariant>(-1),
                    "variant must be main, one_stage, decoded_fp8 or paired_scores, got '" + variant + "'");
  TORCH_CHECK_VALUE(dtype == at::kBFloat16 || dtype == at::kHalf,
                    std::string("dtype must be bfloat16 or float16, got ") + c10::toString(dtype));
  TORCH_CHECK_VALUE(kv_cache_dtype != "auto", "kv_cache_dtype must name the cache format ('auto' needs a cache)");
  TORCH_CHECK_VALUE(head_size == sparse_mla::kHeadSizeNoPE || head_size == sparse_mla::kHeadSizeRoPE,
                    "head_size must be 512 or 576, got " + std::to_string(head_size));
  TORCH_CHECK_VALUE(num_heads >= 1 && num_heads <= sparse_mla::kMaxNumHeads,
                    "num_heads must be in 1.." + std::to_string(sparse_mla::kMaxNumHeads) + ", got " +
                        std::to_string(num_heads));
  TORCH_CHECK_VALUE(device.is_cuda(), "device must be a CUDA device");
  const auto format = checked([&] { return sparse_mla::parse_kv_cache_dtype(kv_cache_dtype, TensorDesc{}); });
  const c10::cuda::CUDAGuard guard(device);
  return sparse_mla::fwd_blocks_per_sm(dtype == at::kBFloat16 ? sparse_mla::DType::kBFloat16 : sparse_mla::DType::kFloat16,
                                       format, static_cast<int>(head_size),
                                       sparse_mla::head_groups_for(static_cast<int>(num_heads)), v);
}

// The CUDA targets this library was built for, as GLM53_ARCHS listed them ("80,120a", plus
// "ptx80" when PTX was embedded).
std::string compiled_targets() { return SPARSE_MLA_TARGETS; }

std::vector<int64_t> format_constants() {
  return {sparse_mla::kKvLoraRank,       sparse_mla::kQkRopeHeadDim,    sparse_mla::kHeadSizeV,
          sparse_mla::kMaxNumHeads,      sparse_mla::kSmemBudgetBytes,  sparse_mla::kDsMlaRecordBytes,
          sparse_mla::kDsMlaScaleOffset, sparse_mla::kDsMlaRopeOffset, sparse_mla::kDsMlaTile};
}

}  // namespace

TORCH_LIBRARY(sparse_mla_bw, m) {
  m.def(
      "sparse_mla_fwd(Tensor q, Tensor? q_pe, Tensor kv_cache, Tensor indices, Tensor? topk_len, "
      "Tensor? k_scale, Tensor(a!) out, Tensor(b!) lse, Tensor(c!)? workspace, float sm_scale, "
      "int topk, str kv_cache_dtype, int block_heads=0) -> ()");
  m.def(
      "check_sparse_mla_fwd(Tensor q, Tensor? q_pe, Tensor kv_cache, Tensor indices, "
      "Tensor? topk_len, Tensor? k_scale, Tensor out, Tensor lse, Tensor? workspace, float sm_scale, "
      "int topk, str kv_cache_dtype, int block_heads=0) -> ()",
      &sparse_mla_fwd_op<false>);
  m.def(
      "concat_and_cache_sparse_mla(Tensor kv_c, Tensor? k_pe, Tensor(a!) kv_cache, "
      "Tensor slot_mapping, Tensor? k_scale, str kv_cache_dtype) -> ()");
  m.def(
      "check_concat_and_cache_sparse_mla(Tensor kv_c, Tensor? k_pe, Tensor kv_cache, "
      "Tensor slot_mapping, Tensor? k_scale, str kv_cache_dtype) -> ()",
      &check_concat_and_cache);
  m.def("workspace_size(int num_sms) -> int", &workspace_size);
  m.def("fwd_blocks_per_sm(ScalarType dtype, str kv_cache_dtype, int head_size, int num_heads, Device device, "
        "str variant=\"main\") -> int",
        &fwd_blocks_per_sm);
  m.def("format_constants() -> int[]", &format_constants);
  m.def("compiled_targets() -> str", &compiled_targets);
  m.def("bench_gather_rows(Tensor rows, Tensor indices, Tensor(a!) checksum) -> ()", &bench_gather_rows);
  m.def("bench_mma_sync_peak(Tensor(a!) sink, int num_blocks, int iters, str dtype=\"bf16\") -> int",
        &bench_mma_sync_peak);
}

TORCH_LIBRARY_IMPL(sparse_mla_bw, CUDA, m) {
  m.impl("sparse_mla_fwd", &sparse_mla_fwd_op<true>);
  m.impl("concat_and_cache_sparse_mla", &concat_and_cache_cuda);
}
