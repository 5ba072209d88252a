"""etcd's history compaction, asked for between measurements (etcd's v3 JSON gateway).

kube-apiserver compacts etcd's history every 5 minutes by default (``--etcd-compaction-interval``).
After thousands of pods were created, bound and deleted, that compaction is a burst of etcd
work (0.1-0.5 s for one 3000-pod benchmark case's history on a 2-core machine) in whatever runs
at that moment. A benchmark turns the periodic one off (``--etcd-compaction-interval=0``) and
compacts here between its measurements instead: every measurement starts on a compacted store
and none pays for a compaction.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from gpusched.testenv.binaries import ControlPlaneError

__all__ = ["EtcdError", "compact"]


class EtcdError(ControlPlaneError):
    """etcd answered a compaction with something other than success."""


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read() or b"{}")
            return out
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        raise EtcdError(f"etcd {url}: HTTP {e.code}: {detail}") from None
    except OSError as e:  # refused, unreachable, timed out (urllib.error.URLError is one)
        raise EtcdError(f"etcd {url}: no answer: {getattr(e, 'reason', e)}") from None


def compact(etcd_url: str, timeout: float = 120.0) -> int:
    """Compact etcd's history up to its current revision and wait until the compaction is
    physically applied; returns that revision. A store already compacted at its current
    revision (nothing written since) is left as it is."""
    base = etcd_url.rstrip("/")
    # any key: the answer's header carries the store's current revision
    header = _post(f"{base}/v3/kv/range", {"key": "AA==", "count_only": True}, timeout).get("header") or {}
    revision = int(header.get("revision", 0))
    if revision <= 1:
        return revision
    try:
        _post(f"{base}/v3/kv/compaction", {"revision": str(revision), "physical": True}, timeout)
    except EtcdError as e:
        if "compacted" not in str(e):  # "required revision has been compacted": nothing since
            raise
    return revision
