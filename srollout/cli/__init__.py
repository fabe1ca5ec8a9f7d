"""The `srollout` command line: thin Typer modules, one per subcommand."""
