#!/bin/bash
# Session 33, call D: warps per program of the split kernels; issue 9's second-batch-size sweep.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
start=$(date +%s)
run() { name=$1; shift; ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 60 python3 .gpu/s33_warps.py --name $name --out $OUT/warps.jsonl "$@" >> $OUT/warps.log 2>&1; echo "$name at $(( $(date +%s) - start )) s" >> $OUT/warps.log; }
run base --sdpa --batches 1,16,64 --kv 1024,8192,32768
run w2s --small-warps 2 --batches 1,16 --kv 1024,8192,32768
run w8s --small-warps 8 --batches 1,16 --kv 1024,8192,32768
run w8f --full-warps 8 --batches 64 --kv 1024,8192
left=$(( 320 - ($(date +%s) - start) ))
mkdir -p $OUT/sweep
ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout $left python3 bench/cost_sweep.py --out $OUT/sweep --families d128_g1 --seqs 320,1024,256,512,384,768 --tokens 32768 --rounds 3 --budget-s $(( left - 45 )) > $OUT/sweep.log 2>&1
echo "all done at $(( $(date +%s) - start )) s" >> $OUT/warps.log
