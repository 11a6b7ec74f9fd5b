// Scratch: HMMA.16816 bf16 vs f16 (fp32 accumulate) latency and throughput on this GPU.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)
template <bool kBf16, int kIlp>
__global__ void k(float* sink, int iters, long long* cyc) {
  float acc[kIlp][4] = {};
  unsigned a0 = threadIdx.x * 0x00010001u + 0x3c003c00u, a1 = a0 ^ 0x100u, b0 = a0 ^ 0x200u, b1 = a0 ^ 0x300u;
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kIlp; ++i) {
      if (kBf16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3]) : "r"(a0), "r"(a1), "r"(a0 ^ i), "r"(a1 ^ i), "r"(b0), "r"(b1));
      else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3]) : "r"(a0), "r"(a1), "r"(a0 ^ i), "r"(a1 ^ i), "r"(b0), "r"(b1));
    }
  }
  long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < kIlp; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  if (s == 1234.5f) sink[0] = s;
  if (threadIdx.x == 0 && blockIdx.x == 0) *cyc = t1 - t0;
}
template <bool kBf16, int kIlp>
int run(int sms, int warps_per_sm) {
  float* sink; long long* cyc; CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&cyc, 8));
  const int iters = 4096;
  k<kBf16, kIlp><<<sms, warps_per_sm * 32>>>(sink, 64, cyc);
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  k<kBf16, kIlp><<<sms, warps_per_sm * 32>>>(sink, iters, cyc);
  CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
  float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
  long long c; CK(cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost));
  double mmas = double(sms) * warps_per_sm * iters * kIlp;
  printf("%s ilp=%d warps/SM=%2d: %.1f clk per dependent MMA (warp 0), %.1f TFLOP/s\n", kBf16 ? "bf16" : "f16 ", kIlp, warps_per_sm,
         double(c) / iters, mmas * 4096 / (ms * 1e-3) / 1e12);
  cudaFree(sink); cudaFree(cyc);
  return 0;
}
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int w : {4, 8, 16}) {
    run<true, 1>(sms, w); run<false, 1>(sms, w);
    run<true, 2>(sms, w); run<false, 2>(sms, w);
    run<true, 4>(sms, w); run<false, 4>(sms, w);
    run<true, 8>(sms, w); run<false, 8>(sms, w);
  }
  return 0;
}
