#!/bin/bash
# Session 35, call C: attnfuse-calibrate on the H200, its profile's cost report next to the table's h200.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
export PYTHONUNBUFFERED=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
for i in 1 2; do
  timeout 120 python3 -m attnfuse.runtime.calibrate --out $OUT/h200_profile_$i.json > $OUT/calibrate_$i.log 2>&1
  echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/calibrate_$i.log
done
{ for dev in h200 $OUT/h200_profile_1.json; do for s in 1024 4096; do
    echo "== --device $dev --seq-len $s"
    timeout 60 python3 -m attnfuse.driver examples/llama3.attn --device $dev --seq-len $s --cost-report 2>&1
  done; done; } > $OUT/cost_report.txt 2>&1
echo "done at $(( $(date +%s) - start )) s" >> $OUT/cost_report.txt
