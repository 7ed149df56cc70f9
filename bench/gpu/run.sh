#!/usr/bin/env bash
# kinetic beside llama-server on an NVIDIA GPU with no network, in one command from the repository's root:
#
#   bash bench/gpu/run.sh          # results under $OUT (default /tmp/gpu-out)
#
# It needs .gpu-bundle/ beside the code (bench/gpu/make_bundle.sh lays it out where pip works). It builds the
# llama.cpp vendored in llama-cpp-python's sdist ONCE, with CUDA: llama-server, and the shared libraries that
# the llama_cpp package then loads (its lib/ points at the build), so both servers run the very same library
# files. Meanwhile it writes the bench model. Each server then starts alone once with its log kept
# (preflight.py), and bench/bench_streams.py runs the streams, classroom and (time allowing) class-size
# tables with both servers, taking turns. report.py writes results.json and results.md: the tables, each
# server's fraction of the GPU's memory-bandwidth bound, and the GPU's utilization in each phase.
#
# At most 8 files come back from such a machine, so $OUT holds only: log.txt (everything printed),
# results.json, results.md, gpu.csv (nvidia-smi's samples), preflight-kinetic.log, preflight-llama-server.log,
# and build.log when the build failed.
#
# BUDGET_S bounds the whole run (the device call's limit is 600 s; the CUDA build takes about 6 minutes on
# 16 cores): a phase that no longer fits is skipped, never cut short, and the report is always written.
# DRY=1 stops after the machine and CUDA checks. CPU=1 runs the same phases on this machine's CPU with the
# current Python environment and no build (llama-server from LLAMA_SERVER, PATH or /tmp/lsbuild, else
# kinetic alone): a check of the bench and the report on a tiny model.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
if [ -z "${GPU_RUN_INNER:-}" ]; then  # the body runs under tee, so that the log survives a failure or a kill
  export GPU_RUN_INNER=1
  set +e
  bash "${BASH_SOURCE[0]}" "$@" 2>&1 | tee "$OUT/log.txt"
  rc=${PIPESTATUS[0]}
  echo "run.sh: exit $rc" | tee -a "$OUT/log.txt"
  exit "$rc"
fi
cd "$ROOT"

# ---- settings (environment)
CPU=${CPU:-}
BUDGET_S=${BUDGET_S:-$([ -n "$CPU" ] && echo 3600 || echo 540)}  # s; on the CPU the model lock may make it wait
JOBS=${JOBS:-$(nproc)}
if [ -n "$CPU" ]; then              # small and quick: the tests' tiny hybrid model, nothing offloaded
  THREADS=${THREADS:-2}; NGL=${NGL:-0}; MODEL=${MODEL:-tiny:lfm2}; STREAMS=${STREAMS:-1,4}; NP_STREAMS=${NP_STREAMS:-4}
  CTX_STREAMS=${CTX_STREAMS:-2048}; TOKENS_STREAMS=${TOKENS_STREAMS:-32}; ROUNDS=${ROUNDS:-1}
  NP_CLASS=${NP_CLASS:-4}; CTX_CLASS=${CTX_CLASS:-8192}; STUDENTS=${STUDENTS:-4}; HISTORY=${HISTORY:-0}
  CLASS_SIZES=${CLASS_SIZES:-2}; CLASS_SIZE_DURATION=${CLASS_SIZE_DURATION:-5}
else
  THREADS=${THREADS:-4}             # -t for both servers
  NGL=${NGL:-99}
  MODEL=${MODEL:-bench:qwen35}      # bench/bench_model.py: Qwen3.5-0.8B's shape, random Q8_0 weights
  STREAMS=${STREAMS:-1,4,16,32}
  NP_STREAMS=${NP_STREAMS:-32}      # a slot a stream: 32 streams decode at once
  CTX_STREAMS=${CTX_STREAMS:-16384} # 512 a slot: the 9-token prompt and TOKENS_STREAMS
  TOKENS_STREAMS=${TOKENS_STREAMS:-256}
  ROUNDS=${ROUNDS:-2}
  NP_CLASS=${NP_CLASS:-16}
  CTX_CLASS=${CTX_CLASS:-32768}     # 2048 a slot: the lab's ~400-token request fits
  STUDENTS=${STUDENTS:-16}
  HISTORY=${HISTORY:-600}         # questions each server answers before the classroom replay: a class hour's cache
  CLASS_SIZES=${CLASS_SIZES:-16,32,64}
  CLASS_SIZE_DURATION=${CLASS_SIZE_DURATION:-15}
