#!/bin/bash
# Session 35, call A: issue 11's paged probe (timings, then ncu), then issue 9's graph sweep.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
export PYTHONUNBUFFERED=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
timeout 120 python3 .gpu/paged_probe.py > $OUT/probe.log 2>&1
echo "probe done at $(( $(date +%s) - start )) s" >> $OUT/probe.log
timeout 110 ncu --clock-control none --set full --kernel-name regex:split_kv -c 12 -f -o $OUT/paged \
  python3 .gpu/paged_probe.py --ncu >> $OUT/probe.log 2>&1
ncu --import $OUT/paged.ncu-rep --page details > $OUT/ncu_details.txt 2>&1
echo "ncu done at $(( $(date +%s) - start )) s" >> $OUT/probe.log
mkdir -p $OUT/sweep
timeout $(( 545 - ($(date +%s) - start) )) python3 bench/cost_sweep.py --out $OUT/sweep --resume --graphs --rounds 3 \
  --families d64_g4,d128_g4,d128_g1,d128_g8,d256_g4,d128_g4_window1024,d128_g4_qknorm --seqs 256,384,512,768,1024,320,448 \
  --budget-s $(( 500 - ($(date +%s) - start) )) > $OUT/sweep.log 2>&1
echo "done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
