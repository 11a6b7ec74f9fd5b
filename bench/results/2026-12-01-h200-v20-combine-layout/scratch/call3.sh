set -x
date -u
GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 60 python -m vllm_sparse_mla_blackwell verify --quick 2>&1 | tail -1
timeout 400 python scratch/t1_parts.py
date -u
