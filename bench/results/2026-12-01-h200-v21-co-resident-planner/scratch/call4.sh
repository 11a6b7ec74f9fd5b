set -x
date -u
git apply scratch/no_combine.patch
GLM53_ARCHS=90 timeout 200 python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
timeout 300 python scratch/parts.py
date -u
