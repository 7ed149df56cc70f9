from kinetic.cli import entry

entry()
