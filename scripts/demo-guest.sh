#!/bin/sh
# Runs inside the VM: what an operator does to hand a NIC to ufab and back.
set -e
UFAB=${1:?usage: demo-guest.sh PATH-TO-UFAB}
step() { printf '\n$ %s\n' "$*"; "$@"; }

step modprobe vfio-pci
step "$UFAB" list
nic=$("$UFAB" list --json | jq -r '[.devices[] | select(.vendor_id == "8086")][0].address')
step "$UFAB" doctor "$nic" || true
step "$UFAB" bind "$nic"
step "$UFAB" info "$nic"
step "$UFAB" list
step "$UFAB" unbind "$nic"
step "$UFAB" list
