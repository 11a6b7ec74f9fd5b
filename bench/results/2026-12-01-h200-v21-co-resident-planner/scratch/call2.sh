set -x
date -u
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
# B: this tree + the plan print; A: e60af76's csrc + the plan print
cp -r csrc /tmp/b_csrc
git apply scratch/print_plan.patch
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
mkdir -p /tmp/B && cp -r $PKG /tmp/B/
rm -rf csrc && cp -r scratch/a_csrc/csrc csrc && git apply scratch/print_plan.patch
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
mkdir -p /tmp/A && cp -r $PKG /tmp/A/
date -u
for i in 1 2; do
  PYTHONPATH=/tmp/A timeout 100 python scratch/ab2.py $OUT/call2_a$i.json h200 > $OUT/call2_plans_a$i.txt 2>&1
  PYTHONPATH=/tmp/B timeout 100 python scratch/ab2.py $OUT/call2_b$i.json h200 > $OUT/call2_plans_b$i.txt 2>&1
done
for i in 1 2; do
  SPARSE_MLA_SM120_OCCUPANCY=1 PYTHONPATH=/tmp/A timeout 60 python scratch/ab2.py $OUT/call2_sa$i.json sm120 > $OUT/call2_plans_sa$i.txt 2>&1
  SPARSE_MLA_SM120_OCCUPANCY=1 PYTHONPATH=/tmp/B timeout 60 python scratch/ab2.py $OUT/call2_sb$i.json sm120 > $OUT/call2_plans_sb$i.txt 2>&1
done
date -u
python scratch/cmp.py $OUT/call2_a1.json $OUT/call2_b1.json $OUT/call2_a2.json $OUT/call2_b2.json
python scratch/cmp.py $OUT/call2_sa1.json $OUT/call2_sb1.json $OUT/call2_sa2.json $OUT/call2_sb2.json
paste -d'|' $OUT/call2_plans_a1.txt $OUT/call2_plans_b1.txt | sed 's/blocks.sm//g' | head -90
paste -d'|' $OUT/call2_plans_sa1.txt $OUT/call2_plans_sb1.txt | head -20
# the final tree, clean
rm -rf csrc && cp -r /tmp/b_csrc csrc
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 120 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify.json 2>&1 | tail -17
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -3
timeout 90 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
