"""Where ``gpusched doctor ...`` and ``gpusched ui`` read their books: a snapshot file
(``--snapshot``) or the live API (``--kubeconfig``). Both command modules import it, neither the
other (``cli/doctor.py`` adds ``ui`` to the ``kubectl gpusched`` plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpusched.doctor.books import Books

SnapshotOpt = Annotated[
    Path | None, typer.Option("--snapshot", help="Read this snapshot file instead of the live API.")
]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, else in-cluster).")
]


def load_books(snapshot: Path | None, kubeconfig: str | None, policy: str = "default") -> Books:
    """The books of a snapshot file, or of the live API."""
    from gpusched.doctor.snapshot import load_snapshot
    from gpusched.doctor.source import from_api

    snap = load_snapshot(snapshot) if snapshot is not None else from_api(kubeconfig)
    return Books.of(snap, policy)


__all__ = ["KubeconfigOpt", "SnapshotOpt", "load_books"]
