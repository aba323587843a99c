"""python3 -m vt3lab: the `vt3` command (vt3lab.cli) as run-vm.sh runs it
after building everything."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="./run-vm.sh"))
