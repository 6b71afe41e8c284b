#!/usr/bin/env bash
# Sets up, builds and trains the Tree-LSTM (with blocks) on built-in synthetic trees through
# `edbatch run`; extra arguments go to it (see `./build/edbatch run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/edbatch run --model tree_lstm --data synthetic:2000 --train --epochs 3 "$@"
