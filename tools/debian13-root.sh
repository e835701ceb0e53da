#!/bin/bash
# Test the project on the lab's Python (CPython 3.13) before a change lands: build (once) or reuse a Debian 13
# (trixie) root made with debootstrap, clone the current checkout's committed HEAD into it, and run
# `make PYTHON=python3.13 TARGET...` there (default target: test). See docs/environment.md.
#
#   sudo tools/debian13-root.sh            # make test on CPython 3.13
#   sudo tools/debian13-root.sh run ARGS="--specimen standin"
#
# Runs as root (debootstrap, mount and chroot need it). Environment:
#   INFERLAB_DEBIAN13_ROOT   where the root lives (default: .debian13-root beside the project folder; never
#                            inside the project)
#   INFERLAB_DEBIAN_MIRROR   the Debian mirror (default http://deb.debian.org/debian)
# The root keeps pip's cache (/var/cache/inferlab-pip) and the clone's .venv between runs, so a second run
# downloads nothing (pip's cache alone does not do that where the registry's answers are not cacheable). The root gets a /dev of
# its own (a tmpfs with the few nodes a Python needs), never the host's; everything mounted is unmounted on exit,
# Ctrl-C included.
set -euo pipefail

say() { printf 'debian13-root: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

PROJECT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
ROOT=${INFERLAB_DEBIAN13_ROOT:-$(dirname "$PROJECT")/.debian13-root}
MIRROR=${INFERLAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3.13,python3.13-venv,python3-pip,ca-certificates,make,git
READY=.inferlab-debian13-ready      # written last by a completed debootstrap
CLONE=/work/inferlab                # the checkout's clone, inside the root
PIP_CACHE=/var/cache/inferlab-pip   # pip's cache, inside the root (kept between runs)
REFERENCE_IN_ROOT=/work/pythia-reference

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot); you are uid $(id -u)"
ROOT_ABS=$(realpath -m "$ROOT")
case "$ROOT_ABS/" in
    "$PROJECT"/*) die "the root $ROOT_ABS is inside the project $PROJECT; choose INFERLAB_DEBIAN13_ROOT outside it" ;;
esac
ROOT=$ROOT_ABS
git -C "$PROJECT" rev-parse --verify -q HEAD >/dev/null || die "$PROJECT has no commit to clone"

# --- the root: built once, reused after --------------------------------------------------------------------------
if [ ! -e "$ROOT/$READY" ]; then
    command -v debootstrap >/dev/null || { say "installing debootstrap"; apt-get install -y debootstrap >&2 ||
        { apt-get update >&2 && apt-get install -y debootstrap >&2; }; }
    PARTIAL="$ROOT.partial"
    if [ -e "$PARTIAL" ] && [ ! -e "$PARTIAL/.inferlab-debian13-partial" ]; then
        die "$PARTIAL exists and was not made by this script; remove it or choose another INFERLAB_DEBIAN13_ROOT"
    fi
    [ ! -e "$ROOT" ] || die "$ROOT exists but has no $READY: not a root this script finished; remove it first"
    rm -rf "$PARTIAL"
    mkdir -p "$PARTIAL" && touch "$PARTIAL/.inferlab-debian13-partial"
    say "building a Debian 13 root in $ROOT (debootstrap, a few minutes)"
    debootstrap --variant=minbase --include="$PACKAGES" trixie "$PARTIAL" "$MIRROR" >&2
    rm -f "$PARTIAL/.inferlab-debian13-partial"
    touch "$PARTIAL/$READY"
    mv "$PARTIAL" "$ROOT"
fi
PYVER=$(chroot "$ROOT" python3.13 -c 'import platform; print(platform.python_version())') ||
    die "the root $ROOT has no working python3.13"
say "reusing $ROOT (CPython $PYVER)"

# --- mounts, all undone on exit ----------------------------------------------------------------------------------
MOUNTED=()
cleanup() {
    local i
    for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do
        umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" ||
            say "could not unmount ${MOUNTED[i]}: unmount it by hand"
    done
    MOUNTED=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mnt() { # mnt TARGET mount-args...: mount, and remember it for cleanup
    local target=$1; shift
    mkdir -p "$target"
    mountpoint -q "$target" && die "$target is already mounted (another run of this script?)"
    mount "$@" "$target"
    MOUNTED+=("$target")
}

mnt "$ROOT/proc" -t proc proc
# A /dev of the root's own: a tmpfs with only the nodes a Python and pip need.
mnt "$ROOT/dev" -t tmpfs -o mode=0755,nosuid,size=64k inferlab-dev
mknod -m 666 "$ROOT/dev/null" c 1 3
mknod -m 666 "$ROOT/dev/zero" c 1 5
mknod -m 666 "$ROOT/dev/full" c 1 7
mknod -m 666 "$ROOT/dev/random" c 1 8
mknod -m 666 "$ROOT/dev/urandom" c 1 9
mknod -m 666 "$ROOT/dev/tty" c 5 0
mnt "$ROOT/dev/pts" -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts
ln -s pts/ptmx "$ROOT/dev/ptmx"
mnt "$ROOT/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev inferlab-shm
ln -s /proc/self/fd "$ROOT/dev/fd"
ln -s /proc/self/fd/0 "$ROOT/dev/stdin"
ln -s /proc/self/fd/1 "$ROOT/dev/stdout"
ln -s /proc/self/fd/2 "$ROOT/dev/stderr"

# --- the host's network and pip settings, so pip in the root reaches the same registries --------------------------
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
bring_path() { # bring_path PATH: a file is copied to the same path in the root; a folder is bound there read-only
    local path=${1#file://}
    case "$path" in /*) ;; *) return 0 ;; esac
    [ -e "$path" ] || return 0
    case "$path" in /|/proc|/proc/*|/dev|/dev/*|/sys|/sys/*) return 0 ;; esac
    if [ -d "$path" ]; then
        mountpoint -q "$ROOT$path" && return 0
        mnt "$ROOT$path" --bind "$path"
        mount -o remount,bind,ro "$ROOT$path"
    else
        mkdir -p "$(dirname "$ROOT$path")"
        cp -L "$path" "$ROOT$path"
    fi
}
PIP_ENV=()
while IFS= read -r name; do
    PIP_ENV+=("$name=${!name}")
    for word in ${!name}; do bring_path "$word"; done
done < <(compgen -e | grep -E '^PIP_' | grep -v -E '^PIP_(CACHE_DIR|NO_CACHE_DIR)$' || true)
for conf in /etc/pip.conf /etc/xdg/pip/pip.conf; do
    [ -f "$conf" ] || continue
    bring_path "$conf"
    # every path a setting names (cert, constraint, find-links, a file:// index...)
    while IFS= read -r word; do bring_path "$word"; done < <(
        sed -n 's/^[^#;[][^=]*=[[:space:]]*//p' "$conf" | tr ' \t' '\n\n' | grep -E '^(/|file://)' || true)
done
[ -d /etc/xdg/pip ] && bring_path /etc/xdg/pip
for bundle in /etc/ssl/certs/ca-certificates.crt ${SSL_CERT_FILE:-} ${REQUESTS_CA_BUNDLE:-}; do
    bring_path "$bundle"
done

# --- the checkout's committed HEAD, cloned afresh ----------------------------------------------------------------
COMMIT=$(git -C "$PROJECT" rev-parse HEAD)
git -C "$PROJECT" diff --quiet HEAD 2>/dev/null ||
    say "note: uncommitted changes in $PROJECT are not tested; the root tests commit $COMMIT"
# The clone's .venv is kept (always at the same path in the root, so its editable install stays valid): the fresh
# clone's files are newer than its stamp, so make runs its install rule again, which installs the new lock into it and
# downloads only what changed. INFERLAB_DEBIAN13_FRESH_VENV=1 starts from an empty venv instead.
KEPT_VENV=/var/cache/inferlab-venv
rm -rf "$ROOT$KEPT_VENV"
if [ -d "$ROOT$CLONE/.venv" ] && [ "${INFERLAB_DEBIAN13_FRESH_VENV:-0}" != 1 ]; then
    mv "$ROOT$CLONE/.venv" "$ROOT$KEPT_VENV"
fi
rm -rf "$ROOT$CLONE"
mkdir -p "$(dirname "$ROOT$CLONE")" "$ROOT$PIP_CACHE"
git clone -q --no-hardlinks "$PROJECT" "$ROOT$CLONE"
git -C "$ROOT$CLONE" checkout -q --detach "$COMMIT"
[ ! -d "$ROOT$KEPT_VENV" ] || mv "$ROOT$KEPT_VENV" "$ROOT$CLONE/.venv"

# The replica specimen's published reference files, where the host has them (read-only).
REF_ENV=()
REFERENCE=${INFERLAB_PYTHIA_REFERENCE:-$(dirname "$PROJECT")/shared/reference/pythia-14m}
if [ -d "$REFERENCE" ]; then
    mnt "$ROOT$REFERENCE_IN_ROOT" --bind "$REFERENCE"
    mount -o remount,bind,ro "$ROOT$REFERENCE_IN_ROOT"
    REF_ENV=("INFERLAB_PYTHIA_REFERENCE=$REFERENCE_IN_ROOT")
fi

[ $# -gt 0 ] || set -- test
say "make PYTHON=python3.13 $* in $ROOT$CLONE (commit ${COMMIT:0:12}, CPython $PYVER)"
set +e
chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PIP_CACHE_DIR="$PIP_CACHE" "${PIP_ENV[@]}" "${REF_ENV[@]}" \
    /bin/sh -c 'cd "$1" && shift && exec make PYTHON=python3.13 "$@"' sh "$CLONE" "$@"
status=$?
set -e
say "make exited with $status"
exit "$status"
