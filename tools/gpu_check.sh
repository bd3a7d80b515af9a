#!/usr/bin/env bash
# The device check (issue 32): localspec on a GPU, measured, from the repository and one folder of
# carried files, on a bare CUDA machine with no network and ~15 minutes in all. Also runs on a CPU
# (a CPU build of the same llama.cpp, tiny shapes), which is how it is tested.
#
#   tools/gpu_check.sh pack [CUDA_BUILD_DIR]   here: fill .gpu/ (ignored by git) with what such a
#                                              machine lacks: llama-cpp-python's source without docs,
#                                              vocab files or unused backends (~6 MB), Llama-3's
#                                              tokenizer and the model writer (../shared/gpu), the
#                                              wheels localspec needs beyond a CUDA image's Python
#                                              (diskcache, platformdirs, gguf) and, if given, a CUDA
#                                              build's libraries and tools (saves the ~250 s build)
#   tools/gpu_check.sh run [OUT]               there (or here): the check; its report in OUT
#                                              ($OUT, else ./gpu-report), at most 8 files
#
# The run: llama.cpp for the local GPU (the carried build if it runs, else built from the source),
# random-weight GGUFs in Llama-3 shapes with Llama-3's real 128,256-token tokenizer (8B F16, the
# same weights in Q4_0, a 1B Q8_0; on a CPU tiny shapes), a crash check (faulthandler on; on a
# native crash cuda-gdb's backtrace), llama-bench's cost curve (a verify of N rows against one
# steady tg step), tools/gpu_bench.py (plain localspec against Llama.generate; speculation with
# the Q4_0 self-draft and the 1B draft at T = 0 and 1, chains and trees, stable shapes on and off;
# greedy identity), bench --concurrency 1,4,16, and llama.cpp's own llama-speculative-simple.
# Every step has a timeout inside an overall budget (GPU_CHECK_BUDGET seconds, default 560), so
# a slow or crashing step leaves the report of the others.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${GPU_CHECK_CARRY:-$ROOT/.gpu}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check}
PY=${PYTHON:-python3}