fi
# a preflight's bound, the wait for the model lock included (bench/load.py: one model at a time on a machine)
PREFLIGHT_S=${PREFLIGHT_S:-$([ -n "$CPU" ] && echo 1200 || echo 120)}
CLASS_SIZE_MIN_S=${CLASS_SIZE_MIN_S:-150}  # class-size runs only with this much time left (after classroom)
HIDE_UVLOOP=${HIDE_UVLOOP:-0}       # 1: uvicorn on asyncio (kinetic[serve] installs uvloop: 0 runs as it does)
LCP_VERSION=0.3.36
LCP_COMMIT=0c1e570                  # vendor/llama.cpp's commit in that sdist (its .git is stripped)

BUNDLE=${BUNDLE:-$ROOT/.gpu-bundle}
WORK=${WORK:-/tmp/kinetic-gpu}      # the build, the installed wheels, the bench's JSON: outside the repository
SRC=$WORK/llama_cpp_python-$LCP_VERSION
BUILD=$WORK/build
SITE=$WORK/site
LCPSITE=$WORK/llama-cpp-site
SHIM=$WORK/cuda-shim
export KINETIC_BENCH_MODELS=${KINETIC_BENCH_MODELS:-$WORK/bench-models}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PYTHON:-python3}
mkdir -p "$WORK"
: > "$WORK/phases.tsv"

T0=$SECONDS
phase() { echo; echo "=== $(date -u +%H:%M:%S) +$((SECONDS - T0))s: $*"; }
left() { echo $((BUDGET_S - (SECONDS - T0))); }
fatal() { echo "FATAL: $*"; exit 1; }
now() { date +%s.%N; }
timed() {  # NAME COMMAND...: runs it, and notes its start and end for the GPU utilization summary
  local name=$1 start rc=0
  shift
  start=$(now)
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$start" "$(now)" >> "$WORK/phases.tsv"
  return "$rc"
}
BG=()  # background helpers (heartbeat, nvidia-smi) are ended on any exit, so that tee sees the log's end
trap 'for p in ${BG[@]+"${BG[@]}"}; do kill "$p" 2>/dev/null || true; done' EXIT

# ---- 0. the machine
phase "machine"
if [ -z "$CPU" ]; then
  nvidia-smi || [ -n "${DRY:-}" ] || fatal "nvidia-smi failed"
fi
echo "cores: $(nproc)"; free -g | head -2
command -v "$PY"; "$PY" --version
[ -n "$CPU" ] || [ -d "$BUNDLE/whl" ] || fatal "no $BUNDLE: run bench/gpu/make_bundle.sh where pip works, and carry it"
COMMIT=$(paste -sd' ' "$BUNDLE/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
echo "commit: $COMMIT"

if [ -z "$CPU" ]; then
  # ---- 1. CUDA: nvcc, its toolkit, and the libraries ggml-cuda links. cuBLAS may live only in a Python
  # environment's nvidia/ packages (torch's): CMake then gets it through symlinks in $SHIM, the servers
  # through LD_LIBRARY_PATH.
  phase "CUDA toolkit"
  cmake --version | head -1; echo "ninja $(ninja --version)"; g++ --version | head -1
  NV_DIRS=$("$PY" -c '
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
for p in nvidia.__path__:
    for d in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, d)):
            print(os.path.join(p, d))
