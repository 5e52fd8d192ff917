#!/bin/bash
# Session 34, call C: the Gluon families at S >= 16384 re-timed with at least 10 calls per timing
# (run 30's do_bench timed each call of 60-240 ms once per round).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
mkdir -p $OUT/sweep
timeout 540 python3 bench/cost_sweep.py --out $OUT/sweep --min-calls 10 \
  --families d128_g4,d128_g1,d128_g8,d64_g4,d128_g4_qknorm,d128_g4_window1024 \
  --seqs 65536,32768,16384 --rounds 3 --budget-s 460 > $OUT/sweep.log 2>&1
echo "rc $? done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
