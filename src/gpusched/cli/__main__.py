"""``python -m gpusched.cli ...``: the same as the ``gpusched`` command."""

from gpusched.cli import main

main()
