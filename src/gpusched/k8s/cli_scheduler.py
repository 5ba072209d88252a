"""``python -m gpusched.k8s.cli_scheduler``: ``gpusched scheduler`` by its older name, kept for the
scripts and tests that start the scheduler so. The options are ``gpusched.cli.serve``'s; the
serving is ``gpusched.k8s.serve``'s."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    from gpusched.cli.serve import scheduler_main

    scheduler_main(argv)


if __name__ == "__main__":
    main()
