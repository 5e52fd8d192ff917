#!/bin/bash
# Session 34, call B: the rest of the Triton-only sweep (every Gluon family, every S), seeded with call A's file.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
mkdir -p $OUT/sweep && cp docs/bench/h200-run34/callA/cost_sweep.json $OUT/sweep/
timeout 540 python3 bench/cost_sweep.py --out $OUT/sweep --resume --triton-only \
  --families d128_g4,d128_g1,d64_g4,d128_g8,d128_g4_qknorm,d128_g4_window1024 \
  --seqs 256,1024,4096,16384,512,2048,8192,320,384,448,768,32768,65536 --rounds 3 --budget-s 470 > $OUT/sweep.log 2>&1
echo "rc $? done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
