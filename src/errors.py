"""Errors the user can fix by changing an option; the CLI prints them as one paragraph, without a traceback."""


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix."""


class Preempted(Exception):
    """Training stopped early after saving a resumable checkpoint (a signal asked it to stop).

    ``exit_code`` is the process's exit status: 75 (EX_TEMPFAIL, "retry later") for a preemption notice such as
    SLURM's ``SIGUSR1``, which the ``slurm/`` scripts requeue; ``128 + signal`` for a stop a person or a
    scheduler asked for (130 for Ctrl-C, 143 for SIGTERM), which is not requeued but resumes all the same.
    """

    exit_code = 75  # the default: EX_TEMPFAIL, "temporary failure; the user is invited to retry"

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
