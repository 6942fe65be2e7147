#!/usr/bin/env bash
# Installs the Debian packages named as arguments (ci/test.sh's install step; sudo when not root), waiting for
# another apt-get or unattended-upgrades to let go of apt's locks instead of failing at once, and trying a failed
# install a second time (a download that broke off).
#
# A fresh cloud machine often runs unattended upgrades at boot. apt 2.6 (measured, a held lock each time):
# `apt-get install -o DPkg::Lock::Timeout=S` waits up to S seconds for dpkg's lock; `apt-get update` takes the
# package lists' lock and fails at once whatever that option says, so it is tried again every few seconds, up to
# the same limit, while its answer is apt's "Could not get lock". KVBENCH_APT_LOCK_TIMEOUT sets the limit (s).
set -euo pipefail
lock_timeout="${KVBENCH_APT_LOCK_TIMEOUT:-600}"
as_root=()
[[ $(id -u) -eq 0 ]] || as_root=(sudo)
apt_get() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$lock_timeout" "$@"
}

update_lists() {  # apt-get update, waiting while another apt holds the lists' lock
    local deadline=$((SECONDS + lock_timeout)) answer
    until answer="$(apt_get update -qq 2>&1)"; do
        if [[ $answer != *"Could not get lock"* ]] || ((SECONDS >= deadline)); then
            printf '%s\n' "$answer" >&2
            return 1
        fi
        echo "ci/debian.sh: apt's package lists are locked by another apt; waiting (up to ${lock_timeout} s)"
        sleep 5
    done
}

install_packages() {
    update_lists && apt_get install -y -qq "$@" >/dev/null
}

if ! install_packages "$@"; then
    echo "ci/debian.sh: installing $* failed; trying once more"
    install_packages "$@"
fi
