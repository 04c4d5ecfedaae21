"""Making a node ready to run plans: `nodedeck node setup NODE` (ops.setup.steps), the wheel of the
running nodedeck it installs there (ops.setup.wheel), and the trainer it records (ops.setup.record)."""
