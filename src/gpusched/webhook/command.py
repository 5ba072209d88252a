"""``gpusched webhook``: the mutating admission webhook's command (a typer command function, wired
into the CLI by ``app.command("webhook")(webhook_command)``), and ``python -m gpusched.webhook``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_PORT = 8443


def webhook_command(
    tls_cert_file: Annotated[
        Path, typer.Option(help="PEM certificate the webhook serves (the Secret's tls.crt).", exists=True)
    ] = Path("/etc/gpusched/tls/tls.crt"),
    tls_key_file: Annotated[
        Path, typer.Option(help="PEM key of that certificate (the Secret's tls.key).", exists=True)
    ] = Path("/etc/gpusched/tls/tls.key"),
    port: Annotated[int, typer.Option(help="HTTPS port for /mutate and /healthz.")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Mutating admission webhook: give every container of a GPU share (gpusched.io/gpu-milli and/or
    gpusched.io/gpu-memory) the node agent's gpusched.io/gpu-share: 1 slot, and deny share requests that
    cannot be scheduled, naming the container and the field."""
    from gpusched.webhook.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(host, port, tls_cert_file, tls_key_file)


def main() -> None:
    typer.run(webhook_command)


if __name__ == "__main__":
    main()
