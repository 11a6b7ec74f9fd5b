set -x
date -u
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 120 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify.json 2>&1 | tail -17
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -3
timeout 100 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
SPARSE_MLA_SM120_OCCUPANCY=1 timeout 100 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
timeout 60 compute-sanitizer --tool synccheck python tools/sanitizer_launches.py 2>&1 | tail -2
timeout 170 compute-sanitizer --tool racecheck python tools/sanitizer_launches.py 2>&1 | tail -2
date -u
