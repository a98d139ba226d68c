#!/bin/bash
# Open MPI's rsh agent between the VMs of tests/vm/suites/fabric.sh:
# `fabric_rsh.sh HOST COMMAND...` runs COMMAND on HOST through
# tests/vm/fabric_rshd.py (port FAB_RSH_PORT, 2222), as ssh would: the words
# joined by spaces, parsed by the remote shell; its output comes back here.
# The command goes as one line of base64, so a command of several lines
# (a here-document) arrives whole however TCP splits it.
host=${1:?usage: fabric_rsh.sh HOST COMMAND...}
shift
exec 3<>"/dev/tcp/$host/${FAB_RSH_PORT:-2222}" || exit 255
printf '%s\n' "$(printf '%s' "$*" | base64 -w0)" >&3
cat <&3
