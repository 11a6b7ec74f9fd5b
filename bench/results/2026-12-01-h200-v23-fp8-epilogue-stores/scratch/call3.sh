set -x
date -u
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
cp -r csrc /tmp/a_csrc
build() { GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3; mkdir -p /tmp/$1 && cp -r $PKG /tmp/$1/; }
build A
for X in Bg B16; do rm -rf csrc && cp -r scratch/trees/$X/csrc csrc && build $X; done
rm -rf csrc && cp -r /tmp/a_csrc csrc
date -u
mkdir -p $OUT/ab
for i in 1 2; do for X in A Bg B16; do PYTHONPATH=/tmp/$X timeout 150 python scratch/ab3.py $OUT/ab/${X}_$i.json 1,2,4,16,64,256; done; done
date -u
python scratch/cmp3.py $OUT/ab A Bg B16 > $OUT/cmp.txt; cat $OUT/cmp.txt | grep -v 'fp8_e4m3' | tail -80; tail -2 $OUT/cmp.txt
cd $OUT && tar czf ab.tgz ab && rm -rf ab
date -u
