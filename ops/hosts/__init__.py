"""Hosts: one interface for the local machine and for nodes over SSH."""

from ops.hosts.base import CommandResult, ConnState, FileStat, Host, TransferResult
from ops.hosts.local import LocalHost

__all__ = ["CommandResult", "ConnState", "FileStat", "Host", "LocalHost", "TransferResult"]
