#!/bin/bash
# Session 39, call D: per-call host time with the new defaults (merge on: restored
# counters; paged waves 1), then issue 7's example rows with flex compiled per shape.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 200 python3 bench/bench_overhead.py --out $OUT/overhead.json > $OUT/overhead.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/overhead.log
timeout $(( 540 - ($(date +%s) - start) )) python3 bench/run_all.py --out $OUT/examples --sections examples > $OUT/examples.log 2>&1
echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/examples.log
tail -30 $OUT/overhead.log; tail -30 $OUT/examples.log
