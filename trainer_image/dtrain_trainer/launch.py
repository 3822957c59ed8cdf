"""`python -m dtrain_trainer.launch`: torchrun, exiting with the failing worker's own exit code.

torchrun exits 1 whenever any worker fails, so a worker killed by the OOM killer (137)
and a worker that raised (1) look the same from outside. restartPolicy ExitCode needs
the difference (1-127: the program's error, not retried; 128+: killed, retried), in a
pod and under `dtrain run` alike. This runs torchrun itself, with its own arguments and
PET_* variables, and exits with the code of the first worker that failed.

SIGTERM (a pod deleted, preempted or drained) reaches torchrun, which passes it to its
workers and waits up to --shutdown-timeout (PET_SHUTDOWN_TIMEOUT, rendered from the pod's
grace period) while they stop at a step boundary and rank 0 saves a checkpoint; then this
exits 128 + the signal (143), as a process killed by it would, not 1 (which
restartPolicy ExitCode would read as the program's own error).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from dtrain_operator.api import contract


def pod_exit_code(worker_exit_code: int) -> int:
    """torch reports a worker killed by signal n as -n; a container reports 128 + n."""
    return contract.SIGNAL_EXIT_BASE - worker_exit_code if worker_exit_code < 0 else worker_exit_code


def home_problem() -> str | None:
    """Why this process cannot run the trainer as the user it is (None: it can).

    Worker pods run as the trainer image's user (uid 10001, the pod's runAsUser). An image built
    FROM a base with a root home, without that user, fails here at once with this message.
    """
    home = os.environ.get("HOME") or os.path.expanduser("~")
    if os.path.isdir(home) and os.access(home, os.W_OK):
        return None
    return (
        f"dtrain: running as uid {os.getuid()} (the pod's runAsUser), but HOME={home} is not a writable "
        "directory: build your image FROM the dtrain trainer image, or create that user with a home "
        "(see trainer_image/Dockerfile)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    problem = home_problem()
    if problem is not None:
        print(problem, file=sys.stderr, flush=True)
        return 1
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as failed:
        # torchrun's failure report (rank, exit code, the worker's error) is what a person reads first.
        print(failed, file=sys.stderr, flush=True)
        _, first = failed.get_first_failure()
        return pod_exit_code(first.exitcode)
    except SignalException as signalled:
        print(f"dtrain: torchrun stopped its workers on {signalled.sigval.name}", file=sys.stderr, flush=True)
        return contract.SIGNAL_EXIT_BASE + int(signalled.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
