#!/usr/bin/env bash
# `make image-test`: runs the built image's own filesystem, user, working directory,
# environment, entrypoint and HEALTHCHECK without a container runtime (this project's build
# machines have no container engine that can start containers: crun needs a cgroup setup
# they lack), so: the container's root filesystem from `podman mount`, entered with
# `chroot --userspec` as the image's user. Then: the healthcheck passes, a photo is
# detected over HTTP, SIGTERM stops the server cleanly. What this does not test: the
# namespaces and cgroups a real runtime adds (network isolation, published ports).
# Settings (env): IMAGE (default localhost/peregrine:<version>), STORAGE_DRIVER (vfs),
# EXTRA_ENV (space-separated NAME=value pairs added to the image's environment, e.g.
# PEREGRINE_PROVIDER_FALLBACK=true for the GPU image on a machine without a GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
image=${IMAGE:-localhost/peregrine:$version}
storage=(--storage-driver "${STORAGE_DRIVER:-vfs}")
photo=../shared/images/bus.jpg
fail() { echo "image-test: FAILED: $*" >&2; exit 1; }

config=$(podman "${storage[@]}" image inspect "$image" | jq '.[0]')
user=$(jq -r '.Config.User' <<<"$config")
workdir=$(jq -r '.Config.WorkingDir' <<<"$config")
mapfile -t command < <(jq -r '(.Config.Entrypoint // []) + (.Config.Cmd // []) | .[]' <<<"$config")
mapfile -t env < <(jq -r '.Config.Env[]' <<<"$config")
[ "$(jq -r '.Healthcheck.Test[0]' <<<"$config")" = CMD-SHELL ] || fail "the image has no HEALTHCHECK"
healthcheck=$(jq -r '.Healthcheck.Test[1]' <<<"$config")
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || fail "the image runs as root ($user)"

# Free ports on this machine's network: the chroot shares it.
read -r port grpc_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

container=$(podman "${storage[@]}" create --no-healthcheck "$image")
rootfs=$(podman "${storage[@]}" mount "$container")
log=$(mktemp)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    umount "$rootfs/proc" 2>/dev/null || true
    umount -R "$rootfs/dev" 2>/dev/null || true
    # Removing the container deletes its files: never while the machine's /dev is bound in.
    if mountpoint -q "$rootfs/dev" || mountpoint -q "$rootfs/proc"; then
        echo "image-test: $rootfs still has mounts; container $container left in place" >&2
    else
        podman "${storage[@]}" umount "$container" >/dev/null || true
        podman "${storage[@]}" rm "$container" >/dev/null || true
    fi
    rm -f "$log"
}
trap cleanup EXIT
mount -t proc proc "$rootfs/proc"
mount --rbind /dev "$rootfs/dev"
# Slave, so that unmounting the copy's submounts (/dev/shm, /dev/pts) leaves the machine's.
mount --make-rslave "$rootfs/dev"

# PEREGRINE_ALLOW_ANONYMOUS: no API keys in this test (a non-loopback host without keys
# refuses to start otherwise).
in_image=(chroot --userspec="$user" "$rootfs" /usr/bin/env -i "${env[@]}"
    PEREGRINE_PORT="$port" PEREGRINE_GRPC_PORT="$grpc_port" PEREGRINE_ALLOW_ANONYMOUS=true
    ${EXTRA_ENV:-}
    /bin/sh -c 'cd "$1" && shift && exec "$@"' sh "$workdir")
# Started directly (not through a function, which would fork a subshell) so that $! is the
# server itself once chroot, env and sh have exec'd.
"${in_image[@]}" "${command[@]}" >"$log" 2>&1 &
pid=$!
echo "image-test: $image as $user, ${command[*]} on port $port (pid $pid)" >&2

# The image's own healthcheck, polled for up to 60 s.
ready=
for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "the server exited"; }
    if "${in_image[@]}" /bin/sh -c "$healthcheck" 2>/dev/null; then ready=1; break; fi
    sleep 0.5
done
[ -n "$ready" ] || { cat "$log" >&2; fail "the healthcheck never passed"; }
[ "$(stat -c %u "/proc/$pid")" = "${user%%:*}" ] || fail "the server does not run as $user"

detections=$(curl -fsS --data-binary @"$photo" -H 'content-type: image/jpeg' \
    "http://127.0.0.1:$port/v1/detect")
jq -e '[.detections[].class_name] | index("bus") != null' <<<"$detections" >/dev/null \
    || fail "no bus detected in $photo: $detections"
echo "image-test: detected $(jq -r '[.detections[].class_name] | join(", ")' <<<"$detections")" >&2

kill -TERM "$pid"
status=
for _ in $(seq 1 60); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid" && status=0 || status=$?; break; fi
    sleep 0.5
done
pid_left=$pid
pid=
[ -n "$status" ] || { pid=$pid_left; fail "the server did not stop within 30 s of SIGTERM"; }
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "the server exited with $status after SIGTERM"; }
echo "image-test: passed (healthcheck, detection, clean stop)" >&2
