set -x
date -u
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
cp -r csrc /tmp/ab_csrc
build() { GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3; mkdir -p /tmp/$1 && cp -r $PKG /tmp/$1/; }
build AB
for X in base A; do rm -rf csrc && cp -r scratch/trees/$X/csrc csrc && build $X; done
rm -rf csrc && cp -r /tmp/ab_csrc csrc && python scratch/apply_stamps.py && build ST
rm -rf csrc && cp -r /tmp/ab_csrc csrc
date -u
mkdir -p $OUT/ab
for i in 1 2; do for X in base A AB; do PYTHONPATH=/tmp/$X timeout 150 python scratch/ab3.py $OUT/ab/${X}_$i.json; done; done
date -u
python scratch/cmp3.py $OUT/ab base A AB | tee $OUT/cmp.txt | tail -115
PYTHONPATH=/tmp/ST timeout 120 python scratch/stamps.py > $OUT/stamps_AB.txt 2>&1; grep -A1 '==' $OUT/stamps_AB.txt | grep -v '^--'
date -u
