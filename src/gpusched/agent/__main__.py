"""``python -m gpusched.agent ...``: the agent's commands without the rest of gpusched's CLI (a lighter
process
for the DaemonSet than ``gpusched agent ...``, which loads the scheduler and simulator too)."""

from gpusched.agent.cli import agent_app

if __name__ == "__main__":
    agent_app(prog_name="gpusched-agent")
