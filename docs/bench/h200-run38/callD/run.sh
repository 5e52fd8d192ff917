#!/bin/bash
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 150 python3 .gpu/s38_exp2.py > $OUT/exp2.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/exp2.log
timeout 120 python3 -m pytest -q -x tests/gpu/test_split_kv_gpu.py > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
timeout $(( 540 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/dec --graphs --sq 1 --batches 1,16 --kv 1024,8192,32768 \
  --no-flex --no-baseline-pipeline --page-size 0 --kernels > $OUT/dec.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/dec.log
grep -v '^{' $OUT/dec.log | tail -25; tail -3 $OUT/tests.log; cat $OUT/exp2.log | cut -c1-1500
