set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
git apply scratch/stamps.patch 2>/dev/null || echo "patch already applied"
GLM53_ARCHS=90 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 300 python scratch/stamps.py
date -u
