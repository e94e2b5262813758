"""A run's report: one self-contained HTML file (and optionally a PNG) of what the run did.

`read` reads the run directory (progress files, journal, jobs.json; never Slurm), `timeline`
derives the lanes, faults, step rate and effective time from those records (pure), `html` and
`png` draw them. `fthsdp report RUN_DIR` (`fthsdp_cli.commands.report`) writes the files.
"""
