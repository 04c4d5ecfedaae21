"""The run engine: the scheduler that starts a plan's stages on their nodes, looks at them each tick, judges
and records their runs, and what the dashboard and the CLI read of them (plans themselves: ops.plan)."""
