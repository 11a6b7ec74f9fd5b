// The forward kernels in the kernel emulation built with ThreadSanitizer (CMake target
// sparse_mla_race_check, SPARSE_MLA_BUILD_TESTS=ON): every configuration with a cache of each
// `kv_cache_dtype` given (default all four), 16- and 32-head blocks, each variant it has and a
// split launch with its combine, in the three warp schedules.
// runtime.cpp makes every barrier, warp operation and mbarrier phase a release by its arrivals and
// an acquire by its waiters, so TSan reports two threads' memory accesses that no barrier orders
// (as compute-sanitizer's racecheck does on a GPU, for shared memory). Exit 0 when every launch
// passed and TSan reported nothing (TSan's own exit code, 66 by default, otherwise).
// `--self-check missing|synced`: the detector's own check instead, two warps of one block, the
// second reading what the first wrote with no barrier between (TSan must report it) or after a
// __syncthreads (it must not).
//
//   sparse_mla_race_check [bf16|fp16|fp8_e4m3|fp8_ds_mla ...]
//   sparse_mla_race_check --self-check missing|synced
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api.h"
#include "emulate.h"
#include "formats.h"

namespace {

using sparse_mla::KvFormat;
using sparse_mla::ScalarType;

constexpr int kTokens = 2, kTopk = 96, kRows = 128, kBlockSize = 64;

// The caches, by the command line's names: vLLM's kv_cache_dtype, the format, the cache tensor's
// element type.
struct Cache {
  const char* name;
  const char* kv_cache_dtype;
  KvFormat format;
  ScalarType dtype;
};
constexpr Cache kCaches[] = {{"bf16", "bfloat16", KvFormat::kBFloat16, ScalarType::kBFloat16},
                             {"fp16", "float16", KvFormat::kFloat16, ScalarType::kFloat16},
                             {"fp8_e4m3", "fp8_e4m3", KvFormat::kFp8E4m3, ScalarType::kUInt8},
                             {"fp8_ds_mla", "fp8_ds_mla", KvFormat::kFp8DsMla, ScalarType::kUInt8}};

EmuTensor desc(const void* data, ScalarType dtype, int64_t element_size, std::vector<int64_t> sizes) {
  EmuTensor t{};
  t.defined = 1;
  t.data = data;
  t.dtype = static_cast<int32_t>(dtype);
  t.dim = static_cast<int32_t>(sizes.size());
  int64_t stride = 1;
  for (int i = t.dim - 1; i >= 0; --i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = stride;
    stride *= sizes[i];
  }
  t.element_size = element_size;
  return t;
}

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}

