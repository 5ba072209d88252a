"""``python -m gpusched.extender.cli_extender``: kept for the scripts and tests that start the extender so."""

from gpusched.extender.serve import DEFAULT_PORT, build_profile, extender_command, main

__all__ = ["DEFAULT_PORT", "build_profile", "extender_command", "main"]

if __name__ == "__main__":
    main()