' 2>/dev/null || true)
  NV_DIRS="$NV_DIRS ${NV_EXTRA:-}"
  NVCC=$(command -v nvcc || true)
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-1[0-9]*/bin/nvcc $(for d in $NV_DIRS; do echo "$d/bin/nvcc"; done); do
    if [ -z "$NVCC" ] && [ -x "$c" ]; then NVCC=$c; fi
  done
  [ -n "$NVCC" ] || fatal "no nvcc on PATH, in /usr/local/cuda*/bin or in the Python nvidia packages"
  REAL=$("$NVCC" --dryrun -c -x cu /dev/null -o "$WORK/nvcc-probe.o" 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1 || true)
  if [ -n "$REAL" ] && [ -x "$REAL/nvcc" ]; then NVCC=$REAL/nvcc; fi  # past a wrapper script
  CUDA_ROOT=$(cd "$(dirname "$NVCC")/.." && pwd)
  echo "nvcc: $NVCC (toolkit $CUDA_ROOT)"; "$NVCC" --version | tail -2
  # the card's compute capability (9.0 on an H100 or H200) picks the one architecture to compile for
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
  [[ "$CAP" =~ ^[0-9]+$ ]] || CAP=""  # an old driver answers with an error text
  CUDA_ARCH=${CUDA_ARCH:-${CAP:-90}}
  echo "CUDA architecture: $CUDA_ARCH"
  TK_LIBDIRS="$CUDA_ROOT/lib64 $CUDA_ROOT/lib $CUDA_ROOT/targets/x86_64-linux/lib"
  NV_LIBDIRS=$(for d in $NV_DIRS; do echo "$d/lib $d/lib64"; done)
  find_lib() {  # NAME DIR...: libNAME.so, else libNAME.so.N, in the first folder that holds one
    local n=$1 d f
    shift
    for d in "$@"; do
      for f in "$d/lib$n.so" "$d/lib$n.so".[0-9]*; do
        if [ -e "$f" ]; then echo "$f"; return 0; fi
      done
    done
    return 1
  }
  rm -rf "$SHIM" && mkdir -p "$SHIM"
  CUDA_ARGS=()
  RUNTIME_DIRS=""
  for n in cudart cublas cublasLt; do
    # shellcheck disable=SC2086  # the folder lists split on spaces
    if ! f=$(find_lib "$n" $TK_LIBDIRS $NV_LIBDIRS); then
      [ -n "${DRY:-}" ] || fatal "no lib$n.so* in $CUDA_ROOT nor in the Python nvidia packages"
      echo "lib$n: NOT FOUND"; continue
    fi
    dir=$(dirname "$f")
    if [ "$f" = "$dir/lib$n.so" ] && [[ " $TK_LIBDIRS " == *" $dir "* ]]; then
      echo "lib$n: $f (toolkit)"; continue
    fi
    ln -sf "$dir"/lib$n.so* "$SHIM/"
    [ -e "$SHIM/lib$n.so" ] || ln -s "$f" "$SHIM/lib$n.so"
    CUDA_ARGS+=("-DCUDA_${n}_LIBRARY=$SHIM/lib$n.so")
    [[ ":$RUNTIME_DIRS:" == *":$dir:"* ]] || RUNTIME_DIRS="$RUNTIME_DIRS:$dir"
    echo "lib$n: $f (through $SHIM/lib$n.so)"
  done
  INC=""
  for d in "$CUDA_ROOT/include" "$CUDA_ROOT/targets/x86_64-linux/include" $(for d in $NV_DIRS; do echo "$d/include"; done); do
    if [ -z "$INC" ] && [ -e "$d/cublas_v2.h" ]; then INC=$d; fi
  done
  [ -n "$INC" ] || [ -n "${DRY:-}" ] || fatal "no cublas_v2.h"
  echo "cublas_v2.h: ${INC:-NOT FOUND}"
  case "$INC" in
    ""|"$CUDA_ROOT/include"|"$CUDA_ROOT/targets/x86_64-linux/include") ;;
    *) mkdir -p "$SHIM/include" && ln -sf "$INC"/cublas*.h "$SHIM/include/"  # cuBLAS's headers alone, not the
       CUDA_ARGS+=("-DCMAKE_CUDA_FLAGS=-I$SHIM/include" "-DCMAKE_CXX_FLAGS=-I$SHIM/include") ;;  # others there
  esac
  # ggml-cuda links the driver for its virtual memory pool: the toolkit's stub, else the driver itself
  DRIVER=""
  for f in "$CUDA_ROOT/lib64/stubs/libcuda.so" "$CUDA_ROOT/targets/x86_64-linux/lib/stubs/libcuda.so" \
           "$CUDA_ROOT/lib/stubs/libcuda.so"; do
    if [ -z "$DRIVER" ] && [ -e "$f" ]; then DRIVER=$f; fi
  done
  if [ -n "$DRIVER" ]; then
    echo "libcuda to link: $DRIVER (toolkit stub)"
  else
    for f in $(ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 .*=> //p') \
             $(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | sed -n 's|.\+|&/libcuda.so.1|p') \
             /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
      if [ -z "$DRIVER" ] && [ -e "$f" ]; then DRIVER=$f; fi
    done
    if [ -n "$DRIVER" ]; then
      ln -sf "$DRIVER" "$SHIM/libcuda.so"
      CUDA_ARGS+=("-DCUDA_cuda_driver_LIBRARY=$SHIM/libcuda.so")
      echo "libcuda to link: $DRIVER (through $SHIM/libcuda.so)"
    else
      CUDA_ARGS+=(-DGGML_CUDA_NO_VMM=ON)
      echo "libcuda: none to link against: GGML_CUDA_NO_VMM=ON (ggml's legacy memory pool)"
    fi
  fi
  if [ -n "$RUNTIME_DIRS" ]; then
    export LD_LIBRARY_PATH="${RUNTIME_DIRS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  fi
  CMAKE_ARGS=(-S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" "-DCMAKE_CUDA_COMPILER=$NVCC" "-DCUDAToolkit_ROOT=$CUDA_ROOT"
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_NUMBER=1 "-DLLAMA_BUILD_COMMIT=$LCP_COMMIT"
    ${CUDA_ARGS[@]+"${CUDA_ARGS[@]}"})
  echo "cmake ${CMAKE_ARGS[*]}"
fi
if [ -n "${DRY:-}" ]; then echo "DRY: stopping before anything is installed or built"; exit 0; fi

# ---- 2. Python: the carried wheels and the repository's code on PYTHONPATH (uvloop hidden with HIDE_UVLOOP=1)
phase "python packages"
PP=$ROOT
if [ -z "$CPU" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$BUNDLE"/whl/*.whl || fatal "pip install of the carried wheels failed"
  PP="$LCPSITE:$SITE:$PP"
fi
if [ "$HIDE_UVLOOP" = 1 ]; then
  mkdir -p "$WORK/no-uvloop/uvloop"
  echo 'raise ImportError("uvloop hidden by bench/gpu/run.sh (HIDE_UVLOOP=1)")' \
    > "$WORK/no-uvloop/uvloop/__init__.py"
  PP="$WORK/no-uvloop:$PP"
fi
export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
echo "PYTHONPATH=$PYTHONPATH"
"$PY" - <<'EOF' || fatal "an import that the servers or the bench need failed"
import importlib

for name in ["fastapi", "starlette", "pydantic", "pydantic_core", "pydantic_settings", "uvicorn", "click", "httptools",
             "anyio", "httpx", "httpx_sse", "jinja2", "numpy", "gguf", "yaml", "filelock", "platformdirs", "diskcache",
             "typing_extensions", "kinetic.cli", "kinetic.server.launch"]:
    module = importlib.import_module(name)
    print(f"  {name} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
import uvicorn.loops.auto as auto

print("  uvicorn's event loop:", auto.auto_loop_factory())
EOF

# ---- 3. the bench model, written in the background while llama.cpp builds
phase "the model $MODEL (in the background)"
case "$MODEL" in
  bench:*) WRITE=("$PY" bench/bench_model.py "${MODEL#bench:}")
           if [ -z "$CPU" ]; then WRITE+=(--tokenizer "$BUNDLE/gemma-vocab.gguf"); fi ;;
  *) WRITE=(true) ;;  # tiny:* and paths: resolved below (the tests' tiny models are written in seconds)
esac
(cd "$ROOT" && "${WRITE[@]}") > "$WORK/model.log" 2>&1 &
MODEL_PID=$!

if [ -z "$CPU" ]; then
  # ---- 4. llama.cpp, built once with CUDA: llama-server and the shared libraries
  if [ -x "$BUILD/bin/llama-server" ] && [ -e "$BUILD/bin/libllama.so" ] && [ -e "$BUILD/bin/libmtmd.so" ] \
     && [ -d "$SRC/llama_cpp" ] && [ "${REBUILD:-0}" = 0 ]; then
    phase "llama.cpp: the build in $BUILD is reused (a machine still warm from an earlier call; REBUILD=1 redoes it)"
  else
    phase "unpack and configure llama.cpp"
    rm -rf "$SRC" "$BUILD"
    tar xzf "$BUNDLE/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$WORK"
    if ! cmake "${CMAKE_ARGS[@]}" > "$WORK/build.log" 2>&1; then
      grep -n -i -E "error|not found" "$WORK/build.log" | head -20; tail -30 "$WORK/build.log"
      echo "configure failed; once more with -DGGML_CUDA_NO_VMM=ON (no link to libcuda)"
      rm -rf "$BUILD"
      cmake "${CMAKE_ARGS[@]}" -DGGML_CUDA_NO_VMM=ON > "$WORK/build.log" 2>&1 \
        || { cp "$WORK/build.log" "$OUT/"; tail -40 "$WORK/build.log"; fatal "cmake configure failed"; }
    fi
    grep -E "CUDA|Including .* backend|GGML_NATIVE|x86 detected" "$WORK/build.log" | head -20 || true
    phase "build llama-server and libllama/libggml*/libmtmd (-j$JOBS)"
    ( while sleep 30 >/dev/null 2>&1; do
        echo "  build at $(grep -o '^\[[0-9]*/[0-9]*\]' "$WORK/build.log" | tail -1) $(date -u +%H:%M:%S)"
      done ) &
    BG+=($!)
    if ! timed build cmake --build "$BUILD" --target llama-server mtmd -j "$JOBS" >> "$WORK/build.log" 2>&1; then
      cp "$WORK/build.log" "$OUT/"; grep -n -E "error|FAILED" "$WORK/build.log" | head -30
      fatal "build failed (\$OUT/build.log)"
    fi
    kill "${BG[-1]}" 2>/dev/null || true
  fi
  ls -la "$BUILD/bin"
  ldd "$BUILD/bin/libggml-cuda.so" | grep -E "ggml|cuda|cublas|not found" || true
  "$BUILD/bin/llama-server" --version 2>&1 | tail -3 || true
  LLAMA_SERVER=$BUILD/bin/llama-server

  # ---- 5. the llama_cpp package over those very libraries (no second compile)
  phase "the llama_cpp package -> $BUILD/bin"
  rm -rf "$LCPSITE" && mkdir -p "$LCPSITE"
  cp -r "$SRC/llama_cpp" "$LCPSITE/"
  rm -rf "$LCPSITE/llama_cpp/lib"
  ln -s "$BUILD/bin" "$LCPSITE/llama_cpp/lib"
  "$PY" - <<'EOF' || fatal "llama_cpp or kinetic's server does not import over the build"
import llama_cpp
import llama_cpp.mtmd_cpp  # noqa: F401  (kinetic loads it for projectors)

print("  llama_cpp", llama_cpp.__version__, llama_cpp.__file__)
print("  supports GPU offload:", llama_cpp.llama_supports_gpu_offload())
print("  system info:", llama_cpp.llama_print_system_info().decode()[:400])
import kinetic.server.app  # noqa: E402,F401  (imports llama_cpp: checked only now)

print("  kinetic.server.app imports")
EOF
else
  LLAMA_SERVER=${LLAMA_SERVER:-$(command -v llama-server || { [ -x /tmp/lsbuild/bin/llama-server ] && echo /tmp/lsbuild/bin/llama-server; } || true)}
fi
echo "llama-server: ${LLAMA_SERVER:-none: kinetic is measured alone}"

# ---- 6. the model
phase "waiting for the model"
wait "$MODEL_PID" || { cat "$WORK/model.log"; fatal "writing the model failed"; }
cat "$WORK/model.log"
MODEL_PATH=$(cd "$ROOT/bench" && "$PY" -c 'import sys; from bench_streams import model_path; print(model_path(sys.argv[1]))' "$MODEL" | tail -1)
[ -f "$MODEL_PATH" ] || fatal "no model at '$MODEL_PATH'"
echo "model: $MODEL_PATH"

# ---- 7. each server alone once, its log kept: both load, offload and answer
phase "preflight: each server alone (logs in \$OUT/preflight-*.log); $(left) s left"
if [ "$(left)" -lt 200 ]; then
  echo "SKIPPED: too little time left (the bench goes first)"
else
  COMMON=(-m "$MODEL_PATH" -t "$THREADS" --no-repack -c "$CTX_STREAMS" -np "$NP_STREAMS" -ngl "$NGL")
  PF=0
  if [ -n "${LLAMA_SERVER:-}" ]; then
    timeout -k 10 -s INT "$PREFLIGHT_S" "$PY" bench/gpu/preflight.py llama-server "$OUT/preflight-llama-server.log" \
      "$LLAMA_SERVER" "${COMMON[@]}" || PF=1
  fi
  timeout -k 10 -s INT "$PREFLIGHT_S" "$PY" bench/gpu/preflight.py kinetic "$OUT/preflight-kinetic.log" \
    "$PY" -m kinetic serve "${COMMON[@]}" -v || PF=1
  [ "$PF" = 0 ] || fatal "a server failed its preflight (above, and \$OUT/preflight-*.log)"
fi

# the GPU's load all along the bench (local timestamps: report.py reads them as local too)
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,power.draw --format=csv,nounits \
    -lms 500 > "$OUT/gpu.csv" 2>/dev/null &
  BG+=($!)
fi

cd "$ROOT"
FAILED=0
BENCH=("$PY" bench/bench_streams.py --model "$MODEL_PATH" -t "$THREADS")
if [ -n "${LLAMA_SERVER:-}" ]; then BENCH+=(--llama-server "$LLAMA_SERVER"); else BENCH+=(--no-llama-server); fi
rm -f "$WORK"/streams.json "$WORK"/classroom.json "$WORK"/class-size.json

# ---- 8. streams
phase "bench streams ($STREAMS; -np $NP_STREAMS -c $CTX_STREAMS; $TOKENS_STREAMS tokens; $ROUNDS rounds); $(left) s left"
if [ "$(left)" -lt 75 ]; then
  echo "SKIPPED: too little time left"; FAILED=1
else
  timed streams timeout -k 15 -s INT $(( $(left) - 20 )) "${BENCH[@]}" streams -c "$CTX_STREAMS" -np "$NP_STREAMS" \
    --streams "$STREAMS" --tokens "$TOKENS_STREAMS" --rounds "$ROUNDS" --json "$WORK/streams.json" \
    "--kinetic-flags=-ngl $NGL" "--llama-server-flags=-c $CTX_STREAMS -np $NP_STREAMS -ngl $NGL" \
    || { echo "FAILED: bench streams"; FAILED=1; }
fi

# ---- 9. classroom
phase "bench classroom ($STUDENTS students; -np $NP_CLASS -c $CTX_CLASS); $(left) s left"
if [ "$(left)" -lt 50 ]; then
  echo "SKIPPED: too little time left"; FAILED=1
else
  timed classroom timeout -k 15 -s INT $(( $(left) - 15 )) "${BENCH[@]}" classroom -c "$CTX_CLASS" -np "$NP_CLASS" \
    --students "$STUDENTS" --rounds "$ROUNDS" --history "$HISTORY" --json "$WORK/classroom.json" \
    "--kinetic-flags=-ngl $NGL" "--llama-server-flags=-c $CTX_CLASS -np $NP_CLASS -ngl $NGL" \
    || { echo "FAILED: bench classroom"; FAILED=1; }
fi

# ---- 10. class size: only on a machine with time to spare (one whose build was reused)
phase "bench class-size ($CLASS_SIZES students, ${CLASS_SIZE_DURATION} s each; -np $NP_CLASS); $(left) s left"
if [ "$(left)" -lt "$CLASS_SIZE_MIN_S" ]; then
  echo "SKIPPED: fewer than CLASS_SIZE_MIN_S=$CLASS_SIZE_MIN_S s left"
else
  timed class-size timeout -k 15 -s INT $(( $(left) - 15 )) "${BENCH[@]}" class-size -c "$CTX_CLASS" -np "$NP_CLASS" \
    --sizes "$CLASS_SIZES" --duration "$CLASS_SIZE_DURATION" --json "$WORK/class-size.json" \
    "--kinetic-flags=-ngl $NGL" "--llama-server-flags=-c $CTX_CLASS -np $NP_CLASS -ngl $NGL" \
    || { echo "FAILED: bench class-size"; FAILED=1; }
fi
for p in ${BG[@]+"${BG[@]}"}; do kill "$p" 2>/dev/null || true; done
BG=()

# ---- 11. the report
phase "report: \$OUT/results.json and \$OUT/results.md"
REPORT=("$PY" bench/gpu/report.py --out "$OUT" --model "$MODEL_PATH" --commit "$COMMIT"
        --note "-ngl $NGL -t $THREADS; streams -np $NP_STREAMS -c $CTX_STREAMS; classroom -np $NP_CLASS -c $CTX_CLASS"
        --phases "$WORK/phases.tsv")
for part in streams classroom class-size; do
  [ -f "$WORK/$part.json" ] && REPORT+=("--$part" "$WORK/$part.json")
done
[ -f "$OUT/gpu.csv" ] && REPORT+=(--gpu-csv "$OUT/gpu.csv")
"${REPORT[@]}" || { echo "FAILED: report"; FAILED=1; }

phase "done"
ls -la "$OUT"
exit "$FAILED"
