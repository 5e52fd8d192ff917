#!/bin/bash
# Session 40, call E: the wide kernel for calls of several waves (probe 3); host time per call with issue_us.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 330 python3 .gpu/s40_wide.py > $OUT/wide.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/wide.log
timeout $(( 560 - ($(date +%s) - start) )) python3 bench/bench_overhead.py --out $OUT/overhead.json > $OUT/overhead.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/overhead.log
grep -v '^{' $OUT/wide.log | tail -13; head -12 $OUT/overhead.log
