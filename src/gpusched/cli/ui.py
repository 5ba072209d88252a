"""``gpusched ui``: the GPU map in the browser (``gpusched.doctor.ui``), from a snapshot file or
the live API."""

from __future__ import annotations

import threading
from typing import Annotated

import typer

from gpusched.cli.books import KubeconfigOpt, SnapshotOpt, load_books
from gpusched.cli.common import reports_errors


@reports_errors
def ui(
    snapshot: SnapshotOpt = None,
    kubeconfig: KubeconfigOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    refresh: Annotated[float, typer.Option(help="Live API: seconds between reads.")] = 5.0,
) -> None:
    """Serve the GPU map: every node's GPUs by what holds them, stranded capacity, pending pods,
    and doctor's counterfactual for a selected pod."""
    from gpusched.doctor.ui import BooksCache, serve

    cache = BooksCache(lambda: load_books(snapshot, kubeconfig), None if snapshot else refresh)
    cache.get()  # a bad snapshot or an unreachable API fails here, before listening
    server = serve(cache, host, port)
    typer.echo(f"GPU map on http://{host}:{server.server_address[1]}/  (Ctrl-C stops)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


__all__ = ["ui"]
