#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: compare the agent's discovery (real NVML) with nvidia-smi.
#   hack/gpu-check.sh [OUTDIR]      # writes discover.json, nvidia-smi.xml and labels.txt there; exit 1 on a difference
set -euo pipefail
out="${1:-$(mktemp -d)}"; mkdir -p "$out"
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found (no NVIDIA driver here)" >&2; exit 2; }
unset GPUSCHED_FAKE_GPUS
gpusched agent discover --json > "$out/discover.json"
nvidia-smi -q -x > "$out/nvidia-smi.xml"
gpusched agent labels > "$out/labels.txt"
echo "gpu-check: files in $out"
cat "$out/labels.txt"
gpusched agent compare-smi "$out/discover.json" "$out/nvidia-smi.xml"
