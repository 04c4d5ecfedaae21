"""Parses of what a node sent take time linear in it: inputs where a super-linear parse (measured by an audit,
2026-12-07) took from minutes to hours each finish within a generous liveness limit. A regex holds the GIL for
the whole call, so each case runs in a child process that is killed past the limit (no timing is asserted:
linear is milliseconds, the old parse far past the limit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LIMIT_S = 120

CASES = {
    # decommission system info: sections the node names, each BEGIN without its END (1 MB)
    "sysinfo sections": """
        import re
        from ops.decommission.sysinfo import capture
        from ops.hosts.base import CommandResult
        from ops.hosts.local import LocalHost

        class Node(LocalHost):
            def run(self, argv, **kw):
                m = re.search(r"NDK-[0-9a-f]{16}", " ".join(argv)).group()
                out = f"{m} BEGIN os\\n".encode() * 40_000
                return CommandResult(tuple(argv), 0, out, b"", 0.0)

        info = capture(Node())
        assert not info.sections and info.error
    """,
    # host stats through the script: a df row of 400,000 spaces
    "df row": """
        from ops.telemetry.hoststats import parse_host_script_output
        raw = parse_host_script_output("@@nodedeck df /\\n/dev/x" + " " * 400_000 + "y\\n", ["/"])
        assert raw.disks == [] and raw.disk_errors
    """,
    # server log lines: 64 KiB of '[' before a batch line, 20 lines
    "log brackets": """
        from ops.telemetry.serverlog import parse_log_line
        for _ in range(20):
            parse_log_line("[" * 65_000 + "Decode batch. #running-req: 1, gen throughput (token/s): 5.0")
    """,
    # a listed symlink whose target is 2 MB of components
    "link target": """
        from ops.decommission.links import resolve
        assert resolve("/r/l/x", {"/r/l": "a/" * 1_000_000}) is None
    """,
    # a coding agent's list of 100,000 items, each blocked by the one before
    "agent todos": """
        import io, contextlib
        from cli.todo_agents import _print_items
        from ops.agents.todos import AgentItem
        items = [AgentItem(position=i + 1, id=str(i), content=f"task {i}", status="pending",
                           blocked_by=(str(i - 1),) if i else ()) for i in range(100_000)]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            _print_items(items)
        assert "blocked by #99999" in out.getvalue()
    """,
    # every file of a big tree touched during the download (a chmod -R does it): hashed again, 30,000 of them
    "rehash touched": """
        from ops.decommission.filestate import FileState
        from ops.decommission.inventory import Entry
        from ops.decommission.transfer import FileJob
        from ops.decommission.verify import TOUCHED, _rehash

        class Hasher:
            def hash_jobs(self, jobs):
                for j in jobs:
                    j.node_sha256 = "0" * 64
                return {}

        states = []
        for i in range(30_000):
            e = Entry(0, f"f{i}", "f", 1, 0, 0o644, path=f"f{i}", node_path=f"/r/f{i}")
            job = FileJob(e.path, e.node_path, 1, 0, 0o644)
            job.sha256 = "0" * 64
            states.append(FileState(e, job=job))
        _rehash(states, Hasher(), TOUCHED)
        assert not any(fs.changed for fs in states)
    """,
    # a vLLM /metrics page of 4,000 draft counters and 4,000 positions, scraped twice (rates, then totals)
    "metrics positions": """
        from ops.hosts.local import LocalHost
        from ops.telemetry.inference import PER_POSITION, InferenceMetrics
        n = 4000
        page = "".join(f'vllm:spec_decode_num_drafts_total{{engine="{i}"}} 10\\n' for i in range(n))
        page += "".join(f'{PER_POSITION}{{position="{i}"}} 5\\n' for i in range(n))
        page += "vllm:spec_decode_num_accepted_tokens_total 7\\nvllm:spec_decode_num_draft_tokens_total 9\\n"
        m = InferenceMetrics(LocalHost(), "http://127.0.0.1:9/metrics")
        m.parse(page, 1.0)
        snap = m.parse(page, 2.0)
        assert snap.per_position_acceptance and snap.error is None
    """,
    # log_contains where the node's grep fails (exit 2): a plan's pattern over 16 MB of digits in one line
    "log_contains fallback": """
        import os
        from ops.hosts.local import LocalHost
        from ops.plan.records import CheckSpec
        from ops.run.checks import CheckContext, run_check
        d = os.environ["ND_TMP"]
        with open(os.path.join(d, "grep"), "w") as f:
            f.write("#!/bin/sh\\necho 'grep: exceeded PCRE backtracking limit' >&2\\nexit 2\\n")
        os.chmod(os.path.join(d, "grep"), 0o755)
        os.environ["PATH"] = d + ":" + os.environ["PATH"]
        with open(os.path.join(d, "run.log"), "w") as f:
            f.write("1" * 16_000_000)
        ctx = CheckContext(LocalHost(), base_dir=d, log_path=os.path.join(d, "run.log"))
        r = run_check(CheckSpec("log_contains", {"pattern": r"\\d+ conversations for \\d+ prompts"}), ctx)
        assert not r.ok, r.text
    """,
    # a /metrics page of one 4 MiB line of labels (the Prometheus parser copies the rest of a line per label)
    "metrics line": """
        from ops.errors import HostError
        from ops.telemetry.inference import parse_samples
        line = "vllm:x{" + ",".join(f'l{i}="v"' for i in range(300_000)) + "} 1\\n"   # 3.3 MB
        try:
            parse_samples(line)
        except HostError as e:
            assert "longer than" in str(e), e
        else:
            raise AssertionError("a 4 MiB line was parsed")
    """,
}


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_answer_parses_in_linear_time(case, tmp_path):
    code = textwrap.dedent(CASES[case])
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S,
                             env={**os.environ, "ND_TMP": str(tmp_path)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: still parsing after {LIMIT_S} s")
    assert res.returncode == 0, res.stderr[-2000:]
