#!/usr/bin/env bash
# The checks a kernel change needs before it lands, in one call of the device machine: build the
# package for the GPU's target against the machine's own torch, then verify's full case matrix,
# the GPU tests, memcheck over `verify --quick` and racecheck over tools/sanitizer_launches.py.
#
#   tools/device_checks.sh OUT [STEP ...]
#
# STEPs, in the order given (default: build verify pytest memcheck racecheck). Each writes
# OUT/STEP.txt (verify also OUT/verify.json); OUT/summary.txt gets one line per step: its exit
# code, seconds and last line. A failed step does not stop the later ones, but a failed build
# skips them (they would test whatever else is installed). Environment: CHECK_ARCHS (default 90:
# the H200), CHECK_LIB (default /tmp/device_checks/lib: where build installs the package and
# every other step imports it from, ahead of PYTHONPATH; a later call on the same machine may
# leave out build), PYTEST_ARGS (default: the gpu-marked tests of tests/test_kernel_gpu.py,
# tests/test_cache_writer.py and tests/test_ceilings_gpu.py; split at whitespace, so no quoted
# arguments). Exits 0 when every step passed, 1 when one failed or was skipped, 2 on bad
# arguments (before anything runs).
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
out=$(realpath -m "$1"); shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build verify pytest memcheck racecheck)
for step in "${steps[@]}"; do
  case "$step" in
    build | verify | pytest | memcheck | racecheck) ;;
    *) echo "device_checks: unknown step '$step' (build, verify, pytest, memcheck, racecheck)" >&2; exit 2 ;;
  esac
done
lib=$(realpath -m "${CHECK_LIB:-/tmp/device_checks/lib}")
cd "$(dirname "$0")/.."
export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
read -r -a pytest_args <<< "${PYTEST_ARGS:--m gpu tests/test_kernel_gpu.py tests/test_cache_writer.py tests/test_ceilings_gpu.py}"
mkdir -p "$out"
: > "$out/summary.txt"

run_step() {
  case "$1" in
    build)
      rm -rf "$lib"
      GLM53_ARCHS=${CHECK_ARCHS:-90} python3 -m pip install --no-build-isolation --no-deps --target "$lib" . ;;
    verify) python3 -m vllm_sparse_mla_blackwell verify --json "$out/verify.json" ;;
    pytest) python3 -m pytest -q -p no:cacheprovider "${pytest_args[@]}" ;;
    memcheck) compute-sanitizer --tool memcheck python3 -m vllm_sparse_mla_blackwell verify --quick ;;
    racecheck) compute-sanitizer --tool racecheck python3 tools/sanitizer_launches.py ;;
  esac
}
# A sanitizer step passes with the program's exit code 0 and the tool's summary of none found.
declare -A clean=([memcheck]="ERROR SUMMARY: 0 errors"
                  [racecheck]="RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")

failed=0
built=1
for step in "${steps[@]}"; do
  if [ "$built" -eq 0 ]; then
    echo "$step: skipped: the build failed" | tee -a "$out/summary.txt"
    continue
  fi
  start=$SECONDS
  run_step "$step" > "$out/$step.txt" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && [ -n "${clean[$step]:-}" ] && ! grep -qF "${clean[$step]}" "$out/$step.txt"; then
    rc=1
  fi
  [ "$rc" -eq 0 ] || failed=1
  [ "$step" != build ] || [ "$rc" -eq 0 ] || built=0
  line="$step: rc $rc in $((SECONDS - start)) s: $(grep -v '^[[:space:]]*$' "$out/$step.txt" | tail -1)"
  echo "$line" | tee -a "$out/summary.txt"
done
exit "$failed"
