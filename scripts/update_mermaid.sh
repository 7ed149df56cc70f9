#!/usr/bin/env sh
# Refresh the mermaid bundle the course site ships (docs/assets/javascripts/mermaid.min.js), so that
# sequence diagrams render in a classroom with no internet. mkdocs-material would otherwise load
# mermaid from a CDN. Needs npm (the registry) once; the site then works offline.
#   sh scripts/update_mermaid.sh 11.17.2
set -eu
VERSION="${1:?usage: update_mermaid.sh VERSION (mkdocs-material 9.x expects mermaid 11)}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "mermaid@$VERSION" >/dev/null && tar xzf mermaid-*.tgz)
cp "$WORK/package/dist/mermaid.min.js" "$ROOT/docs/assets/javascripts/mermaid.min.js"
cp "$WORK/package/LICENSE" "$ROOT/docs/assets/javascripts/mermaid.LICENSE.txt"
echo "mermaid $VERSION copied into docs/assets/javascripts/"
