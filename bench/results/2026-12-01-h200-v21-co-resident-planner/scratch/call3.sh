set -x
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv
git status --short | head
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 120 python -m vllm_sparse_mla_blackwell verify --json $OUT/verify.json 2>&1 | tail -17
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -3
timeout 90 compute-sanitizer --tool memcheck python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -2
date -u
timeout 330 python -m vllm_sparse_mla_blackwell bench --no-naive --json $OUT/bench.json --png $OUT/bench_roofline.png > $OUT/bench.txt 2>&1; echo "bench rc $?"
tail -5 $OUT/bench.txt
date -u
