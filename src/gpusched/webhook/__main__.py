"""``python -m gpusched.webhook``: the webhook's light entry point for its Deployment."""

from gpusched.webhook.command import main

main()
