#!/bin/bash
# Session 39, call C: GPU tests (merge default, wide paged kernel, paged waves 1); the
# paged-variant probe; decode.py Sq = 1 with the paged default of waves 1.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 200 python3 -m pytest -q tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
timeout 150 python3 .gpu/s39_paged.py > $OUT/probe.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/probe.log
timeout $(( 570 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/sq1 --graphs --sq 1 --no-flex --batches 1,4,16 \
  --kv 1024,8192,32768,131072 --no-baseline-pipeline > $OUT/sq1.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/sq1.log
tail -4 $OUT/tests.log; grep -v '^{' $OUT/probe.log | tail -14; grep -v '^{' $OUT/sq1.log | head -20
