// Host API of the sparse-MLA forward and of the cache writer: every precondition of the entry
// points in one place, checked before any launch. Framework-free: the torch binding
// describes its tensors with TensorDesc, and the GoogleTest suite drives the same checks.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cache_write.h"
#include "formats.h"
#include "params.h"
#include "planner.h"

namespace sparse_mla {

// Element type of a tensor as the checks see it.
enum class ScalarType { kBFloat16, kFloat16, kFloat32, kInt32, kInt64, kUInt8, kFloat8E4m3, kOther };
const char* scalar_type_name(ScalarType t);

// What the checks need to know of a tensor. `defined == false` is an absent optional.
struct TensorDesc {
  bool defined = false;
  const void* data = nullptr;
  ScalarType dtype = ScalarType::kOther;
  int dim = 0;
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};  // in elements
  bool is_cuda = false;
  int device_index = -1;
  int64_t element_size = 0;  // bytes
  const char* dtype_name = nullptr;  // the framework's name, for messages about kOther
};

// A bad argument: the message names the argument and what was expected.
class ArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Parses a vLLM kv_cache_dtype string ("auto" resolves from the cache tensor's dtype).
KvFormat parse_kv_cache_dtype(const std::string& kv_cache_dtype, const TensorDesc& kv_cache);

struct SparseMlaFwdArgs {
  TensorDesc q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse, workspace;
  double sm_scale = 0.0;
  int64_t topk = -1;  // -1: indices.size(1)
  std::string kv_cache_dtype = "auto";
  int64_t block_heads = 0;  // heads per block: 0 plans it (plan_head_groups); 16 or 32 force it
};

// The validated launch: parameters plus the configuration to dispatch.
struct SparseMlaFwdLaunch {
  SparseMlaFwdParams params;
  DType dtype;
  KvFormat format;
  bool empty;  // no query tokens: nothing to launch
};

// Checks every argument (shapes, dtypes, devices, alignment, supported H and D, topk >= 1,
// block_heads 0, 16, or 32 with more than 16 heads) and throws ArgumentError naming the first
// bad one. `require_cuda`: all tensors on one CUDA device (the kernel path); otherwise all on one
// device of any kind (the CPU reference path).
// num_sms, blocks_per_sm (null: one block per SM, no variants) and sm_version (10 x major +
// minor, 0: unknown) go to planner.h plan_fwd: the heads per block, the split of the top-k axis
// (only with a workspace) and the kernel variant.
SparseMlaFwdLaunch plan_sparse_mla_fwd(const SparseMlaFwdArgs& args, bool require_cuda, int num_sms,
                                       BlocksPerSmFn blocks_per_sm = nullptr, int sm_version = 0);

struct ConcatAndCacheArgs {
  TensorDesc kv_c, k_pe, kv_cache, slot_mapping, k_scale;
  std::string kv_cache_dtype = "auto";
};
struct ConcatAndCacheLaunch {
  KvFormat format;
  DType dtype;       // of kv_c / k_pe
  int64_t num_rows;    // cache rows (slots 0 .. num_rows - 1)
  int64_t block_size;  // rows per block: slot s is row s % block_size of block s / block_size
  ConcatAndCacheParams params;  // the kernel's, from the tensors
};
ConcatAndCacheLaunch check_concat_and_cache(const ConcatAndCacheArgs& args, bool require_cuda);

}  // namespace sparse_mla
