"""Scratch: add SCRATCH_STAMPS per-block timeline to the forward kernel of the tree in cwd (see stamps.py)."""
p='csrc/sparse_mla/params.h'; s=open(p).read()
s=s.replace("  bool paired_scores;\n};","  bool paired_scores;\n  unsigned long long* scratch_stamps;  // SCRATCH\n};",1)
open(p,'w').write(s)
p='csrc/sparse_mla/sparse_mla_fwd_kernel.cuh'; s=open(p).read()
stamp='''
  auto scratch_stamp = [&](int i) {
    if (p.scratch_stamps != nullptr && threadIdx.x == 0) {
      unsigned long long g; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
      unsigned long long* d = p.scratch_stamps + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * 8;
      d[i] = g; d[4 + i] = clock64();
    }
  };
  scratch_stamp(0);
'''
n0 = s.count("  const int tid = threadIdx.x;\n")
s=s.replace("  const int tid = threadIdx.x;\n", stamp+"  const int tid = threadIdx.x;\n",1)
a="    __syncthreads();\n    if constexpr (Traits::kDirectCopy && kStages == 2) {\n"
assert a in s
s=s.replace(a, "    __syncthreads();\n    if (it == 0) scratch_stamp(1);\n    if constexpr (Traits::kDirectCopy && kStages == 2) {\n",1)
a="  cp_async_wait<0>();  // nothing may be in flight when the block exits\n"
assert a in s
s=s.replace(a, "  scratch_stamp(2);\n"+a,1)
e="  }\n}\n\n}  // namespace sparse_mla"
idx=s.rfind(e); assert idx>0
s=s[:idx]+"  }\n  if (p.scratch_stamps != nullptr) { __syncthreads(); scratch_stamp(3); }\n}\n\n}  // namespace sparse_mla"+s[idx+len(e):]
open(p,'w').write(s)
p='csrc/sparse_mla/launch_template.cuh'; s=open(p).read()
s=s.replace("#include <cstdlib>\n","#include <cstdlib>\n#include <cstdio>\n#include <vector>\n#include <algorithm>\n",1)
old="  kernel<<<grid, Traits::kNumThreads, smem, stream>>>(p);\n  err = cudaGetLastError();\n"
assert old in s
new=open('scratch/stamps_launch.inc').read()
s=s.replace(old,new,1)
open(p,'w').write(s)
print("stamps applied")