pack() {
  local shared=${SHARED:-$ROOT/../shared/gpu} sdist=${SDIST:-} build=${1:-}
  mkdir -p "$CARRY/wheels"
  grep -qx '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$ROOT/.git/info/exclude"
  if [ -z "$sdist" ]; then
    sdist=$(mktemp -d)/sdist
    mkdir -p "$sdist" && (cd "$sdist" && pip download -q --no-deps --no-binary=:all: "llama-cpp-python==${LLAMA_CPP_PYTHON:-0.3.36}" -d .) || return 1
  fi
  local tmp; tmp=$(mktemp -d)
  tar xzf "$sdist"/llama_cpp_python-*.tar.gz -C "$tmp" && local src=("$tmp"/llama_cpp_python-*)
  local skip=(docs models media gguf-py benches tests conversion examples/llama.android examples/llama.swiftui
              tools/server/webui tools/ui)
  for b in vulkan sycl opencl hexagon metal cann webgpu openvino et virtgpu musa zdnn zendnn; do skip+=("ggml/src/ggml-$b"); done
  (cd "$src" && tar czf "$CARRY/llama-cpp-python-src.tar.gz" $(printf -- "--exclude=vendor/llama.cpp/%s " "${skip[@]}") \
      --exclude='.git*' llama_cpp vendor pyproject.toml CMakeLists.txt LICENSE.md) || return 1
  cp "$shared/vocab-llama3.gguf.gz" "$shared/synth_gguf.py" "$CARRY/"
  (cd "$CARRY/wheels" && pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 diskcache platformdirs gguf) || return 1
  if [ -n "$build" ]; then   # a CUDA build's bin/ (libraries, llama-bench, llama-speculative-simple)
    (cd "$build" && strip --strip-unneeded ./*.so* 2>/dev/null
     tar cf - libggml*.so* libllama*.so* llama-bench llama-speculative-simple | xz -T0 -6 > "$CARRY/cuda-build.tar.xz")
  fi
  du -sh "$CARRY"/* && du -sh "$CARRY"
}

# ---- the run ------------------------------------------------------------------------------------

START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-560}
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$OUT/log.txt" >&2; }

# step NAME SECONDS CMD...: run with a timeout inside the budget; output to log.txt; rc to steps.tsv
step() {
  local name=$1 limit=$2; shift 2
  local room=$(( $(left) - 15 ))
  [ "$limit" -gt "$room" ] && limit=$room
  if [ "$limit" -lt 5 ]; then say "SKIP $name: no time left"; printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"; return 124; fi
  say "BEGIN $name (timeout ${limit}s)"
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >> "$OUT/log.txt" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$OUT/steps.tsv"
  say "END $name rc=$rc"
  return $rc
}

libs_work() {   # $1: a bin/ folder with libllama and llama-bench; loads, and sees the GPU in cuda mode
  LD_LIBRARY_PATH="$1:${CUDA_LIBS:-}" "$1/llama-bench" --list-devices > "$WORK/devices.txt" 2>&1 || return 1
  [ "$MODE" = cpu ] || grep -qi cuda "$WORK/devices.txt"
}

build_llama() {   # from the carried source: CUDA for the local GPU, or CPU
  local flags=(-DGGML_CUDA=OFF -DGGML_NATIVE=ON)
  [ "$MODE" = cuda ] && flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native -DGGML_NATIVE=ON)
  cmake -S "$SRC/vendor/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_RPC=ON \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' &&
  cmake --build "$WORK/build" -j "$(nproc)" --target llama ggml llama-bench llama-speculative-simple
}

cuda_libs() {   # folders holding libcudart.so.13 / libcublas.so.13 (the CUDA image's, or PyTorch's wheels)
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  dirs+=($("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null))
  find "${dirs[@]}" -maxdepth 5 \( -name 'libcublas.so.*' -o -name 'libcudart.so.*' \) 2>/dev/null |
    xargs -r -n1 dirname | sort -u | paste -sd:
}

run() {
  OUT=${1:-${OUT:-$ROOT/gpu-report}}
  mkdir -p "$OUT" "$WORK"
  : > "$OUT/log.txt"; : > "$OUT/steps.tsv"
  export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1 LOCALSPEC_NO_WARM_START=1 HF_HUB_OFFLINE=1
  MODE=cpu
  if nvidia-smi -L > "$WORK/gpu.txt" 2>&1; then MODE=cuda; fi
  say "mode $MODE: $(head -1 "$WORK/gpu.txt") · $("$PY" --version 2>&1) · $(nproc) cores"
  SRC=$WORK/src
  mkdir -p "$SRC" && tar xzf "$CARRY/llama-cpp-python-src.tar.gz" -C "$SRC" || { say "no carried source (run pack)"; return 1; }
  # Python: what the image lacks, and llama-cpp-python's package over the libraries built here
  local site=$WORK/site
  mkdir -p "$site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$CARRY"/wheels/*.whl >> "$OUT/log.txt" 2>&1
  CUDA_LIBS=""
  [ "$MODE" = cuda ] && CUDA_LIBS=$(cuda_libs) && say "CUDA libraries: $CUDA_LIBS"
  local bin=""
  if [ "$MODE" = cuda ] && [ -f "$CARRY/cuda-build.tar.xz" ]; then
    mkdir -p "$WORK/carried" && tar xJf "$CARRY/cuda-build.tar.xz" -C "$WORK/carried"
    if libs_work "$WORK/carried"; then bin=$WORK/carried; say "the carried CUDA build runs here"
    else say "the carried CUDA build does not run here: $(tail -3 "$WORK/devices.txt" | tr '\n' ' ')"; fi
  fi
  if [ -z "$bin" ] && [ -x "$WORK/build/bin/llama-bench" ] && libs_work "$WORK/build/bin"; then bin=$WORK/build/bin; fi
  if [ -z "$bin" ]; then
    step build 420 bash -c "$(declare -f build_llama); MODE=$MODE SRC=$SRC WORK=$WORK; build_llama" &&
      libs_work "$WORK/build/bin" && bin=$WORK/build/bin
  fi
  [ -n "$bin" ] || { say "no working llama.cpp build"; report; return 1; }
  cat "$WORK/devices.txt" >> "$OUT/log.txt"
  rm -rf "$site/llama_cpp" && cp -r "$SRC/llama_cpp" "$site/" && mkdir -p "$site/llama_cpp/lib" &&
    cp -a "$bin"/lib*.so* "$site/llama_cpp/lib/"
  export PYTHONPATH="$site:$ROOT" LD_LIBRARY_PATH="$site/llama_cpp/lib:$CUDA_LIBS"
  local ls="$PY -m localspec"

  # models: random weights of real shapes, Llama-3's tokenizer
  local m=$WORK/models big small
  mkdir -p "$m"
  [ -f "$m/vocab.gguf" ] || gunzip -c "$CARRY/vocab-llama3.gguf.gz" > "$m/vocab.gguf"
  if [ "$MODE" = cuda ]; then big=8b; small=1b; else big=tiny; small=tiny; fi
  local T=$m/$big-f16.gguf Q=$m/$big-q4_0.gguf S=$m/$small-q8_0.gguf
  write() { [ -s "$2" ] || "$PY" "$CARRY/synth_gguf.py" "$m/vocab.gguf" "$2" "$1" "$3"; }
  step models 150 bash -c "$(declare -f write); m=$m PY=$PY CARRY=$CARRY; write $big $T f16 & write $big $Q q4_0 & write $small $S q8_0 & wait; ls -la $m"

  # does localspec run, and if not, where does it crash
  step import 60 "$PY" -c "from localspec.engine import backend; print(backend.system_info()); print(backend.backend_devices())"
  step plain-cli 90 $ls generate --target "$S" --drafter none --raw --max-tokens 32 --json "Once upon a time"
  step spec-cli 120 $ls generate --target "$T" --draft "$Q" --raw --max-tokens 64 --json "Once upon a time"
  local rc=$?
  if [ "$rc" -gt 128 ]; then   # killed by a signal: where in native code
    command -v cuda-gdb > /dev/null && step gdb 90 cuda-gdb -batch -ex run -ex bt -ex 'info sharedlibrary' \
      --args "$PY" -m localspec generate --target "$T" --draft "$Q" --raw --max-tokens 16 "Once upon a time"
  fi

  # what a verify of N rows costs against one steady decode step
  local ngl=() ngld=()
  [ "$MODE" = cuda ] && ngl=(-ngl 99 -fa 1) && ngld=(-ngl 99 -ngld 99 -fa on)
  step llama-bench 150 bash -c 'LD_LIBRARY_PATH="$0:$1" "$0/llama-bench" "${@:3}" > "$2"' "$bin" "$CUDA_LIBS" \
    "$OUT/llama-bench.json" -m "$T" -m "$Q" -m "$S" "${ngl[@]}" -p 1,2,4,8,16,64 -n 128 -d 0,512 -r 2 -o json
  local tokens=128 rounds=2
  [ "$MODE" = cpu ] && tokens=48 && rounds=1
  step gpu-bench 300 "$PY" "$ROOT/tools/gpu_bench.py" --target "$T" --self-draft "$Q" --small-draft "$S" \
    --tokens $tokens --rounds $rounds --out "$OUT/gpu_bench.json"
  step concurrency 90 bash -c '"$@" > "$0"' "$OUT/concurrency.json" $ls bench --target "$T" --draft "$Q" --raw \
    --category chat --max-tokens 48 --no-warmup --concurrency 1,4,16 --json
  step speculative-simple 45 env LD_LIBRARY_PATH="$bin:$CUDA_LIBS" "$bin/llama-speculative-simple" -m "$T" -md "$Q" \
    "${ngld[@]}" --spec-type draft-simple --spec-draft-n-max 8 -n 128 --temp 0 -c 2048 \
    -p "Write a short story about a lighthouse keeper."
  report
}

report() {   # the report: report.md from the log, the steps and the JSON files
  "$PY" "$ROOT/tools/gpu_report.py" "$OUT" > "$OUT/report.md" 2>> "$OUT/log.txt"
  say "done: $OUT/report.md"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
