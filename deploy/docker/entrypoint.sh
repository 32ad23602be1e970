#!/bin/sh
# Entry point of the airgossip image: runs `airgossip "$@"`. For `agent`, it adds what a
# container knows and a replica of a service cannot be told one by one:
#
#   AIRGOSSIP_INDEX           --index: a number; `ordinal`, the number that ends the host
#                             name (a Kubernetes StatefulSet pod: airgossip-agent-3 -> 3);
#                             or `claim`, the lowest index no other container has claimed in
#                             the shared folder $AIRGOSSIP_CLAIMS (a compose volume), kept by
#                             this container across restarts
#   AIRGOSSIP_ADVERTISE_PORT  --advertise ADDRESS:PORT, ADDRESS being $AIRGOSSIP_ADVERTISE_HOST
#                             or this container's own address
#   AIRGOSSIP_CERTS           --certs: a folder of the whole fleet's certificates (ca.pem,
#                             agent-N.pem and agent-N.key for every N: a compose volume, a
#                             Kubernetes Secret); once the index N is known, ca.pem and
#                             agent-N's pair are copied to /tmp/airgossip-tls (this container's
#                             own, mode 0700; the health check dials with them) and --certs
#                             points there, so the agent process holds no other member's key
#
# Flags given on the command line come after these, so they win.
set -eu

claim() {
  dir="${AIRGOSSIP_CLAIMS:-/var/lib/airgossip/claims}"
  me="$(hostname)"
  i=0
  while [ "$i" -lt 4096 ]; do
    if mkdir "$dir/$i" 2>/dev/null; then
      echo "$me" > "$dir/$i/host"
      echo "$i"
      return
    fi
    owner="$(cat "$dir/$i/host" 2>/dev/null || true)"
    if [ "$owner" = "$me" ]; then
      echo "$i"
      return
    fi
    # A claim whose container no longer exists (a fleet brought down without removing the
    # volume) goes to the first container that asks; the lock names the old owner.
    if [ -n "$owner" ] && ! getent hosts "$owner" >/dev/null 2>&1 \
        && mkdir "$dir/$i/taken-from-$owner" 2>/dev/null; then
      echo "$me" > "$dir/$i/host"
      echo "$i"
      return
    fi
    i=$((i + 1))
  done
  echo "airgossip: no agent index left to claim in $dir" >&2
  exit 2
}

if [ "${1:-}" = "agent" ]; then
  shift
  case "${AIRGOSSIP_INDEX:-}" in
    "") index="" ;;
    ordinal) index="${HOSTNAME##*-}" ;;
    claim) index="$(claim)" ;;
    *) index="$AIRGOSSIP_INDEX" ;;
  esac
  case "$index" in
    *[!0-9]*)
      echo "airgossip: AIRGOSSIP_INDEX=${AIRGOSSIP_INDEX} gave '$index', not an index" >&2
      exit 2
      ;;
  esac
  if [ -n "${AIRGOSSIP_ADVERTISE_PORT:-}" ]; then
    host="${AIRGOSSIP_ADVERTISE_HOST:-$(hostname -i | cut -d' ' -f1)}"
    set -- --advertise "$host:$AIRGOSSIP_ADVERTISE_PORT" "$@"
  fi
  if [ -n "${AIRGOSSIP_CERTS:-}" ]; then
    if [ -z "$index" ]; then
      echo "airgossip: AIRGOSSIP_CERTS needs AIRGOSSIP_INDEX (whose certificate to use)" >&2
      exit 2
    fi
    tls=/tmp/airgossip-tls
    for file in ca.pem "agent-$index.pem" "agent-$index.key"; do
      if [ ! -r "$AIRGOSSIP_CERTS/$file" ]; then
        echo "airgossip: no $file in $AIRGOSSIP_CERTS (AIRGOSSIP_CERTS); issue agent-$index's" \
          "certificate there (airgossip certs issue agent-$index)" >&2
        exit 2
      fi
    done
    (umask 077 && rm -rf "$tls" && mkdir "$tls" \
      && cp "$AIRGOSSIP_CERTS/ca.pem" "$AIRGOSSIP_CERTS/agent-$index.pem" \
        "$AIRGOSSIP_CERTS/agent-$index.key" "$tls/")
    set -- --certs "$tls" "$@"
  fi
  if [ -n "$index" ]; then
    set -- --index "$index" "$@"
  fi
  set -- agent "$@"
fi
exec airgossip "$@"
