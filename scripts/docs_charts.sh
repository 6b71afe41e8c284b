#!/usr/bin/env bash
# Renders the charts of docs/img/ from the recorded results in docs/data/ (docs/performance.md,
# "Charts"; docs/data/README.md says where each file comes from). Needs python3-matplotlib.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/docs_charts.sh [-h|--help]

Renders docs/img/*.png from the recorded results in docs/data/ with scripts/report.py,
overwriting the charts there (docs/performance.md, "Charts"; docs/data/README.md says where each
file comes from). Takes no arguments. Environment: PYTHON, the Python with matplotlib to run
(default python3).
USAGE
}
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    *) echo "docs_charts.sh: unknown argument '$arg' (it takes none; see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
r() { "$py" scripts/report.py "$@"; }
d=docs/data
i=docs/img
mkdir -p "$i"
r throughput $d/h100_vs_pytorch.jsonl -o $i/h100_vs_pytorch.png \
  --title "H100: edbatch beside PyTorch (mini-batch 32, hidden 128; docs/cuda.md)"
r throughput $d/cpu_vs_pytorch.jsonl -o $i/cpu_vs_pytorch.png \
  --title "2-core CPU: edbatch beside PyTorch (mini-batch 32, hidden 128; docs/baselines.md)"
r throughput $d/h100_zoo.jsonl --model tree_lstm,lattice_lstm -o $i/h100_batch.png \
  --title "H100: instances/s against mini-batch size (docs/h100_results.md)"
r throughput $d/h100_zoo.jsonl --model tree_lstm,lattice_lstm --x hidden -o $i/h100_hidden.png \
  --title "H100: instances/s against hidden size (docs/h100_results.md)"
r throughput $d/cpu_sweep_tree_lstm.jsonl -o $i/cpu_sweep_batch.png \
  --title "2-core CPU, 1 thread: Tree-LSTM against mini-batch size, beside PyTorch"
r throughput $d/cpu_sweep_tree_lstm.jsonl --x hidden -o $i/cpu_sweep_hidden.png \
  --title "2-core CPU, 1 thread: Tree-LSTM against hidden size, beside PyTorch"
r phases $d/cpu_phases.jsonl --share -o $i/cpu_phases.png \
  --title "2-core CPU, 1 thread: where a mini-batch's time goes (mini-batch 32, hidden 128)"
r curve $d/lattice_lstm_policy_curve.csv -o $i/policy_curve.png \
  --title "edbatch train --model lattice_lstm --no-blocks: batches per mini-batch"
r epochs $d/sst_tree_lstm_epochs.json -o $i/sst_epochs.png \
  --title "edbatch run --model tree_lstm --train on SST train.txt (hidden 64, SGD 0.1)"
ls -la $i
