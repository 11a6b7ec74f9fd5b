set -x
date -u
git log --oneline -1 2>/dev/null
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 100 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify_final.json 2>&1 | tail -3
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -2
SPARSE_MLA_SM120_OCCUPANCY=1 timeout 90 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
