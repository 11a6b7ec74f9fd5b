set -x
date -u
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv
build() { GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3; }
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
# B: the overlap (default)
time build
grep -n "define SPARSE_MLA_OVERLAP_TILES" csrc/sparse_mla/kernel_traits.h
mkdir -p /tmp/B && rm -rf /tmp/B/* && cp -r $PKG /tmp/B/
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py -x 2>&1 | tail -15
timeout 200 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify_b.json 2>&1 | tail -25
# A: without it
sed -i 's/#define SPARSE_MLA_OVERLAP_TILES 1/#define SPARSE_MLA_OVERLAP_TILES 0/' csrc/sparse_mla/kernel_traits.h
grep -n "define SPARSE_MLA_OVERLAP_TILES" csrc/sparse_mla/kernel_traits.h
time build
mkdir -p /tmp/A && rm -rf /tmp/A/* && cp -r $PKG /tmp/A/
for r in 1 2; do
  PYTHONPATH=/tmp/A timeout 150 python scratch/ab.py $OUT/a$r.json
  PYTHONPATH=/tmp/B timeout 150 python scratch/ab.py $OUT/b$r.json
done
python scratch/cmp.py $OUT/a1.json $OUT/b1.json $OUT/a2.json $OUT/b2.json
export SPARSE_MLA_SM120_OCCUPANCY=1
PYTHONPATH=/tmp/A timeout 100 python scratch/ab.py $OUT/sa1.json sm120
PYTHONPATH=/tmp/B timeout 100 python scratch/ab.py $OUT/sb1.json sm120
python scratch/cmp.py $OUT/sa1.json $OUT/sb1.json
date -u
