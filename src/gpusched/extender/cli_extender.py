"""``python -m gpusched.extender.cli_extender``: ``gpusched extender`` by its older name, kept for
the scripts and tests that start the extender so. The options are ``gpusched.cli.serve``'s; the
serving is ``gpusched.extender.serve``'s."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.extender.serve import DEFAULT_PORT, build_profile, extender_command

__all__ = ["DEFAULT_PORT", "build_profile", "extender_command", "main"]


def main(argv: Sequence[str] | None = None) -> None:
    from gpusched.cli.serve import extender_main

    extender_main(argv)


if __name__ == "__main__":
    main()
