"""``gpusched up`` records the processes it adds (gpusched's scheduler and webhook) in testenv's state;
``down`` stops every recorded process group and removes the state and the env file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from gpusched.testenv import session


def test_down_stops_the_processes_up_added_and_removes_the_env_file(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    (state_dir / session.WORKDIR).mkdir(parents=True)
    state = session.TestEnvState(
        kubeconfig="k", server="s", workdir=str(state_dir / session.WORKDIR), nodes=[], processes=[],
        started_at=time.time(),
    )  # fmt: skip
    session.write_state(state_dir, state)
    procs = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
    try:
        state = session.add_processes(
            state_dir, state, {"gpusched-scheduler": procs[0].pid, "webhook": procs[1].pid}
        )
        assert session.read_state(state_dir) == state
        assert [p.name for p in state.processes] == ["gpusched-scheduler", "webhook"]
        (state_dir / session.ENV_FILE).write_text("export KUBECONFIG=k\n")
        assert session.testenv_down(state_dir, quiet=True) is True
        for p in procs:
            assert p.wait(timeout=5) is not None  # stopped by down, not by this test
        assert not state_dir.exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
