#!/bin/bash
# Session 34, call D: call C's last family (window 1024), seeded with call C's file.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
mkdir -p $OUT/sweep && cp docs/bench/h200-run34/callC/cost_sweep.json $OUT/sweep/
timeout 300 python3 bench/cost_sweep.py --out $OUT/sweep --resume --min-calls 10 \
  --families d128_g4_window1024 --seqs 65536,32768,16384 --rounds 3 --budget-s 250 > $OUT/sweep.log 2>&1
echo "rc $? done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
