#!/bin/sh
# Fetch ONNX Runtime's C/C++ headers (Debian trixie's libonnxruntime-dev) into a cache directory,
# using private apt directories: the system's apt configuration is never read for sources nor
# changed. Prints the include directory on success.
set -eu
C="${1:?usage: fetch_ort_headers.sh CACHE_DIR}"
INC="$C/ort/usr/include/onnxruntime"
if [ -f "$INC/onnxruntime_cxx_api.h" ]; then echo "$INC"; exit 0; fi
mkdir -p "$C/lists/partial" "$C/cache/archives/partial"
URI=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$URI" ] || URI=http://deb.debian.org/debian
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $URI trixie main" > "$C/sources.list"
O="-o Dir::Etc::sourcelist=$C/sources.list -o Dir::Etc::sourceparts=/dev/null -o Dir::State::Lists=$C/lists -o Dir::Cache=$C/cache -o APT::Sandbox::User=root"
# shellcheck disable=SC2086
apt-get $O -qq update >&2
# shellcheck disable=SC2086
(cd "$C" && apt-get $O -qq download libonnxruntime-dev >&2)
dpkg-deb -x "$C"/libonnxruntime-dev_*.deb "$C/ort"
[ -f "$INC/onnxruntime_cxx_api.h" ]
echo "$INC"
