// Which hand-overs of a shared buffer does racecheck accept? S warps (0-7) write a tile's
// scores, a block barrier publishes them, P V warps (8-15) read them and release the buffer
// for the next tile's writes. Variant (argv[1]):
//   0 none: no release (the race control)   1 sync: bar.sync 3 on both sides
//   2 arrive: P V bar.arrive 3, then their own bar.sync 2 (the candidate's arrive version)
//   3 arrive without the own bar.sync 2     4 mbarrier: arrive / try_wait.parity
//   5 mbarrier, P V busy after the arrival  6 mbarrier, S busy before its wait
//   7 as 5 with a P V bar.sync 2 right after the arrival   8 mbarrier, P V busy before the arrival
#include "mbarrier_ptx.cuh"

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

template <int V>
__global__ void __launch_bounds__(512) handover(float* out, int num_tiles) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* buf = reinterpret_cast<float*>(smem);                 // 256 x 4 floats
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8192);
  const int tid = threadIdx.x, warp = tid / 32;
  if (V >= 4 && tid == 256) mb_init(bar, 256);
  __syncthreads();
  float acc = 0.f;
  for (int k = 0; k < num_tiles; ++k) {
    if (warp < 8) {
      if (k > 0) {
        if (V == 1 || V == 2 || V == 3) bar_sync(3, 512);
        if (V == 6) acc += busy(acc, 4000);
        if (V >= 4) mb_wait(bar, (k - 1) & 1);
      }
      reinterpret_cast<float2*>(buf)[tid] = make_float2(k + tid, k - tid);
      reinterpret_cast<float2*>(buf)[tid + 256] = make_float2(k * tid, k + 1);
    }
    __syncthreads();
    if (warp >= 8) {
      const int j = tid - 256;
      const float4 x = reinterpret_cast<const float4*>(buf)[(j * 37) % 256];
      float m = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
      for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
      if (k + 1 < num_tiles) {
        if (V == 1) bar_sync(3, 512);
        if (V == 2 || V == 3) bar_arrive(3, 512);
        if (V == 8) acc += busy(m, 4000);
        if (V >= 4) mb_arrive(bar);
        if (V == 7) bar_sync(2, 256);
        if (V == 5 || V == 7) acc += busy(m, 4000);
      }
      acc += m * 0.5f;
      if (V == 2) bar_sync(2, 256);
    }
  }
  out[blockIdx.x * 512 + tid] = acc;
}

template <int V>
int launch(float* out, int blocks, int tiles) {
  CHECK(cudaFuncSetAttribute(handover<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, 80000));
  handover<V><<<blocks, 512, 80000>>>(out, tiles);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}

int main(int argc, char** argv) {
  const int v = argc > 1 ? atoi(argv[1]) : 0, blocks = 272, tiles = 16;
  float* out;
  CHECK(cudaMalloc(&out, blocks * 512 * sizeof(float)));
  int rc = v == 0 ? launch<0>(out, blocks, tiles) : v == 1 ? launch<1>(out, blocks, tiles) : v == 2 ? launch<2>(out, blocks, tiles)
         : v == 3 ? launch<3>(out, blocks, tiles) : v == 4 ? launch<4>(out, blocks, tiles) : v == 5 ? launch<5>(out, blocks, tiles)
         : v == 6 ? launch<6>(out, blocks, tiles) : v == 7 ? launch<7>(out, blocks, tiles) : launch<8>(out, blocks, tiles);
  float h[4];
  CHECK(cudaMemcpy(h, out + 256, sizeof h, cudaMemcpyDeviceToHost));
  printf("variant %d rc %d out[256..259] %g %g %g %g\n", v, rc, h[0], h[1], h[2], h[3]);
  return rc;
}
