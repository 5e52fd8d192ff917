#!/bin/bash
# Session 39, call B: merge on by default (one-tile merge, i32 offsets), wide kernel
# keeps one wave (no two-per-SM splits), wide kernel on paged caches; A/B paged
# waves=1 min-blocks=1 as the baseline pipeline; Sq 4/16 and B = 64 rows.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 170 python3 -m pytest -q -x tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
pipe() { python3 -c "from attnfuse.passes import DEFAULT_PIPELINE as p; print(p.replace('split-kv', 'split-kv{$1}'))"; }
timeout 220 python3 bench/decode.py --out $OUT/sq1 --graphs --sq 1 --rope --no-flex --batches 1,4,16 \
  --kv 1024,8192,32768,131072 --baseline-pipeline "$(pipe 'waves=1 min-blocks=1')" > $OUT/sq1.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/sq1.log
timeout $(( 575 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/b64 --graphs --sq 1,4,16 --no-flex --batches 64 \
  --kv 1024,8192,32768 --no-baseline-pipeline > $OUT/b64.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/b64.log
tail -3 $OUT/tests.log; grep -v '^{' $OUT/sq1.log | head -40; grep -v '^{' $OUT/b64.log | head -16
