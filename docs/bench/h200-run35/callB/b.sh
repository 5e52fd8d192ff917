#!/bin/bash
# Session 35, call B: issue 11 probe 2 (one KV loop in the split kernel; paged depth), then the rest of the graph sweep.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export PYTHONUNBUFFERED=1
start=$(date +%s)
for v in base single stages3 single3; do
  ATTNFUSE_CACHE_DIR=$(mktemp -d) VARIANT=$v timeout 75 python3 .gpu/paged_probe2.py >> $OUT/probe2.log 2>&1
  echo "$v done at $(( $(date +%s) - start )) s" >> $OUT/probe2.log
done
mkdir -p $OUT/sweep
cp .gpu/sweep_a.json $OUT/sweep/cost_sweep.json
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout $(( 560 - ($(date +%s) - start) )) python3 bench/cost_sweep.py --out $OUT/sweep --resume --graphs --rounds 3 \
  --families d128_g4_window1024,d128_g4_qknorm --seqs 256,384,512,768,1024,320,448 > $OUT/sweep.log 2>&1
echo "done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
