// Which part of the ping-pong kernel's barrier structure makes racecheck report its hand-over
// when two blocks share an SM? S warps (0-7) write a tile, one block barrier publishes it, P V
// warps (8-15) read it and hand the buffer back by an mbarrier (the old handover.cu's variant 4,
// which racecheck accepts). Flags of argv[1]:
//   1 roles' own named barriers (S: bar.sync 1, 256 twice before the loop; P V: bar.sync 2, 256
//     after each read), as the kernel's q staging and P barrier
//   2 the block barrier at one place in the code for both roles (else: S's, P V's first, P V's)
//   4 the S warps stay until the P V warps end (else they exit after their last barrier)
//   8 P V busy after the arrival (4,000 dependent FMAs), as the kernel's softmax and P V
//   16 the S warps' two only; 32 the P V warps' only; 64 one of each role's own per tile (S: after
//      its writes), so that every warp passes as many barriers as every other
//   128 two block barriers before the loop, both roles (the S warps' two of 16 as block barriers)
// argv[2]: blocks (80,000 B of shared memory each: two fit an SM).
#include "../2026-12-06-h100-pingpong-racecheck/mbarrier_ptx.cuh"

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

template <int V>
__global__ void __launch_bounds__(512) roles(float* out, int num_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* buf = reinterpret_cast<float*>(smem);  // 256 x 4 floats
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8192);
  const int tid = threadIdx.x, warp = tid / 32;
  const bool s_role = warp < 8;
  if (tid == 256) mb_init(bar, 256);
  float acc = 0.f;
  if (s_role && (V & 17)) { bar_sync(1, 256); acc += 1.f; bar_sync(1, 256); }
  if (V & 128) { bar_sync(0, 512); acc += 1.f; bar_sync(0, 512); }  // both roles
  auto s_phase = [&](int k) {
    if (k > 0) mb_wait(bar, (k - 1) & 1);
    reinterpret_cast<float2*>(buf)[tid] = make_float2(k + tid, k - tid);
    reinterpret_cast<float2*>(buf)[tid + 256] = make_float2(k * tid, k + 1);
    if (V & 64) bar_sync(1, 256);
  };
  auto pv_phase = [&](int k) {  // tile k - 1
    const int j = tid - 256;
    const float4 x = reinterpret_cast<const float4*>(buf)[(j * 37) % 256];
    float m = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    if (k < num_tiles) mb_arrive(bar);
    if (V & 8) acc += busy(m, 4000);
    if (V & 97) bar_sync(2, 256);
    acc += m * 0.5f;
  };
  if (V & 2) {
    for (int k = 0; k <= num_tiles; ++k) {
      bar_sync(0, 512);
      if (s_role) {
        if (k < num_tiles) s_phase(k);
      } else if (k > 0) {
        pv_phase(k);
      }
    }
  } else if (s_role) {
    for (int k = 0; k <= num_tiles; ++k) {
      bar_sync(0, 512);
      if (k == num_tiles) break;
      s_phase(k);
    }
  } else {
    bar_sync(0, 512);
    for (int k = 1; k <= num_tiles; ++k) {
      bar_sync(0, 512);
      pv_phase(k);
    }
  }
  if (V & 4) bar_sync(3, 512);
  else if (s_role) return;
  out[blockIdx.x * 512 + tid] = acc;
}

template <int V>
int launch(float* out, int blocks, int tiles) {
  CHECK(cudaFuncSetAttribute(roles<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, 80000));
  roles<V><<<blocks, 512, 80000>>>(out, tiles);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}

int main(int argc, char** argv) {
  const int v = argc > 1 ? atoi(argv[1]) : 0, blocks = argc > 2 ? atoi(argv[2]) : 133, tiles = 16;
  float* out;
  CHECK(cudaMalloc(&out, blocks * 512 * sizeof(float)));
  int rc = 2;
  switch (v) {
    case 0: rc = launch<0>(out, blocks, tiles); break;
    case 1: rc = launch<1>(out, blocks, tiles); break;
    case 8: rc = launch<8>(out, blocks, tiles); break;
    case 9: rc = launch<9>(out, blocks, tiles); break;
    case 11: rc = launch<11>(out, blocks, tiles); break;
    case 13: rc = launch<13>(out, blocks, tiles); break;
    case 24: rc = launch<24>(out, blocks, tiles); break;
    case 40: rc = launch<40>(out, blocks, tiles); break;
    case 72: rc = launch<72>(out, blocks, tiles); break;
    case 168: rc = launch<168>(out, blocks, tiles); break;
    default: printf("no variant %d\n", v);
  }
  printf("variant %d blocks %d rc %d\n", v, blocks, rc);
  return rc;
}
