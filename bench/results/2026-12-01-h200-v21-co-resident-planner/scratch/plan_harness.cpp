#include <cstdio>
#include "api.h"
using namespace sparse_mla;
int occ(bool sm120, KvFormat f, int D, int groups, FwdVariant v) {
  if (!sm120) {
    if (v != FwdVariant::kMain) return 0;
    if (groups == 2) return 1;
    return (f == KvFormat::kFp8E4m3 && D == 512) ? 3 : 2;
  }
  const bool sixteen = groups == 1;
  const bool bits16 = f == KvFormat::kBFloat16 || f == KvFormat::kFloat16;
  switch (v) {
    case FwdVariant::kOneStage: return sixteen && bits16 ? 2 : 0;
    case FwdVariant::kDecodedFp8: return bits16 || (!sixteen && D == 512 && f == KvFormat::kFp8E4m3) ? 0 : sixteen ? 2 : 1;
    default: return sixteen && !bits16 && !(f == KvFormat::kFp8DsMla && D == 576) ? 2 : 1;
  }
}
int main() {
  const char* names[] = {"bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"};
  KvFormat fmts[] = {KvFormat::kBFloat16, KvFormat::kFloat16, KvFormat::kFp8E4m3, KvFormat::kFp8DsMla};
  const int sms = 132; const int64_t ws = workspace_size(132);
  for (int sm120 = 0; sm120 < 2; ++sm120)
  for (int model = 0; model < 2; ++model) {
    const int D = model ? 576 : 512, topk = model ? 2048 : 2176;
    for (int H : {8, 16, 32, 64, 128}) {
      if (!model && H == 128) continue;
      for (int T : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 256, 1024})
        for (int fi = 0; fi < 4; ++fi) {
          KvFormat f = fmts[fi];
          const int g = plan_head_groups(T, H, f, topk, sms, ws, occ(sm120, f, D, 1, FwdVariant::kMain), occ(sm120, f, D, 2, FwdVariant::kMain));
          const int dec = occ(sm120, f, D, g, FwdVariant::kDecodedFp8);
          const bool is8 = f == KvFormat::kFp8E4m3 || f == KvFormat::kFp8DsMla;
#ifdef NEW
          SplitPlan s = plan_fwd_splits(T, H, g, f, topk, sms, ws, occ(sm120, f, D, g, FwdVariant::kMain), occ(sm120, f, D, g, FwdVariant::kOneStage), dec);
#else
          SplitPlan s = plan_fwd_splits(T, H, g, topk, sms, ws, occ(sm120, f, D, g, FwdVariant::kMain), occ(sm120, f, D, g, FwdVariant::kOneStage), dec);
#endif
          const bool decoded = is8 && (s.decoded_fp8 || decoded_fp8_plan(T, H, g, s, sms, 0));
          std::printf("%s %s H%d T%d %s: g%d s%d t%d os%d dec%d\n", sm120 ? "sm120" : "h200", model ? "Dee" : "GLM", H, T, names[fi], g, s.num_splits, s.tiles_per_split, int(s.one_stage), int(decoded));
        }
    }
  }
}
