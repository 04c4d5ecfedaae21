"""Errors that reach the user as one clear line."""

from ops.textsafe import last_line


class NodedeckError(Exception):
    """Base of every error nodedeck reports to the user as one line."""


class UserError(NodedeckError):
    """Bad input from the user (file, flag, config): the CLI exits 2."""


class HostError(NodedeckError):
    """A node could not do what was asked.

    A command cut short (connection lost, timeout) carries the output it had sent so far in
    `partial_stdout` / `partial_stderr`, so a caller can still show it.
    """

    partial_stdout: bytes = b""
    partial_stderr: bytes = b""


class HostUnreachable(HostError):
    """The node cannot be reached (connection refused, reset, DNS, auth)."""


class HostTimeout(HostError):
    """A command or transfer on the node ran past its timeout."""


class OutputTooLarge(HostError):
    """A command on a node printed more than nodedeck keeps of it (ops.hosts.base.MAX_OUTPUT): it was stopped;
    `partial_stdout` / `partial_stderr` hold what it had printed up to the cap."""


class HostKeyError(HostUnreachable):
    """The node's host key is unknown (and not accepted) or has changed: unreachable until the user acts."""


class CommandFailed(HostError):
    """A remote or local command exited non-zero where success was required."""

    def __init__(self, argv, returncode, stderr):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = f": {line}" if (line := last_line(stderr)) else ""
        super().__init__(f"{argv[0] if argv else '?'} exited {returncode}{detail}")
