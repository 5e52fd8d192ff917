#!/bin/bash
# Session 34, call E: re-time, 5 rounds, every (family, S <= 8192) pair of run 30 whose three rounds
# spread by more than 5% for some placement (the pairs above 8192 are in call D).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
mkdir -p $OUT/sweep
go() { timeout $(( 340 - ($(date +%s) - start) )) python3 bench/cost_sweep.py --out $OUT/sweep --resume --min-calls 10 --rounds 5 \
  --families $1 --seqs $2 --budget-s $(( 300 - ($(date +%s) - start) )) >> $OUT/sweep.log 2>&1; }
go d64_g4 256,384
go d128_g4 256,2048
go d128_g8 256,2048
go d128_g1 2048,4096
go d128_g4_window1024 768,2048,4096
go d128_g4_qknorm 768,1024,2048,4096,8192
echo "done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
