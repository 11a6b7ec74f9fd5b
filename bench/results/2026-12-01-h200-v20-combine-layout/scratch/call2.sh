set -x
date -u
build() { GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3; }
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
time build
mkdir -p /tmp/B && rm -rf /tmp/B/* && cp -r $PKG /tmp/B/
PYTHONPATH=/tmp/B timeout 100 python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
sed -i 's/#define SPARSE_MLA_OVERLAP_TILES 1/#define SPARSE_MLA_OVERLAP_TILES 0/' csrc/sparse_mla/kernel_traits.h
time build
mkdir -p /tmp/A && rm -rf /tmp/A/* && cp -r $PKG /tmp/A/
for r in 1 2; do
  PYTHONPATH=/tmp/A timeout 150 python scratch/ab.py $OUT/a$r.json h16
  PYTHONPATH=/tmp/B timeout 150 python scratch/ab.py $OUT/b$r.json h16
done
python scratch/cmp.py $OUT/a1.json $OUT/b1.json $OUT/a2.json $OUT/b2.json
date -u
