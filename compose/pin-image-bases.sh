#!/usr/bin/env bash
# Pins compose/Dockerfile's two base images by digest: resolves each tag's
# current multi-platform index digest from its registry and rewrites the ARG
# default to tag@sha256:…. Run it where a registry is reachable (a laptop, CI)
# when updating the bases; review and commit the change.
#   bash compose/pin-image-bases.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
file="$HERE/Dockerfile"
digest_of() {
  if command -v crane >/dev/null; then
    crane digest "$1"
  else
    docker buildx imagetools inspect "$1" --format '{{json .Manifest.Digest}}' | tr -d '"'
  fi
}
for arg in BUILD_IMAGE RUNTIME_IMAGE; do
  ref="$(sed -n "s/^ARG $arg=//p" "$file")"
  tag="${ref%@*}"
  digest="$(digest_of "$tag")"
  [[ $digest == sha256:* ]] || { echo "no digest for $tag: $digest" >&2; exit 1; }
  sed -i "s|^ARG $arg=.*|ARG $arg=$tag@$digest|" "$file"
  echo "$arg=$tag@$digest"
done
