"""The `nodedeck` command line: each cmd_*.py module adds its subcommands."""
