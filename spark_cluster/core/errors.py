"""One exception tree, caught once at the CLI boundary."""

from __future__ import annotations


class SparkClusterError(Exception):
    """Root of every error spark-cluster reports to a user (exit code 1 unless said)."""

    exit_code = 1


class UsageError(SparkClusterError, ValueError):
    """Bad input from the user: exit code 2."""

    exit_code = 2


class StoppedFollowing(SparkClusterError):
    """Ctrl-C while following a start: this tool stops, what it started keeps running.

    `details` (node, phase, next_step) go into `up --json`'s closing `interrupted` event.
    """

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


class StageFailed(SparkClusterError):
    """A stage of `up` failed for a reason it could name: `details` (stage, node, cause,
    next_step, and what else the stage knows) go into `up --json`'s closing `failed` event."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


class LabError(SparkClusterError, RuntimeError):
    """The simulated lab could not be brought up, changed or torn down."""


class ConnectError(SparkClusterError, ConnectionError):
    """A node could not be reached or logged into; the message names the node and the fix."""

    def __init__(self, node: str, message: str, hint: str = "") -> None:
        self.node = node
        self.hint = hint
        super().__init__(f"{node}: {message}" + (f"\n  hint: {hint}" if hint else ""))


class CommandTimeout(SparkClusterError, TimeoutError):
    """A remote command ran past its timeout."""
