from flowrl.cli import entry

entry()
