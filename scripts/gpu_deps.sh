# Sourced by the GPU scripts from the repository root: a GPU machine may lack TBB, fmt or
# nlohmann-json, so Debian packages placed in .deb/ (apt-get download libtbb-dev libtbb12
# libtbbmalloc2 libtbbbind-2-5 libfmt-dev libfmt9 nlohmann-json3-dev) are unpacked into a private
# prefix and put on CMake's and the loader's search paths.
if ls .deb/*.deb > /dev/null 2>&1; then
  prefix=/tmp/edbatch-prefix
  mkdir -p "$prefix"
  for f in .deb/*.deb; do dpkg -x "$f" "$prefix"; done
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
