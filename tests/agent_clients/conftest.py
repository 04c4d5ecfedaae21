"""The agent-client tier: the real opencode and Claude Code from npm, driven by a fake model (`make test`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.agent_clients import clients_dir


@pytest.fixture(scope="session")
def clients() -> Path:
    """The installed clients; skipped where they are not installed, a failure where the Makefile said they are."""
    found = clients_dir()
    if found is None:
        if os.environ.get("NODEDECK_AGENT_CLIENTS"):
            pytest.fail(f"no opencode and claude under $NODEDECK_AGENT_CLIENTS={os.environ['NODEDECK_AGENT_CLIENTS']}"
                        "/node_modules/.bin (make test installs them)")
        pytest.skip("the coding-agent clients are not installed: `make test` (or `make test-agent-clients`) "
                    "installs them into .agents-clients/")
    return found
