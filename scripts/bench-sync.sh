#!/usr/bin/env bash
# Synchronous-write benchmark: fio random writes, each followed by fsync, on
# a FUSE mount of a tarn dataset (sync=standard, raidz1 of 4 files) beside
# the same on a plain directory of the same disk, in one run; then the same
# on the dataset once the pool has a separate log device (SLOG) on a
# tmpfs-backed file, to show what a fast log device buys. Not a test:
# nothing here fails on a timing. Needs root and /dev/fuse (FUSE), fio, and
# python3 or jq to read fio's JSON.
#
#   randwrite 4k    fio --rw=randwrite --bs=4k  --fsync=1 --ioengine=psync
#   randwrite 64k   fio --rw=randwrite --bs=64k --fsync=1 --ioengine=psync
#
# For each: ops/s (one op is a write and its fsync) and the p99 latency of
# the fsync, which is where a synchronous write waits (the write itself only
# reaches memory); ratios are tarn / plain (higher is better for ops/s,
# lower for p99). The p99 of write() alone follows in a second table.
#
# Usage: scripts/bench-sync.sh [SECONDS] [SIZE_MIB]   (defaults 20, 64)
set -euo pipefail
runtime=${1:-20}
size_mib=${2:-64}
root=$(cd "$(dirname "$0")/.." && pwd)
tarn=${TARN_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/tarn}
[ -n "${TARN_BIN:-}" ] || (cd "$root" && cargo build --release -q -p tarn)

if [ "$(id -u)" -ne 0 ] || [ ! -e /dev/fuse ]; then
    echo "bench-sync: needs root and /dev/fuse (the dataset is mounted with FUSE)" >&2
    exit 1
fi
command -v fio >/dev/null || { echo "bench-sync: needs fio" >&2; exit 1; }
if command -v python3 >/dev/null; then
    json=python3
elif command -v jq >/dev/null; then
    json=jq
else
    echo "bench-sync: needs python3 or jq to read fio's JSON" >&2
    exit 1
fi

work=$(mktemp -d "${BENCH_DIR:-$root}/bench.XXXXXX")
slog=$(mktemp /dev/shm/tarn-bench-slog.XXXXXX)
cleanup() {
    "$tarn" daemon stop >/dev/null 2>&1 || true
    wait 2>/dev/null || true
    rm -rf "$work" "$slog"
}
trap cleanup EXIT
export TARN_SOCKET=$work/tarn.sock

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }

# fio figures of one run, from its JSON on stdin: write ops/s, fsync p99 in
# microseconds, write() clat p99 in microseconds.
figures() {
    if [ "$json" = python3 ]; then
        python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
p99 = lambda lat: lat.get("percentile", {}).get("99.000000", 0) / 1000
print("%.0f %.0f %.0f" % (j["write"]["iops"], p99(j["sync"]["lat_ns"]), p99(j["write"]["clat_ns"])))'
    else
        jq -r '.jobs[0] | [(.write.iops | floor),
            ((.sync.lat_ns.percentile["99.000000"] // 0) / 1000 | floor),
            ((.write.clat_ns.percentile["99.000000"] // 0) / 1000 | floor)] | @tsv'
    fi
}

# $1 directory, $2 block size: prints "ops/s fsync-p99-us write-p99-us",
# or dashes (and fio's complaint on stderr) if fio fails.
sync_run() {
    local dir=$1 bs=$2 out=$work/fio-$bs.json
    if fio --name="sync-$bs" --directory="$dir" --filename=bench.dat --size="${size_mib}M" \
        --rw=randwrite --bs="$bs" --fsync=1 --ioengine=psync \
        --runtime="$runtime" --time_based --output-format=json >"$out" 2>"$work/fio.err"; then
        figures <"$out"
    else
        echo "bench-sync: fio failed in $dir (bs=$bs): $(tail -1 "$work/fio.err")" >&2
        echo "- - -"
    fi
    rm -f "$dir/bench.dat"
}

member_mib=$((size_mib * 2 + 256))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done
"$tarn" daemon --state-dir "$work/state" 2>"$work/daemon.log" &
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" pool create bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3
mkdir -p "$work/tarn" "$work/plain"
"$tarn" dataset create -o sync=standard -o compression=off -o "mountpoint=$work/tarn" bench/fs

declare -A r
sizes="4k 64k"
for target in plain tarn; do
    for bs in $sizes; do
        read -r "r[$target.$bs.ops]" "r[$target.$bs.p99]" "r[$target.$bs.wp99]" \
            < <(sync_run "$work/$target" "$bs")
    done
done

# The same with a separate log device, where the pool can add one.
slog_note=""
if "$tarn" pool add --help >/dev/null 2>&1; then
    truncate -s 256M "$slog"
    "$tarn" pool add bench log "$slog"
    for bs in $sizes; do
        read -r "r[slog.$bs.ops]" "r[slog.$bs.p99]" "r[slog.$bs.wp99]" \
            < <(sync_run "$work/tarn" "$bs")
    done
else
    slog_note="skipped: no log device support (tarn pool add ... log)"
    for bs in $sizes; do r[slog.$bs.ops]=-; r[slog.$bs.p99]=-; r[slog.$bs.wp99]=-; done
fi

echo "fsync after every write, ${runtime}s per run, ${size_mib} MiB file; dataset sync=standard"
fmt="%-14s %11s %10s %6s %10s %9s %6s %10s %6s %6s %9s %6s %6s\n"
printf "$fmt" "" "plain" "tarn" "" "plain" "tarn" "" "tarn+SLOG" "" "" "tarn+SLOG" "" ""
printf "$fmt" "workload" "ops/s" "ops/s" "ratio" "p99 us" "p99 us" "ratio" "ops/s" "/plain" "/tarn" "p99 us" "/plain" "/tarn"
for bs in $sizes; do
    printf "$fmt" "randwrite $bs" \
        "${r[plain.$bs.ops]}" "${r[tarn.$bs.ops]}" "$(ratio "${r[tarn.$bs.ops]}" "${r[plain.$bs.ops]}")" \
        "${r[plain.$bs.p99]}" "${r[tarn.$bs.p99]}" "$(ratio "${r[tarn.$bs.p99]}" "${r[plain.$bs.p99]}")" \
        "${r[slog.$bs.ops]}" "$(ratio "${r[slog.$bs.ops]}" "${r[plain.$bs.ops]}")" \
        "$(ratio "${r[slog.$bs.ops]}" "${r[tarn.$bs.ops]}")" \
        "${r[slog.$bs.p99]}" "$(ratio "${r[slog.$bs.p99]}" "${r[plain.$bs.p99]}")" \
        "$(ratio "${r[slog.$bs.p99]}" "${r[tarn.$bs.p99]}")"
done
[ -z "$slog_note" ] || echo "SLOG: $slog_note"
echo
echo "p99 of write() alone, us (the data only reaches memory before fsync):"
printf "%-14s %10s %10s %10s\n" "workload" "plain" "tarn" "tarn+SLOG"
for bs in $sizes; do
    printf "%-14s %10s %10s %10s\n" "randwrite $bs" "${r[plain.$bs.wp99]}" "${r[tarn.$bs.wp99]}" "${r[slog.$bs.wp99]}"
done
