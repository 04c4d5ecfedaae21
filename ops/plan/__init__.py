"""The plan language: a TOML plan's schema, parser, records, `${var}` resolution and `plan check`; nothing here
runs a stage (that is ops.run, which reads plans through this package, never the other way round)."""
