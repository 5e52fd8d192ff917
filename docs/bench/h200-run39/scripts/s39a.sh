#!/bin/bash
# Session 39, call A (prepared in session 38): the default (wide kernel + skipped loops +
# combine kernel; never run through bench/decode.py at B = 1) with the one-tile merge
# (split-kv{merge=true}) as the same-run baseline pipeline; B = 16 long caches with one
# split in the wide kernel against the default's two; per-kernel times; split-KV GPU tests.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
pipe() { python3 -c "from attnfuse.passes import DEFAULT_PIPELINE as p; print(p.replace('split-kv', 'split-kv{$1}'))"; }
timeout 200 python3 bench/decode.py --out $OUT/dflt --graphs --sq 1 --rope --no-flex --batches 1,4,16 \
  --kv 1024,8192,32768,131072 --baseline-pipeline "$(pipe merge=true)" > $OUT/dflt.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/dflt.log
timeout 90 python3 bench/decode.py --out $OUT/one --graphs --sq 1 --no-flex --batches 16 --kv 32768,131072 \
  --page-size 0 --baseline-pipeline "$(pipe splits=1)" > $OUT/one.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/one.log
timeout 60 python3 bench/decode.py --out $OUT/kern --batches 1 --kv 8192 --sq 1 --kernels --no-flex --page-size 0 \
  --no-baseline-pipeline > $OUT/kern.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/kern.log
timeout $(( 560 - ($(date +%s) - start) )) python3 -m pytest -q -x tests/gpu/test_split_kv_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
grep -v '^{' $OUT/dflt.log | head -40; grep -v '^{' $OUT/one.log | head -8; tail -3 $OUT/tests.log
