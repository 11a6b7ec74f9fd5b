set -x
date -u
PKG=$(python -c "import site; print(site.getsitepackages()[0])")/vllm_sparse_mla_blackwell
cp -r csrc /tmp/b_csrc
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
mkdir -p /tmp/B && cp -r $PKG /tmp/B/
rm -rf csrc && cp -r scratch/a_csrc/csrc csrc
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
mkdir -p /tmp/A && cp -r $PKG /tmp/A/
rm -rf csrc && cp -r /tmp/b_csrc csrc
date -u
for i in 1 2; do
  SPARSE_MLA_SM120_OCCUPANCY=1 PYTHONPATH=/tmp/A timeout 60 python scratch/ab3.py /tmp/sa$i.json
  SPARSE_MLA_SM120_OCCUPANCY=1 PYTHONPATH=/tmp/B timeout 60 python scratch/ab3.py /tmp/sb$i.json
  PYTHONPATH=/tmp/A timeout 60 python scratch/ab3.py /tmp/a$i.json
  PYTHONPATH=/tmp/B timeout 60 python scratch/ab3.py /tmp/b$i.json
done
date -u
python scratch/cmp.py /tmp/sa1.json /tmp/sb1.json /tmp/sa2.json /tmp/sb2.json
python scratch/cmp.py /tmp/a1.json /tmp/b1.json /tmp/a2.json /tmp/b2.json
tar -cf $OUT/call6_ab.tar /tmp/sa1.json /tmp/sb1.json /tmp/sa2.json /tmp/sb2.json /tmp/a1.json /tmp/b1.json /tmp/a2.json /tmp/b2.json
# B, the working tree, is what is installed now? reinstall to be sure
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 120 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify.json 2>&1 | tail -17
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -3
timeout 90 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
timeout 200 compute-sanitizer --tool racecheck --print-limit 20 python tools/sanitizer_launches.py 2>&1 | tail -3
timeout 60 compute-sanitizer --tool synccheck --print-limit 20 python tools/sanitizer_launches.py 2>&1 | tail -3
date -u
