set -x
date -u
GLM53_ARCHS=90 timeout 100 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -3
SPARSE_MLA_SM120_OCCUPANCY=1 timeout 70 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
timeout 70 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify.json 2>&1 | tail -1
date -u
