#!/usr/bin/env bash
# Installs the Debian packages megascope builds and tests with, when any is missing.
# Runs as root on a fresh machine (CI); elsewhere it only reports what is missing.
set -euo pipefail
pkgs=(cmake ninja-build gcc make pkg-config clang llvm libbpf-dev libelf-dev zlib1g-dev
      libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev prometheus curl python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: not root; install these packages: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
