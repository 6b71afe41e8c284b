#!/usr/bin/env bash
# Sets up, builds and trains the Tree-LSTM demo on built-in synthetic trees.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tree_lstm_demo "$@"
