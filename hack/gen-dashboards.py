#!/usr/bin/env python3
"""Generate the Grafana dashboards and the Prometheus alert rules (src/gpusched/metrics).

python3 hack/gen-dashboards.py           # write deploy/helm/gpusched/{dashboards,rules}, deploy/prometheus
python3 hack/gen-dashboards.py --check   # exit 1 if a committed file differs from the generator
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpusched.metrics.generate import stale, write

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        bad = stale(ROOT)
        for p in bad:
            print(f"stale: {p} (run python3 hack/gen-dashboards.py)", file=sys.stderr)
        sys.exit(1 if bad else 0)
    if sys.argv[1:]:
        sys.exit(__doc__)
    for p in write(ROOT):
        print(f"wrote {p}")
