"""The `fthsdp` command line: thin click commands over the `slurm`, `prolog_epilog` and
`runtime` libraries. Subcommands load lazily so `fthsdp --help` never imports torch."""