// One launch per schedule; returns the number that failed (an emulation error).
int run(const Cache& kv, int head_size, int block_heads, std::mt19937& gen) {
  constexpr int kLatent = sparse_mla::kKvLoraRank;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> q(kTokens * block_heads * head_size), kv_c(kRows * kLatent),
      k_pe(kRows * (head_size - kLatent));
  for (auto& v : q) v = bf16_bits(normal(gen));
  for (auto& v : kv_c) v = bf16_bits(normal(gen));
  for (auto& v : k_pe) v = bf16_bits(normal(gen));
  const int row_bytes = sparse_mla::kv_row_bytes(kv.format, head_size);
  const int64_t kv_elem = kv.dtype == ScalarType::kUInt8 ? 1 : 2;
  std::vector<uint8_t> cache(static_cast<size_t>(kRows) * row_bytes);
  std::vector<int64_t> slots(kRows);
  for (int i = 0; i < kRows; ++i) slots[i] = i;
  const float k_scale = 0.02f;

  char error[4096];
  EmuCacheArgs c{};
  c.kv_c = desc(kv_c.data(), ScalarType::kBFloat16, 2, {kRows, kLatent});
  if (head_size > kLatent) c.k_pe = desc(k_pe.data(), ScalarType::kBFloat16, 2, {kRows, head_size - kLatent});
  c.kv_cache = desc(cache.data(), kv.dtype, kv_elem, {kRows / kBlockSize, kBlockSize, row_bytes / kv_elem});
  c.slot_mapping = desc(slots.data(), ScalarType::kInt64, 8, {kRows});
  if (kv.format == KvFormat::kFp8E4m3) c.k_scale = desc(&k_scale, ScalarType::kFloat32, 4, {1});
  c.kv_cache_dtype = kv.kv_cache_dtype;
  if (sparse_mla_emulate_concat_and_cache(&c, error, sizeof(error)) != 0) {
    std::printf("%s D%d: cache write failed: %s\n", kv.name, head_size, error);
    return 3;
  }

  std::vector<int32_t> indices(kTokens * kTopk);
  std::uniform_int_distribution<int> row(0, kRows - 1);
  for (auto& i : indices) {
    const int r = row(gen);
    i = r % 7 == 0 ? -1 : r;  // about one slot in seven masked
  }
  int failed = 0;
  // Every variant (params.h FwdVariant; those the configuration lacks say so) but E4m3Pv (the
  // emulation has no e4m3 MMA), and the main one split in two with the combine kernel after it.
  for (int launch = 0; launch < 5 * 3; ++launch) {
    const int variant = launch / 3 % 4, splits = launch / 3 == 4 ? 2 : 1, schedule = launch % 3;
    std::vector<uint16_t> out(kTokens * block_heads * sparse_mla::kHeadSizeV);
    std::vector<float> lse(kTokens * block_heads);
    EmuFwdArgs a{};
    a.q = desc(q.data(), ScalarType::kBFloat16, 2, {kTokens, block_heads, head_size});
    a.kv_cache = c.kv_cache;
    a.indices = desc(indices.data(), ScalarType::kInt32, 4, {kTokens, kTopk});
    a.k_scale = c.k_scale;
    a.out = desc(out.data(), ScalarType::kBFloat16, 2, {kTokens, block_heads, sparse_mla::kHeadSizeV});
    a.lse = desc(lse.data(), ScalarType::kFloat32, 4, {kTokens, block_heads});
    a.sm_scale = 0.1;
    a.topk = -1;
    a.kv_cache_dtype = kv.kv_cache_dtype;
    a.block_heads = block_heads;
    a.variant = variant;
    a.num_splits = splits;
    a.combine_split_groups = 1;
    a.schedule = schedule;
    const bool ok = sparse_mla_emulate_fwd(&a, error, sizeof(error)) == 0;
    const bool lacks = !ok && std::strstr(error, "does not exist for this configuration") != nullptr;
    std::printf("%-10s D%d %d-head blocks variant %d, %d split(s), schedule %d: %s\n", kv.name, head_size,
                block_heads, variant, splits, schedule, ok ? "ran" : lacks ? "no such variant" : error);
    failed += !ok && !lacks;
  }
  return failed;
}

void self_check(bool synced) {
  static float written[32];
  emu::run_grid(dim3(1), dim3(64), nullptr, 0, [&] {
    if (threadIdx.x < 32) written[threadIdx.x] = 1.f;
    if (synced) __syncthreads();
    if (threadIdx.x >= 32) {
      const volatile float* w = written;
      (void)w[threadIdx.x - 32];
    }
  }, emu::Schedule::kLockstep);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--self-check" &&
      (std::string(argv[2]) == "missing" || std::string(argv[2]) == "synced")) {
    self_check(std::string(argv[2]) == "synced");
    std::printf("race_check: self-check %s ran\n", argv[2]);
    return 0;
  }
  std::vector<const Cache*> kvs;
  for (int i = 1; i < argc; ++i) {
    const Cache* found = nullptr;
    for (const Cache& c : kCaches) found = std::string(argv[i]) == c.name ? &c : found;
    if (found == nullptr) {
      std::printf("unknown kv_cache_dtype '%s' (bf16, fp16, fp8_e4m3, fp8_ds_mla)\n", argv[i]);
      return 2;
    }
    kvs.push_back(found);
  }
  if (kvs.empty())
    for (const Cache& c : kCaches) kvs.push_back(&c);
  std::mt19937 gen(0);
  int failed = 0;
  for (const Cache* kv : kvs) {
    for (int head_size : {512, 576})
      for (int block_heads : {16, 32}) failed += run(*kv, head_size, block_heads, gen);
  }
  std::printf("race_check: %d launches failed\n", failed);
  return failed == 0 ? 0 : 1;
}
