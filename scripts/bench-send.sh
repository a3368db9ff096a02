#!/usr/bin/env bash
# What send and receive cost, beside plain-file peers on the same disk, in
# one run (raidz1 of 4 files, recordsize 1M, compression off, random data):
#
#   send      `tarn send` of a SIZE MiB snapshot to /dev/null, cold
#             vs  cat of the four member files to /dev/null, cold
#   send -w   the same, raw
#   incr      `tarn send -i` after a 1 MiB change: time and stream bytes
#             (vs the full stream's)
#   receive   `tarn receive` of the full stream from a file into the same
#             pool  vs  `tarn object put` of the same data (a plain write)
#
# Reports MiB/s and ratios. Not a test: nothing here fails on a timing.
# Cold reads need root (drop_caches); without it they are warm and say so.
#
# Usage: scripts/bench-send.sh [SIZE_MIB]   (default 1024)
set -euo pipefail
size_mib=${1:-1024}
source "$(dirname "$0")/bench-common.sh"
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

bytes=$((size_mib << 20))
head -c "$bytes" /dev/urandom > "$work/data"
head -c $((1 << 20)) /dev/urandom > "$work/change"
# Room for the data, its copy from the receive, and parity.
member_mib=$((size_mib * 2 / 3 * 2 + 256))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done

"$tarn" daemon --state-dir "$work/state" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" pool create -O recordsize=1M -O compression=off bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3
drop; t0=$(now); "$tarn" object put bench big "$work/data" --sync; t1=$(now)
put_s=$(secs "$t0" "$t1")
"$tarn" snapshot bench@a

# The peer reads what the pool wrote: the used prefix of each member (the
# rest of the sparse files is holes, which would flatter the peer).
alloc=$("$tarn" -o json pool list | awk -F: '/"allocated"/ { gsub(/[ ,]/, "", $2); print $2; exit }')
used=$((alloc / 4 + (4 << 20)))
member_bytes=$((4 * used))
drop; t0=$(now); for i in 0 1 2 3; do head -c "$used" "$work/d$i"; done > /dev/null; t1=$(now)
cat_s=$(secs "$t0" "$t1")
# Cold means the daemon's block cache too: export and import drop it.
cold_pool() { "$tarn" pool export bench && "$tarn" pool import -d "$work" bench >/dev/null; drop; }
cold_pool; t0=$(now); "$tarn" send bench@a > /dev/null; t1=$(now); send_s=$(secs "$t0" "$t1")
cold_pool; t0=$(now); "$tarn" send -w bench@a > /dev/null; t1=$(now); raw_s=$(secs "$t0" "$t1")
"$tarn" send bench@a > "$work/full.stream"
full_bytes=$(stat -c %s "$work/full.stream")

"$tarn" object put --offset $((bytes / 2)) bench big "$work/change" --sync
"$tarn" snapshot bench@b
cold_pool; t0=$(now); "$tarn" send -i @a bench@b > "$work/incr.stream"; t1=$(now); incr_s=$(secs "$t0" "$t1")
incr_bytes=$(stat -c %s "$work/incr.stream")

drop; t0=$(now); "$tarn" receive -u --from "$work/full.stream" bench/copy >/dev/null; "$tarn" pool sync bench; t1=$(now)
recv_s=$(secs "$t0" "$t1")

printf "%-34s %10s %10s %8s\n" "workload ($cold, $size_mib MiB)" "tarn" "peer" "ratio"
printf "%-34s %10s %10s %8s\n" "send > /dev/null, MiB/s" "$(rate "$bytes" "$send_s")" \
    "$(rate "$member_bytes" "$cat_s")" "$(ratio "$(rate "$bytes" "$send_s")" "$(rate "$member_bytes" "$cat_s")")"
printf "%-34s %10s %10s %8s\n" "send -w > /dev/null, MiB/s" "$(rate "$bytes" "$raw_s")" \
    "$(rate "$member_bytes" "$cat_s")" "$(ratio "$(rate "$bytes" "$raw_s")" "$(rate "$member_bytes" "$cat_s")")"
printf "%-34s %10s %10s %8s\n" "receive (vs object put --sync), MiB/s" "$(rate "$bytes" "$recv_s")" \
    "$(rate "$bytes" "$put_s")" "$(ratio "$(rate "$bytes" "$recv_s")" "$(rate "$bytes" "$put_s")")"
printf "%-34s %10s %10s\n" "send -i after 1 MiB change" "${incr_s} s" "$incr_bytes B"
printf "%-34s %10s %10s\n" "  (full stream)" "${send_s} s" "$full_bytes B"
"$tarn" daemon stop >/dev/null
