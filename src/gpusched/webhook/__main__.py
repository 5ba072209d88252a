"""``python -m gpusched.webhook``: ``gpusched webhook``, the light entry point of the webhook's Deployment.
The options are ``gpusched.cli.serve``'s."""

from gpusched.cli.serve import webhook_main

webhook_main()
