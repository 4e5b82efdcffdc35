"""Errors the user can fix by changing an option; the CLI prints them as one paragraph, without a traceback."""


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix."""


class Preempted(Exception):
    """Training stopped early after saving a resumable checkpoint (the job was told it will be preempted)."""

    exit_code = 75  # EX_TEMPFAIL: "temporary failure; the user is invited to retry"
