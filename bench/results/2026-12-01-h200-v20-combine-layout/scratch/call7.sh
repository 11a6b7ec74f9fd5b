set -x
date -u
build() { GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3; }
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
build
mkdir -p /tmp/B && rm -rf /tmp/B/* && cp -r $PKG /tmp/B/
PYTHONPATH=/tmp/B timeout 60 python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -1
mv csrc /tmp/csrc_b && cp -r scratch/a_csrc/csrc csrc
build
mkdir -p /tmp/A && rm -rf /tmp/A/* && cp -r $PKG /tmp/A/
for r in 1 2; do
  PYTHONPATH=/tmp/A timeout 60 python scratch/ab.py $OUT/a$r.json large
  PYTHONPATH=/tmp/B timeout 60 python scratch/ab.py $OUT/b$r.json large
done
python scratch/cmp.py $OUT/a1.json $OUT/b1.json $OUT/a2.json $OUT/b2.json
rm -rf csrc && mv /tmp/csrc_b csrc
date -u
