#!/usr/bin/env bash
# Makes sure the build tools exist: a Rust toolchain with rustfmt and clippy, and a
# C toolchain for the bundled librdkafka with OpenSSL and zlib headers. Installs what is missing; no-op otherwise.
set -euo pipefail
say() { printf '[toolchain] %s\n' "$*" >&2; }
# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v make >/dev/null || need_apt+=(make)
command -v perl >/dev/null || need_apt+=(perl)
command -v curl >/dev/null || need_apt+=(curl)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# librdkafka's TLS (SSL, SASL SCRAM) links the system's OpenSSL.
[[ -f /usr/include/openssl/ssl.h ]] || need_apt+=(libssl-dev)
[[ -f /usr/include/zlib.h ]] || need_apt+=(zlib1g-dev)
# The tests make certificates for the TLS broker and PostgreSQL.
command -v openssl >/dev/null || need_apt+=(openssl)
if ((${#need_apt[@]})); then
  [[ $(id -u) -eq 0 ]] || { say "missing ${need_apt[*]}: install them"; exit 1; }
  say "installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if ! command -v cargo >/dev/null; then
  say "cargo not found: install Rust with rustup (https://rustup.rs), then re-run"
  exit 1
fi
if command -v rustup >/dev/null; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
