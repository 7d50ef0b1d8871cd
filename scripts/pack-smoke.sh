#!/usr/bin/env bash
# Owns the GPU smoke check's travel pack: one archive with everything scripts/gpu-smoke.sh needs on
# a GPU machine that has no sources, no npm and no network: the service built afresh (dist/), its
# production dependencies (node_modules/ without the dev ones), scripts/ and package.json, and,
# with --with-node, the Node binary of the image's major (scripts/image-node.sh), which
# gpu-smoke.sh then runs when the machine has none. The archive is a .tar.xz, which python3 can
# unpack where xz is missing: python3 -m tarfile -e FILE DIR.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/pack-smoke.sh [--with-node] [FILE]

Builds the service and writes FILE (default: .smoke-pack/nodecompute-smoke.tar.xz), holding the
folder nodecompute-smoke/ with dist/, node_modules/ (production dependencies only), scripts/,
package.json and package-lock.json. On the GPU machine:

  tar xJf nodecompute-smoke.tar.xz     (or: python3 -m tarfile -e nodecompute-smoke.tar.xz .)
  nodecompute-smoke/scripts/gpu-smoke.sh --record

  --with-node  also pack the Node binary of the image's major (node/bin/node, about 30 MB more),
               for a machine without Node >= 20; gpu-smoke.sh uses it when NODE is not set
  -h, --help   this text
EOF
}

ROOT=$(CDPATH='' cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WITH_NODE=0
FILE=''
while [ $# -gt 0 ]; do
  case "$1" in
    --with-node) WITH_NODE=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*)
      echo "pack-smoke: unknown option \"$1\"" >&2
      usage >&2
      exit 2
      ;;
    *)
      if [ -n "$FILE" ]; then
        echo "pack-smoke: one archive at a time (got \"$FILE\" and \"$1\")" >&2
        exit 2
      fi
      FILE=$1
      ;;
  esac
  shift
done
FILE=${FILE:-$ROOT/.smoke-pack/nodecompute-smoke.tar.xz}
case "$FILE" in
  *.tar.xz) ;;
  *)
    echo "pack-smoke: \"$FILE\" must end in .tar.xz (the archive is xz-compressed)" >&2
    exit 2
    ;;
esac
mkdir -p "$(dirname "$FILE")"
FILE=$(CDPATH='' cd -- "$(dirname "$FILE")" && pwd)/$(basename "$FILE")

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/nodecompute-pack.XXXXXX")
trap 'rm -rf "$STAGE" "$FILE.tmp"' EXIT
PACK=$STAGE/nodecompute-smoke
mkdir -p "$PACK"

cd "$ROOT"
# Built into the pack, not into dist/: a build that rewrites dist/ would pull files from under a
# service or a test running from it.
echo "pack-smoke: building the service" >&2
node_modules/.bin/tsc -p tsconfig.json --outDir "$PACK/dist"
cp -R scripts package.json package-lock.json "$PACK/"
echo "pack-smoke: installing the production dependencies (from npm's cache when it has them)" >&2
(cd "$PACK" && npm ci --omit=dev --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error >&2)

if [ "$WITH_NODE" = 1 ]; then
  node_bin=$(bash scripts/image-node.sh sh -c 'command -v node')
  mkdir -p "$PACK/node/bin"
  cp "$node_bin" "$PACK/node/bin/node"
  echo "pack-smoke: packed Node $("$PACK/node/bin/node" --version) from $node_bin" >&2
fi

tar -C "$STAGE" --owner=0 --group=0 --numeric-owner -cJf "$FILE.tmp" nodecompute-smoke
mv "$FILE.tmp" "$FILE"
echo "pack-smoke: wrote $FILE ($(($(wc -c <"$FILE") / 1024 / 1024)) MiB)" >&2
echo "$FILE"
