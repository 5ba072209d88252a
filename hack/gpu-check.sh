#!/usr/bin/env bash
# On a machine with NVIDIA GPUs (the day one is lent): the comparisons CI makes against hack/fakenvml, made
# against the real driver, and the MPS enforcement check. Under 10 minutes (the GFD build is ~4 CPU-min when
# not cached).
#   hack/gpu-check.sh [OUTDIR]        1. the agent's discovery (real NVML) vs nvidia-smi (compare-smi);
#                                     2. the agent's labels vs NVIDIA's GFD (built by
#                                        hack/build-nvidia-device-plugin.sh) run on this node, key by key, for MIG
#                                        strategies none and mixed. Writes discover.json, nvidia-smi.xml,
#                                        labels-<strategy>.txt, gfd-<strategy>.txt there; exit 1 on a difference.
#   hack/gpu-check.sh --mps [OUTDIR]  MPS enforcement on GPU 0, as `gpusched agent run --sharing mps` sets it up: the
#                                     agent's MpsDaemons starts the GPU's control daemon, two clients get the
#                                     environment Allocate gives two shares (1024 MiB and 4096 MiB); the first one
#                                     allocating 2048 MiB must fail, while its neighbour keeps and uses its 512 MiB;
#                                     the daemon is stopped at the end. Needs root (the daemon's mount namespace),
#                                     the driver's nvidia-cuda-mps-control and libcuda.so.1. Exit 1 when a limit is
#                                     not enforced.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=discover
if [[ "${1:-}" == "--mps" ]]; then mode=mps; shift; fi
out="${1:-$(mktemp -d)}"; mkdir -p "$out"
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found (no NVIDIA driver here)" >&2; exit 2; }
unset GPUSCHED_FAKE_GPUS GPUSCHED_FAKE_NVML_CONFIG

if [[ "${mode}" == discover ]]; then
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
fi

command -v nvidia-cuda-mps-control >/dev/null || { echo "gpu-check: nvidia-cuda-mps-control not found" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "gpu-check --mps: needs root (the daemon's mount namespace)" >&2; exit 2; }
uuid="$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')"
echo "gpu-check --mps: GPU 0 ${uuid}; MPS root ${out}/mps"
python3 - "${uuid}" "${out}/mps" <<'PY'
"""Two MPS clients of one GPU with the agent's environment: the one past its limit fails, its neighbour does not."""
import ctypes, os, subprocess, sys, time
from pathlib import Path

from gpusched.agent.allocation import Assignment
from gpusched.agent.mps import MpsDaemons
from gpusched.agent.sharing import Sharing

uuid, root = sys.argv[1], Path(sys.argv[2])
sharing = Sharing("mps", MpsDaemons(root))

CLIENT = r'''
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        print(f"{what}: CUDA error {r}", flush=True); sys.exit(3 if r == 2 else 4)  # 2: CUDA_ERROR_OUT_OF_MEMORY
ok(cuda.cuInit(0), "cuInit")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
mib = int(sys.argv[1])
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)), f"cuMemAlloc {mib} MiB")
print(f"allocated {mib} MiB", flush=True)
hold = float(sys.argv[2])
deadline = time.time() + hold
while time.time() < deadline:  # keep using it
    ok(cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(7), ctypes.c_size_t(mib << 20)), "cuMemsetD8")
    ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    time.sleep(0.2)
print("done", flush=True)
'''

def client(share_mib, milli, alloc_mib, hold_s, key):
    resp = sharing.container(uuid, Assignment("gpu-check", (0,), milli, share_mib), key)
    env = {**os.environ, **resp.envs, "CUDA_VISIBLE_DEVICES": uuid}
    # the container's pipe directory is the GPU's (the mount Allocate asks the kubelet for)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(sharing.mps.pipe_dir(uuid))
    print(f"  client {key[1]}: {resp.envs['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT']}, "
          f"threads {resp.envs.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')} %, allocates {alloc_mib} MiB")
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(alloc_mib), str(hold_s)], env=env,
                            stdout=subprocess.PIPE, text=True)

failed = False
try:
    neighbour = client(4096, 500, 512, 8.0, ("gpu-check", "neighbour"))
    time.sleep(2)
    greedy = client(1024, 250, 2048, 0.0, ("gpu-check", "greedy"))
    g_out, _ = greedy.communicate(timeout=60)
    n_out, _ = neighbour.communicate(timeout=60)
    print("  greedy:", g_out.strip().replace("\n", "; "), f"(exit {greedy.returncode})")
    print("  neighbour:", n_out.strip().replace("\n", "; "), f"(exit {neighbour.returncode})")
    if greedy.returncode != 3:
        print("FAIL: the share allocating past its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT was not refused"); failed = True
    if neighbour.returncode != 0 or "done" not in n_out:
        print("FAIL: the neighbouring share was disturbed"); failed = True
finally:
    sharing.mps.reconcile({}, now=time.monotonic() + 3600)  # no share left: the daemon quits
print("gpu-check --mps:", "FAILED" if failed else "ok: the limit held and the neighbour ran on")
sys.exit(1 if failed else 0)
PY
