"""One module per command family; loaded lazily by `fthsdp_cli.main.LazyGroup`."""
