"""The jobs of ``shepherd demo``: short real processes that behave like the seed's
workloads (stdlib only; run as ``python -m gpushepherd.daemon.demo_jobs MODE ...``).

* ``inference SECONDS``: a service answering requests until SECONDS have passed.
* ``train STEPS``: a training loop of one-second steps that saves its step to
  ``SHEPHERD_CHECKPOINT_DIR`` after every step, resumes from it, and on SIGTERM
  (preemption) saves and exits with ``SHEPHERD_REQUEUE_EXIT_CODE`` (85: "checkpointed,
  requeue me").
* ``chunk SECONDS FAIL_INDEX``: one chunk of a job array; chunk FAIL_INDEX fails on
  its first attempt (a bad input fixed by the retry).
* ``notebook``: a notebook kernel nobody uses: it sleeps, its GPU stays idle.

Work is a duty cycle of short busy spells (about a quarter of one CPU core), so a job
that computes shows activity on a machine without GPUs, where the static inventory
takes a job's CPU use as a stand-in for its GPU utilisation.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def work(seconds: float) -> None:
    """Compute for ``seconds`` at about a 25 % duty cycle."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spell = time.monotonic() + 0.05
        while time.monotonic() < spell:
            pass
        time.sleep(0.15)


def inference(seconds: float) -> int:
    served, end = 0, time.monotonic() + seconds
    print("inference service up", flush=True)
    while time.monotonic() < end:
        work(1.0)
        served += 40
        print(f"served {served} requests", flush=True)
    print("inference service drained and stopped", flush=True)
    return 0


def train(steps: int) -> int:
    ckpt = os.path.join(os.environ["SHEPHERD_CHECKPOINT_DIR"], "step")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    print(f"run {os.environ.get('SHEPHERD_RUN', '?')}: "
          + (f"resuming from checkpoint at step {step}" if step else "starting at step 0"), flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while step < steps:
        work(1.0)
        step += 1
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(ckpt + ".tmp", ckpt)
        print(f"step {step}/{steps}", flush=True)
        if stop and step < steps:
            print(f"SIGTERM: checkpoint saved at step {step}; exiting to be requeued", flush=True)
            return int(os.environ.get("SHEPHERD_REQUEUE_EXIT_CODE", "85"))
    print("training done", flush=True)
    return 0


def chunk(seconds: float, fail_index: int) -> int:
    index = int(os.environ["SHEPHERD_ARRAY_TASK_ID"])
    attempt = int(os.environ["SHEPHERD_ARRAY_TASK_ATTEMPT"])
    print(f"chunk {index} attempt {attempt}", flush=True)
    work(seconds)
    if index == fail_index and attempt == 1:
        print(f"chunk {index}: bad input record, failing", file=sys.stderr, flush=True)
        return 1
    print(f"chunk {index} done", flush=True)
    return 0


def notebook() -> int:
    print("notebook kernel started; nobody is using it", flush=True)
    time.sleep(3600)
    return 0


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "inference":
        return inference(float(args[0]))
    if mode == "train":
        return train(int(args[0]))
    if mode == "chunk":
        return chunk(float(args[0]), int(args[1]))
    if mode == "notebook":
        return notebook()
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
