#!/usr/bin/env bash
# Runs the command README.md gives a new user, read straight out of README (so they stay true).
# Usage: readme_step.sh install|test  -> the line after '<!-- ci:install -->' / '<!-- ci:test -->'.
set -euo pipefail
cmd=$(awk -v tag="<!-- ci:$1 -->" 'found && /^[^`]/ {print; exit} $0 == tag {found=1}' README.md)
[ -n "$cmd" ] || { echo "README.md has no command after <!-- ci:$1 -->" >&2; exit 1; }
echo "+ $cmd"
bash -euo pipefail -c "$cmd"
