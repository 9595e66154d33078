#!/usr/bin/env bash
# GPU check on the device machine (one H200, no network), from the repository root, carrying .whl and .gpu_assets.
# How to prepare both and what it measures: see the docstring of benchmarks/gpu_check.py. Extra arguments go to it.
# Writes $OUT/gpu_check.json (all results), $OUT/gpu_check.log, $OUT/zero2.log, $OUT/zero3.log; under 8 minutes.
set -u
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee "$OUT/gpu_check.log"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set -o pipefail
timeout 470 python3 benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
