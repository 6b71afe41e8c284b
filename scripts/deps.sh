#!/usr/bin/env bash
# Installs the Debian 12 packages edbatch builds with, if any are missing.
set -euo pipefail
pkgs=(g++ cmake make libeigen3-dev libtbb-dev doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev)
# The PyTorch extension and its tests (docs/pytorch.md), with the test of `pip install .` into a
# venv (python3-venv; ninja-build compiles it in parallel) and the charts of scripts/report.py
# (python3-matplotlib); EDBATCH_TORCH=OFF skips them.
if [ "${EDBATCH_TORCH:-ON}" != "OFF" ]; then
  pkgs+=(python3-torch libtorch-dev python3-pytest python3-venv ninja-build python3-matplotlib)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
