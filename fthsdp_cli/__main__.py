from fthsdp_cli.main import cli

cli(prog_name="fthsdp")
