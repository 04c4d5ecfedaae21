"""`nodedeck demo`: the whole product on this machine, for real, on CPU.

    nodedeck demo [--headless] [--work DIR] [--fresh] [--json] [--engine auto|standin|vllm] [--engine-python PATH]

Runs the bundled demo plan on node `local` in its own work dir: in the
dashboard (stages launch by themselves; it needs a terminal), or headless
(`--json` too), exiting 0 only when every stage verified. A demo dir is
resumed: what verified is kept, what failed is launched again. The engine:
`standin` (demo.toml: nodedeck-train serve), `vllm`
(demo-vllm.toml: vLLM serves the target and the drafter and benchmarks them),
`auto` (vLLM when --engine-python, $NODEDECK_VLLM_PYTHON or the checkout's
.venv-vllm names one). The demo's server stages are stopped at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cli.common import json_flag, require_terminal
from cli.output import emit_json
from ops import demo
from ops.hints import CliContext, current
from ops.node_handle import NodeHandles
from ops.outcome import closing_lines, plan_outcome
from ops.plan.parse import load_plan
from ops.plan.records import StageKind
from ops.plan.resolve import apply_overrides
from ops.run.scheduler import Scheduler


def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def cmd_demo(args) -> int:
    args.headless = args.headless or args.json     # JSON is for a script: no dashboard
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else _say
    engine = demo.choose_engine(args.engine, args.engine_python)
    if not args.headless:                           # before the work dir is made
        headless = current().command("demo", "--headless", "--work", str(Path(args.work).absolute()),
                                     "--engine", args.engine)
        require_terminal(f"`{headless}` runs the demo without it")
    setup = demo.prepare(Path(args.work), fresh=args.fresh, say=say, engine=engine)
    say(f"demo work dir {setup.work} (plan {setup.plan}; engine {engine.kind.value}, {engine.why})")
    if args.headless:
        return _headless(setup, args, say)
    _retry_failed(setup, say)
    return _dashboard(setup, say)


def _scheduler(setup, **kwargs):
    """The demo plan's scheduler on the demo's `local` node, and the node handles it opened."""
    nodes = NodeHandles(setup.config)
    return Scheduler(apply_overrides(load_plan(setup.plan), setup.plan_vars), nodes, node_name="local",
                     **kwargs), nodes


def _retry_failed(setup, say) -> None:
    """Before the dashboard opens on a resumed demo: what failed is marked to be launched again."""
    sched, nodes = _scheduler(setup)
    try:
        demo.retry_failed(sched, say)
    finally:
        nodes.close()


def _headless(setup, args, say) -> int:
    sched, nodes = _scheduler(setup, auto=True, listener=lambda ev: say(ev.message))
    started = time.monotonic()
    try:
        demo.retry_failed(sched, say)
        res = sched.run(poll=0.5)
    finally:
        demo.stop_servers(sched, say=say)
        nodes.close()
    elapsed = time.monotonic() - started
    if args.json:
        emit_json({"ok": res.ok, "elapsed_s": round(elapsed, 1), "work": str(setup.work),
                   "engine": setup.engine.kind.value, "outcome": plan_outcome(sched).to_json(),
                   "stages": [v.to_json() for v in res.views]})
    else:
        done = sum(v.state.satisfies_dependents for v in res.views)
        say(f"demo {'verified' if res.ok else 'FAILED'}: {done}/{len(res.views)} stages verified in {elapsed:.0f}s")
        summary = demo.eval_summary(setup.work)
        if summary:
            say(summary)
        for line in closing_lines(sched):
            say(line)
        for v in res.views:
            if not v.state.satisfies_dependents:
                say(f"  {v.id} [{v.state.value}]: {v.detail}")
    return 0 if res.ok else 1


def _dashboard(setup, say) -> int:
    from tui.app import NodedeckApp  # lazy: Textual loads only when the dashboard opens
    from tui.live import LiveSource  # lazy: Textual loads only when the dashboard opens

    source = LiveSource(config_path=setup.config, node="local", plan_path=setup.plan,
                        plan_vars=setup.plan_vars, auto=True)
    try:
        NodedeckApp(source, refresh_s=1.0).run()
    finally:
        sched = source.scheduler
        finished = sched is not None and all(v.state.terminal for v in sched.views() if v.kind is StageKind.JOB)
        if finished and sched is not None:
            demo.stop_servers(sched, say=say)
        if sched is not None:
            for line in closing_lines(sched):
                say(line)
        source.close()
    if not finished:
        say(f"the demo's stages go on in tmux; `{CliContext().command('demo', '--work', str(setup.work))}` shows them "
            "again")
    say(f"demo outputs are in {setup.work}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the bundled demo pipeline on this machine (CPU, tiny model)")
    p.add_argument("--headless", action="store_true", help="no dashboard; exit 0 only if every stage verified")
    p.add_argument("--work", default="demo-work", metavar="DIR", help="work dir of the demo (default ./demo-work)")
    p.add_argument("--fresh", action="store_true",
                   help="delete the earlier demo in --work and start over (default: resume it, keeping what verified)")
    p.add_argument("--engine", default="auto", choices=["auto", "standin", "vllm"],
                   help="what serves the target and the drafter: vllm (real vLLM, its own venv), standin "
                        "(nodedeck-train serve), auto (default: vllm when one is found, else standin)")
    p.add_argument("--engine-python", metavar="PATH",
                   help="vLLM's Python (default $NODEDECK_VLLM_PYTHON, else the checkout's .venv-vllm)")
    json_flag(p, "the final stage states and the outcome as JSON (runs headless)")
    p.set_defaults(func=cmd_demo)
