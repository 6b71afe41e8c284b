#!/usr/bin/env bash
# On a GPU machine with a CUDA torch and a CUDA toolkit: `pip install` the package into a fresh
# virtual environment that sees the system's packages (no package index needed: no build
# isolation, no dependencies), then `python -m edbatch` (which must list the cuda backend and the
# GPUs), the tree_lstm cell on the GPU and on the CPU checked against the pure-PyTorch reference
# (tests/python/pip_check.py --cuda), and the pytest suite against the installed package. Logs go
# to the output folder ($OUT when set, else gpu-pip-results): pip.log (with the build's choice
# of backends), info.txt, check.json, pytest.log. With --cmake, also the CMake package with the
# CUDA backend: build-gpu (as scripts/gpu.sh configures it) builds the library and the command,
# and CTest's package_install and package_example install it and build examples/installed
# against it (package.log).
#
#   scripts/gpu_pip.sh [--out DIR] [--python PY] [--no-pytest] [--cmake]
#
# Missing TBB, fmt or nlohmann-json: Debian packages in .deb/ are unpacked into a private prefix,
# as scripts/gpu.sh does, and given to the compiler through CPATH and LIBRARY_PATH.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-pip-results}
py=$(command -v python3)
pytest=1
cmake_package=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --no-pytest) pytest=0; shift ;;
    --cmake) cmake_package=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_pip.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
status=0

source scripts/gpu_deps.sh
if [ -d /tmp/edbatch-prefix/usr/include ]; then
  export CPATH="/tmp/edbatch-prefix/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="/tmp/edbatch-prefix/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available())' | tee "$out/torch.txt"

# A fresh environment over the system's packages. When torch lives in another environment
# (python3 itself a venv), a .pth file points the new one at torch's site-packages too.
work=$(mktemp -d /tmp/edbatch-pip.XXXXXX)
venv="$work/venv"
"$py" -m venv --system-site-packages "$venv" 2> /dev/null ||
  "$py" -m venv --system-site-packages --without-pip "$venv" || exit 1
if ! "$venv/bin/python" -c 'import torch' 2> /dev/null; then
  site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  "$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/torch_env.pth", "w").write(sys.argv[1] + "\n")' "$site"
fi
start=$(date +%s)
if ! MAX_JOBS=$(nproc) "$venv/bin/python" -m pip install -v --no-build-isolation --no-deps \
       --no-index "$root" > "$out/pip.log" 2>&1; then
  echo "gpu_pip.sh: pip install failed (pip.log):" >&2
  grep -E -B2 -A8 "error|Error" "$out/pip.log" | head -60 >&2
  exit 1
fi
echo "gpu_pip.sh: pip install took $(( $(date +%s) - start )) s;" \
  "$(grep -o 'edbatch: [A-Z].* backends (.*)' "$out/pip.log" | tail -1)" >&2

# From outside the checkout, so that the installed package is the one imported.
cd "$work"
env -u PYTHONPATH -u EDBATCH_LIBRARY "$venv/bin/python" -m edbatch | tee "$out/info.txt" || status=1
env -u PYTHONPATH -u EDBATCH_LIBRARY "$venv/bin/python" -m edbatch --json > "$out/info.json" || status=1
if ! grep -q '^backends built in: .*cuda' "$out/info.txt"; then
  echo "gpu_pip.sh: the installed package has no CUDA backend" >&2
  status=1
fi
if env -u PYTHONPATH -u EDBATCH_LIBRARY "$venv/bin/python" "$root/tests/python/pip_check.py" \
     --cuda > "$out/check.json" 2> "$out/check.log"; then
  echo "gpu_pip.sh: tree_lstm on cpu and cuda equals the reference: $(cat "$out/check.json")" >&2
else
  status=1
  echo "gpu_pip.sh: the cell check failed (check.log):" >&2
  tail -20 "$out/check.log" >&2
fi
if [ "$pytest" = 1 ] && "$venv/bin/python" -c 'import pytest' 2> /dev/null; then
  env -u PYTHONPATH -u EDBATCH_LIBRARY "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$root/tests/python" > "$out/pytest.log" 2>&1 || status=1
  tail -3 "$out/pytest.log" | sed 's/^/pytest (installed package): /' >&2
fi
cd "$root"
rm -rf "$work"
if [ "$cmake_package" = 1 ]; then
  if { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON \
         -DEDBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_BUILD_EXAMPLES=OFF \
         -DEDBATCH_TORCH=OFF &&
       ninja -C build-gpu -j "$(nproc)" edbatch edbatch_shared edbatch_cli &&
       ctest --test-dir build-gpu -R '^package_' --output-on-failure; } > "$out/package.log" 2>&1; then
    echo "gpu_pip.sh: the CMake package (CUDA) installs and builds examples/installed" >&2
  else
    status=1
    echo "gpu_pip.sh: the CMake package check failed (package.log):" >&2
    tail -30 "$out/package.log" >&2
  fi
fi
exit $status
