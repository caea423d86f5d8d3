#!/usr/bin/env bash
# One call on a lent GPU machine (issue 41): the GPU test tier, every chapter on CUDA, then the benchmark,
# inside about 430 s of command time. Run from the repository root, with the wheels of docs/gpu.md in .whl/:
#
#     bash tools/gpu_session.sh            # results under $OUT (the device tool's folder) or build/gpu_session
#
# Phase 1 runs the tier and the chapters side by side (both check correctness, neither is timed, and the
# machine has 16 cores); phase 2 runs the benchmark alone, so its timings see a quiet GPU. Each phase has a
# time limit (SIGINT: pytest still writes its report; the chapter runner and the benchmark write theirs as
# they go), and each result is copied to $OUT as soon as it exists, so a call stopped early keeps the parts
# it finished. Limits in seconds: TIER_S, CHAPTERS_S, BENCH_S; STOP_AT: steps of the benchmark's whole run.
set -u
OUT=${OUT:-build/gpu_session}
mkdir -p "$OUT" build benchmarks/results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "could not install the carried wheels" | tee "$OUT/test_gpu.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
began=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; } > "$OUT/facts.txt" 2>&1

(   TRANSFORMER_COURSE_DEVICE= OMP_NUM_THREADS=1 timeout -s INT "${TIER_S:-190}" python3 -m pytest tests/test_gpu.py \
        -m cuda -q -p no:cacheprovider -n 4 -o junit_family=xunit1 --junitxml build/gpu_tests.xml
    python3 tools/gpu_test_report.py build/gpu_tests.xml benchmarks/results/gpu_tests.json
    cp benchmarks/results/gpu_tests.json "$OUT/" ) > "$OUT/test_gpu.log" 2>&1 &
(   ordered=(chapters/06_*.ipynb chapters/07_*.ipynb chapters/10_*.ipynb chapters/08_*.ipynb chapters/09_*.ipynb
             chapters/05_*.ipynb chapters/04_*.ipynb chapters/03_*.ipynb chapters/02_*.ipynb chapters/01_*.ipynb
             chapters/00_*.ipynb chapters/90_*.ipynb)
    OMP_NUM_THREADS=2 timeout -s INT "${CHAPTERS_S:-190}" python3 tools/run_chapters_on_device.py --jobs 4 "${ordered[@]}"
    cp benchmarks/results/gpu_chapters.json "$OUT/" ) > "$OUT/chapters.log" 2>&1 &
wait
echo "phase 1 (tier and chapters) ended after $(( $(date +%s) - began )) s" | tee -a "$OUT/facts.txt"

timeout -s INT "${BENCH_S:-220}" python3 benchmarks/bench_gpu.py --stop-at "${STOP_AT:-1500}" > "$OUT/bench.log" 2>&1
cp benchmarks/results/gpu.md benchmarks/results/gpu.json "$OUT/" 2>/dev/null
echo "phase 2 (benchmark) ended after $(( $(date +%s) - began )) s" | tee -a "$OUT/facts.txt"
tail -n 3 "$OUT/test_gpu.log" "$OUT/chapters.log"; grep -E "TFLOP|decode" "$OUT/bench.log" | tail -n 6
