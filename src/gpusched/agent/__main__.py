"""``python -m gpusched.agent ...``: the agent's commands (``gpusched.cli.agent``) under their own
program name, the DaemonSet's entry point (``python -m gpusched.agent run ...``). Importing
``gpusched.cli.agent`` loads the ``gpusched`` CLI package with it, so this process is no lighter
than ``gpusched agent ...``."""

from gpusched.cli.agent import agent_app

if __name__ == "__main__":
    agent_app(prog_name="gpusched-agent")
