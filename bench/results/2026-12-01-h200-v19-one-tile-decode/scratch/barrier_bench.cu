// Scratch: cost of a cooperative grid barrier against a PDL-launched second kernel, in CUDA graphs.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ void spin(int ns) {
  if (ns <= 0) return;
  uint64_t t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  uint64_t t; do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (uint64_t)ns);
}
__global__ void k_work(int ns, float* sink) { spin(ns); if (threadIdx.x == 0 && ns < 0) sink[blockIdx.x] = 1.f; }
__global__ void k_coop(int ns, float* sink) {
  spin(ns);
  if (threadIdx.x == 0) sink[blockIdx.x] = 1.f;
  cg::this_grid().sync();
  if (threadIdx.x == 0) sink[blockIdx.x + 4096] = sink[(blockIdx.x + 1) % gridDim.x];
}
__global__ void k_primary(int ns, float* sink) {
  spin(ns);
  if (threadIdx.x == 0) sink[blockIdx.x] = 1.f;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__global__ void k_dependent(float* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) sink[blockIdx.x + 4096] = sink[blockIdx.x % 34];
}

int main() {
  float* sink; CK(cudaMalloc(&sink, 1 << 20));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int reps = 200;
  auto launch = [&](int mode, int G, int ns) {
    cudaLaunchConfig_t c = {}; c.gridDim = dim3(G); c.blockDim = dim3(128); c.stream = st;
    cudaLaunchAttribute a[1]; c.attrs = a;
    if (mode == 0) { c.numAttrs = 0; CK(cudaLaunchKernelEx(&c, k_work, ns, sink)); }
    if (mode == 1) { a[0].id = cudaLaunchAttributeCooperative; a[0].val.cooperative = 1; c.numAttrs = 1; CK(cudaLaunchKernelEx(&c, k_coop, ns, sink)); }
    if (mode == 2 || mode == 3) {
      c.numAttrs = 0; CK(cudaLaunchKernelEx(&c, k_primary, ns, sink));
      cudaLaunchConfig_t d = {}; d.gridDim = dim3(64); d.blockDim = dim3(128); d.stream = st; d.attrs = a;
      a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[0].val.programmaticStreamSerializationAllowed = 1;
      d.numAttrs = mode == 2 ? 1 : 0;
      CK(cudaLaunchKernelEx(&d, k_dependent, sink));
    }
  };
  const char* names[] = {"one kernel", "cooperative + grid.sync", "two kernels, PDL", "two kernels, plain"};
  for (int ns : {0, 4000}) for (int G : {34, 66, 132, 264}) {
    for (int round = 0; round < 2; ++round) for (int mode = 0; mode < 4; ++mode) {
      for (int i = 0; i < 20; ++i) launch(mode, G, ns);
      CK(cudaStreamSynchronize(st));
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < reps; ++i) launch(mode, G, ns);
      CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      std::vector<float> t;
      for (int r = 0; r < 7; ++r) {
        cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / reps);
      }
      std::sort(t.begin(), t.end());
      printf("spin %4d ns  grid %3d  %-26s %6.2f us\n", ns, G, names[mode], t[3]);
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }
  }
  return 0;
}
