# The GPU checks, as one script for a device machine (it runs from the repository root there).
# Its image has torch, attrs, pyarrow, numpy, networkx, rich and typer; carry the rest as wheels in .whl/
# (git-ignored), made here with:
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
#   python -m pip download $P simpy tomli-w dp-accounting==0.6.0 "dm-tree~=0.1.8"
# then run `bash benchmarks/gpu_check.sh 2>&1 | tee $OUT/log` there, carrying .whl (BIG=seconds for the 10^6 run).
# It checks both engines write the same bytes on CUDA for four shipped scenarios, then times bench_scale at
# 10,000 agents (with the plain-array limit) and at 10^6 agents x 100 rounds, trace written.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)"
python3 -c "import torch,attrs,pyarrow,numpy;print('torch',torch.__version__,torch.cuda.is_available(),'attrs',attrs.__version__,'pyarrow',pyarrow.__version__,'numpy',numpy.__version__)"
O=/tmp/o; mkdir -p $O
echo "== identity on CUDA: events vs windowed (trace.arrows, metrics.csv sha256)"
for s in quickstart compare_sync_async privacy_utility dpsgd_bursty; do
  for e in events windowed; do
    t0=$(date +%s.%N)
    timeout 150 python3 -m netsim run scenarios/$s.toml -q --set run.device=cuda --set run.until=30 --engine $e --out $O/$s.$e > $O/$s.$e.log 2>&1
    rc=$?; t1=$(date +%s.%N)
    echo "$s $e rc=$rc wall=$(python3 -c "print(round($t1-$t0,1))")"; [ $rc -ne 0 ] && tail -5 $O/$s.$e.log
  done
  for f in trace.arrows metrics.csv; do a=$(sha256sum < $O/$s.events/$f 2>/dev/null | cut -c1-16); b=$(sha256sum < $O/$s.windowed/$f 2>/dev/null | cut -c1-16); echo "  $s $f events=$a windowed=$b $([ "$a" = "$b" ] && echo SAME || echo DIFFER)"; done
  grep -h '"engine"\|engine_reason' $O/$s.windowed/summary.json 2>/dev/null | head -2
done
[ -s $O/quickstart.windowed/trace.arrows ] || { echo "windowed quickstart failed on CUDA: stop"; exit 3; }
echo "== bench_scale 10k x 100 on CUDA, windowed and the limit"
timeout 150 python3 benchmarks/bench_scale.py --engine windowed --agents 10000 --rounds 100 --device cuda --limit --split
echo "== bench_scale 10^6 x 100 on CUDA, windowed, trace written"
timeout ${BIG:-400} python3 benchmarks/bench_scale.py --engine windowed --agents 1000000 --rounds 100 --device cuda --split
echo "rc=$?"
