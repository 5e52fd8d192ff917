#!/bin/bash
# Session 40, call F: the tree after the wide-kernel rule: GPU tests (split-KV, paged), decode.py Sq = 1 (B = 1 / 4 / 16), B = 64 Sq = 1 / 4 / 16.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 200 python3 -m pytest -q tests/gpu/test_paged_gpu.py tests/gpu/test_split_kv_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
timeout 130 python3 bench/decode.py --out $OUT/b64 --graphs --sq 1,4,16 --no-flex --batches 64 \
  --kv 1024,8192,32768 --no-baseline-pipeline > $OUT/b64.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/b64.log
timeout $(( 540 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/sq1 --graphs --sq 1 --no-flex --batches 1,4,16 \
  --kv 1024,8192,32768,131072 --no-baseline-pipeline > $OUT/sq1.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/sq1.log
tail -3 $OUT/tests.log; grep -v '^{' $OUT/b64.log | head -14; grep -v '^{' $OUT/sq1.log | head -18
