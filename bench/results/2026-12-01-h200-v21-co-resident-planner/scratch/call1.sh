set -x
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py 2>&1 | tail -4
date -u
{ git apply scratch/hooks3.patch || patch -p1 < scratch/hooks3.patch; } && GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 420 python scratch/sweep3.py $OUT/call1_sweep.json
date -u
