#!/usr/bin/env bash
# On a machine with NVIDIA GPUs (the day one is lent): the comparisons CI makes against hack/fakenvml, made
# against the real driver. Under 10 minutes (the GFD build is ~4 CPU-min when not cached).
#   hack/gpu-check.sh [OUTDIR]
# 1. the agent's discovery (real NVML) vs nvidia-smi (compare-smi);
# 2. the agent's labels vs NVIDIA's GFD (built by hack/build-nvidia-device-plugin.sh) run on this node, key by
#    key, for MIG strategies none and mixed;
# Writes discover.json, nvidia-smi.xml, labels-<strategy>.txt, gfd-<strategy>.txt there; exit 1 on a difference.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"; mkdir -p "$out"
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found (no NVIDIA driver here)" >&2; exit 2; }
unset GPUSCHED_FAKE_GPUS GPUSCHED_FAKE_NVML_CONFIG
status=0
gpusched agent discover --json > "$out/discover.json"
nvidia-smi -q -x > "$out/nvidia-smi.xml"
echo "== agent vs nvidia-smi"
gpusched agent compare-smi "$out/discover.json" "$out/nvidia-smi.xml" || status=1

bins="$(hack/build-nvidia-device-plugin.sh | tail -n 1)"
for strategy in none mixed; do
  echo "== agent vs GFD (--mig-strategy ${strategy})"
  gpusched agent labels --mig-strategy "${strategy}" | grep '^nvidia.com/' | sort > "$out/labels-${strategy}.txt"
  timeout 120 "${bins}/gpu-feature-discovery" --oneshot --no-timestamp --mig-strategy "${strategy}" \
    --device-discovery-strategy nvml --output-file "$out/gfd-${strategy}.txt" >"$out/gfd-${strategy}.log" 2>&1 \
    || { echo "gpu-check: GFD failed, see $out/gfd-${strategy}.log" >&2; status=1; continue; }
  sort -o "$out/gfd-${strategy}.txt" "$out/gfd-${strategy}.txt"
  # key by key: '<' only GFD has it or its value, '>' only the agent
  if ! diff "$out/gfd-${strategy}.txt" "$out/labels-${strategy}.txt"; then status=1; fi
done
echo "gpu-check: files in $out; $([[ $status == 0 ]] && echo 'no differences' || echo 'DIFFERENCES above')"
exit "$status"
