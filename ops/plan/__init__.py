"""Pipeline plans: TOML stages with dependencies, verify checks, and the scheduler that runs them."""
