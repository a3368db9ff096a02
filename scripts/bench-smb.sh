#!/usr/bin/env bash
# SMB benchmark: a tarn share against the same smbd serving a plain
# directory on the same disk (the peer), in one run, through Samba's own
# client (smbclient) on loopback.
#
#   seq write   smbclient put of SIZE MiB, then the data made durable
#               (`tarn pool sync` / `sync FILE`), MiB/s
#   seq read    smbclient get of that file to /dev/null, cold (caches
#               dropped; tarn's block cache is emptied by re-importing), MiB/s
#   10k copy    smbclient mput of 10,000 files of 16 KiB in 10 folders, then
#               durable as above; files/s
#
# Each column is the median of PASSES passes (default 3) that alternate
# which side goes first; the ratio is tarn / plain. The pool is a raidz1 of
# four sparse files beside the plain directory (so both live on the same
# disk), dataset bench/fs with recordsize 1M and compression off. Needs
# root, samba, samba-vfs-modules, libnss-wrapper and smbclient. Not a test:
# nothing fails on a timing.
#
# Usage: scripts/bench-smb.sh [SIZE_MIB]   (default 1024)
# Env:   BENCH_DIR (where the temp dir goes; default the repo), PASSES
set -euo pipefail
size_mib=${1:-1024}
passes=${PASSES:-3}
# shellcheck source=bench-common.sh
source "$(dirname "$0")/bench-common.sh"
chmod 755 "$work"
for p in smbd smbclient; do
    command -v "$p" >/dev/null || { echo "bench-smb: needs $p (apt-get install samba smbclient)" >&2; exit 1; }
done

port=$((20000 + RANDOM % 40000))
plain=$work/plain
mkdir -p "$plain"
chown 1001:1001 "$plain"
printf '[plain]\n  path = %s\n  read only = no\n  valid users = alice\n' "$plain" > "$work/extra.conf"
"$tarn" daemon --state-dir "$work/state" --smb "127.0.0.1:$port" \
    --smb-include "$work/extra.conf" 2> "$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
devs=()
for i in 0 1 2 3; do truncate -s 8G "$work/d$i"; devs+=("$work/d$i"); done
"$tarn" pool create bench raidz1 "${devs[@]}" >/dev/null
"$tarn" dataset create -o recordsize=1M -o compression=off bench/fs >/dev/null
echo "bench-pass" | "$tarn" user add --password-stdin --smb --uid 1001 alice >/dev/null
"$tarn" share add fs bench/fs --smb alice=rw --owner alice >/dev/null

smb() { smbclient "//127.0.0.1/$1" -p "$port" -m SMB3 -U alice%bench-pass -c "$2" >/dev/null 2>&1; }
# Makes what was just written durable: the pool's txg, or the file/dir.
durable() {
    if [ "$1" = fs ]; then "$tarn" pool sync bench >/dev/null; else sync -f "$plain"; fi
}
# Empties every cache between a write and a cold read: the kernel's, and
# tarn's block cache (an export and import of the pool).
coldstart() {
    drop
    "$tarn" pool export bench >/dev/null
    "$tarn" pool import -d "$work" bench >/dev/null
    drop
}

src=$work/src
mkdir -p "$src/many"
head -c "$((size_mib << 20))" /dev/urandom > "$src/big"
for d in $(seq 0 9); do
    mkdir -p "$src/many/d$d"
    for f in $(seq 0 999); do head -c 16384 /dev/urandom > "$src/many/d$d/f$f"; done
done

declare -A W R C
one_pass() {
    local side=$1 pass=$2 t0 t1
    smb "$side" "deltree p$pass" || true
    smb "$side" "mkdir p$pass"
    t0=$(now)
    smb "$side" "put $src/big p$pass/big"
    durable "$side"
    t1=$(now)
    W[$side]+="$(rate "$((size_mib << 20))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')") "
    coldstart
    t0=$(now)
    smb "$side" "get p$pass/big /dev/null"
    t1=$(now)
    R[$side]+="$(rate "$((size_mib << 20))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')") "
    t0=$(now)
    smb "$side" "prompt OFF; recurse ON; cd p$pass; lcd $src; mput many"
    durable "$side"
    t1=$(now)
    C[$side]+="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", 10000 / (b - a) }') "
}
for pass in $(seq 1 "$passes"); do
    if [ $((pass % 2)) = 1 ]; then one_pass fs "$pass"; one_pass plain "$pass"; else one_pass plain "$pass"; one_pass fs "$pass"; fi
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

printf '%-12s %12s %12s %8s   (median of %s passes, %s MiB, reads %s)\n' column tarn plain ratio "$passes" "$size_mib" "$cold"
for col in W R C; do
    declare -n m=$col
    a=$(echo "${m[fs]}" | median)
    b=$(echo "${m[plain]}" | median)
    case $col in W) name="seq write" unit=MiB/s ;; R) name="seq read" unit=MiB/s ;; C) name="10k copy" unit=files/s ;; esac
    printf '%-12s %12s %12s %8s   %s\n' "$name" "$a" "$b" "$(ratio "$a" "$b")" "$unit"
done
