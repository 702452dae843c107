#!/usr/bin/env bash
# Unpacks Debian packages of one architecture and suite into a folder, for the aarch64 wheel's build and its
# check under emulation (docs/contributing/building.md):
#
#   scripts/debian_sysroot.sh [--no-deps] ARCH SUITE DEST PACKAGE...
#
# apt-get fetches them from Debian's archive through a private configuration under DEST.apt (its own
# sources, lists and an empty dpkg status), so the machine's apt setup, package lists and installed packages
# are left alone and no architecture is added to dpkg; the archive is verified with the machine's Debian
# keyring. The packages and, unless --no-deps, everything they depend on (resolved as for a system that has
# nothing installed) are unpacked with dpkg-deb -x into DEST; no maintainer script runs. DEBIAN_MIRROR
# replaces http://deb.debian.org/debian.
#
# DEST is made anew unless it already holds exactly these packages (DEST/.packages lists what was asked).
set -euo pipefail
deps=1
if [ "${1:-}" = --no-deps ]; then deps=0; shift; fi
[ $# -ge 4 ] || { echo "usage: $0 [--no-deps] ARCH SUITE DEST PACKAGE..." >&2; exit 2; }
arch=$1 suite=$2 dest=$(realpath -m "$3")
shift 3
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
want="$arch $suite deps=$deps $* $mirror"
if [ -f "$dest/.packages" ] && [ "$(cat "$dest/.packages")" = "$want" ]; then
    exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    { echo "$0: needs apt-get and dpkg-deb (a Debian-like machine)" >&2; exit 1; }
[ -f "$keyring" ] || { echo "$0: no $keyring (apt-get install debian-archive-keyring)" >&2; exit 1; }

apt=$dest.apt
rm -rf "$dest" "$apt"
mkdir -p "$apt/etc/apt/apt.conf.d" "$apt/etc/apt/preferences.d" "$apt/etc/apt/sources.list.d" \
    "$apt/var/lib/apt/lists/partial" "$apt/var/cache/apt/archives/partial" "$apt/var/lib/dpkg"
: >"$apt/var/lib/dpkg/status"
echo "deb [arch=$arch signed-by=$keyring] $mirror $suite main" >"$apt/etc/apt/sources.list"
# APT_CONFIG is read instead of /etc/apt/apt.conf, and its Dir makes every other path private too (the
# configuration parts, trusted.gpg.d, the lists, the cache and the dpkg status).
cat >"$apt/apt.conf" <<EOF
Dir "$apt/";
Dir::State::status "$apt/var/lib/dpkg/status";
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
APT::Install-Recommends "false";
APT::Sandbox::User "root";
Debug::NoLocking "true";
Acquire::Languages "none";
EOF
export APT_CONFIG=$apt/apt.conf
apt-get -q update >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; exit 1; }
if [ $deps = 1 ]; then
    apt-get -q -y --download-only install "$@" >"$apt/fetch.log" 2>&1 || { cat "$apt/fetch.log" >&2; exit 1; }
    debs=("$apt"/var/cache/apt/archives/*.deb)
else
    (cd "$apt/var/cache/apt/archives" && apt-get -q download "$@") >"$apt/fetch.log" 2>&1 ||
        { cat "$apt/fetch.log" >&2; exit 1; }
    debs=("$apt"/var/cache/apt/archives/*.deb)
fi
mkdir -p "$dest"
for deb in "${debs[@]}"; do
    dpkg-deb -x "$deb" "$dest"
done
rm -f "${debs[@]}"
# Suites with a merged /usr (Debian 13 on) ship /lib and /bin only as links that no package holds; the
# dynamic loader's path in every program (/lib/ld-linux-aarch64.so.1) goes through them.
for d in bin lib sbin; do
    if [ ! -e "$dest/$d" ] && [ -d "$dest/usr/$d" ]; then
        ln -s "usr/$d" "$dest/$d"
    fi
done
echo "$want" >"$dest/.packages"
echo "$0: ${#debs[@]} $arch packages of $suite in $dest"
