#!/usr/bin/env bash
# Makes sure the Python venv .stack/<name>-venv exists with exactly the pinned
# packages given, installing from PyPI what is missing; a no-op when the same pins
# are already installed (a marker file records them).
#   bash compose/ensure-venv.sh airflow "apache-airflow==3.1.8"
set -euo pipefail
say() { printf '[venv] %s\n' "$*" >&2; }
[[ $# -ge 2 ]] || { say "usage: ensure-venv.sh NAME PACKAGE==VERSION..."; exit 2; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="$1"; shift
venv="$HERE/../.stack/$name-venv"
marker="$venv/.sluice-pins"
want="$(printf '%s\n' "$@")"
if [[ -f $marker && "$(cat "$marker")" == "$want" ]]; then
  exit 0
fi
command -v python3 >/dev/null || { say "python3 not found: install Python 3.11"; exit 1; }
say "creating $name venv with $* (from PyPI; about a minute)"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! python3 -m venv "$venv" 2>/dev/null; then
  # Debian's python3 without ensurepip: the venv package brings it.
  [[ $(id -u) -eq 0 ]] || { say "python3 -m venv failed: install python3-venv"; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check "$@"
printf '%s\n' "$want" >"$marker"
say "$name venv ready: $venv"
