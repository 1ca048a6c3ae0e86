"""The Ray actor that holds one rank of a gpushepherd run (design note 013, "Ray").

Stdlib only, and pickled by value by ``gpushepherd.backends.ray``: the Ray workers need
not import gpushepherd. The actor starts the runner (``gpushepherd.daemon.runner``) as a
subprocess in its own process group with the actor's ``CUDA_VISIBLE_DEVICES`` (set by
Ray from ``num_gpus``) and ``SHEPHERD_RAY_NODE_ID`` (the Ray node it runs on), appending its output to the run's ``stdout``/``stderr``.
"""

from __future__ import annotations

import os
import signal
import subprocess

#: the runner's stop signals (``gpushepherd.daemon.runner.STOP_SIGNALS``; this module may
#: not import gpushepherd): the runner starts with them blocked until its handlers are in
#: place, so a preemption sent at once is a stop, not a killed runner (a lost run)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class RunActor:
    """One rank of a run. Methods: ``done()`` blocks until the runner exits and returns
    its code (``-S`` for a signal S; 127 if it could not be started); ``signal(sig)``
    sends ``sig`` to the runner's process group; ``info()`` gives the runner's pid and
    the node's address."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str):
        env = dict(env)
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            env["CUDA_VISIBLE_DEVICES"] = cvd
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        try:  # the node this rank really runs on, for the job and its logs
            import ray
            env["SHEPHERD_RAY_NODE_ID"] = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside a Ray worker
            pass
        self.proc = None
        with open(stdout, "ab") as out, open(stderr, "ab") as err:
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err,
                                             stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
            except OSError as exc:  # no such cwd, no interpreter at the server's path
                err.write(f"shepherd: cannot start the runner on this Ray node: {exc}\n".encode())
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def done(self) -> int:
        return 127 if self.proc is None else self.proc.wait()

    def signal(self, sig: int) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGKILL:
            self.proc.wait()
        return True

    def info(self) -> dict:
        return {"pid": None if self.proc is None else self.proc.pid}
