set -x
date -u
GLM53_ARCHS=90 timeout 300 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 300 python scratch/sweep.py
date -u
