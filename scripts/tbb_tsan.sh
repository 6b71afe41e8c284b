#!/usr/bin/env bash
# Builds oneTBB with ThreadSanitizer into PREFIX, from the Debian source of the installed
# libtbb-dev version (apt-get source, with a private source list: the system's apt configuration
# is left alone). ThreadSanitizer only sees the synchronisation of instrumented code: with
# Debian's uninstrumented libtbb, every task TBB hands to a worker thread is reported as a race
# inside TBB's own headers (blocked_range, start_for), and no suppression can silence those
# without hiding races in the tasks' bodies too. scripts/sanitize.sh thread links against this.
#
#   scripts/tbb_tsan.sh PREFIX
set -euo pipefail
prefix=${1:?usage: scripts/tbb_tsan.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
work=$(mktemp -d /tmp/edbatch-tbb-tsan.XXXXXX)
trap 'rm -rf "$work"' EXIT

version=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
. /etc/os-release
cat > "$work/sources.list" <<EOF
deb-src http://deb.debian.org/debian $VERSION_CODENAME main
deb-src http://deb.debian.org/debian $VERSION_CODENAME-updates main
deb-src http://deb.debian.org/debian-security $VERSION_CODENAME-security main
EOF
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
apt-get "${apt_opts[@]}" update -qq 2> /dev/null
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only "onetbb=$version") > /dev/null 2>&1 ||
  { echo "tbb_tsan.sh: cannot download the source of onetbb $version" >&2; exit 1; }
tar -xf "$work"/src/onetbb_*.orig.tar.* -C "$work/src"
src=$(find "$work/src" -maxdepth 1 -type d -name 'oneTBB*' | head -1)
# GCC warns that TSan does not model TBB's atomic_thread_fence (-Wtsan); the log keeps that.
{ cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTBB_SANITIZE=thread \
    -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF \
    -DCMAKE_INSTALL_PREFIX="$prefix" &&
  cmake --build "$work/build" -j "$(nproc)" --target install; } > "$prefix/build.log" 2>&1 ||
  { tail -30 "$prefix/build.log" >&2; exit 1; }
echo "tbb_tsan.sh: oneTBB $version with ThreadSanitizer in $prefix" >&2
