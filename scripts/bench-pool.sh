#!/usr/bin/env bash
# Pool benchmark: tarn beside plain-file peers on the same disk, in one run.
#
#   write  1 GiB of incompressible data to a raidz1 of 4 files (recordsize 1M,
#          compression off, committed with --sync)  vs  dd of the same data to a
#          plain file with conv=fsync
#   read   the object back cold  vs  cat of the four member files, cold
#   scrub  the pool               vs  cat of the four member files, cold
#
# Reports MiB/s and ratios, and the daemon's peak resident memory. Not a test:
# nothing here fails on a timing. Cold reads need root (drop_caches); without
# it the read figures are warm and say so.
#
# Usage: scripts/bench-pool.sh [SIZE_MIB]   (default 1024)
set -euo pipefail
size_mib=${1:-1024}
source "$(dirname "$0")/bench-common.sh"

head -c "$((size_mib << 20))" /dev/urandom > "$work/data"
bytes=$((size_mib << 20))
member_mib=$((size_mib * 2 / 3 + 128))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done

"$tarn" daemon --state-dir "$work/state" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" pool create -O recordsize=1M -O compression=off bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3

drop; t0=$(now); dd if="$work/data" of="$work/plain" bs=1M conv=fsync status=none; t1=$(now)
dd_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
drop; t0=$(now); "$tarn" object put bench data "$work/data" --sync; t1=$(now)
put_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')

# The peer reads what the pool wrote: the used prefix of each member (the
# rest of the sparse files is holes, which would flatter the peer).
alloc=$("$tarn" -o json pool list | awk -F: '/"allocated"/ { gsub(/[ ,]/, "", $2); print $2; exit }')
used=$((alloc / 4 + (4 << 20)))
member_bytes=$((4 * used))
drop; t0=$(now); for i in 0 1 2 3; do head -c "$used" "$work/d$i"; done > /dev/null; t1=$(now)
cat_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
# Cold means the daemon's block cache too: export and import drop it.
"$tarn" pool export bench && "$tarn" pool import -d "$work" bench
drop; t0=$(now); "$tarn" object get bench data /dev/null; t1=$(now)
get_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
"$tarn" object get bench data "$work/back"
cmp -s "$work/data" "$work/back" || { echo "read back differs!" >&2; exit 1; }
rm -f "$work/back" "$work/plain"

# Poll finely: `scrub --wait` updates once a second, too coarse to time by.
drop; t0=$(now); "$tarn" pool scrub bench
until "$tarn" -o json pool status bench | grep -q '"state": "finished"'; do sleep 0.02; done; t1=$(now)
scrub_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')

hwm_kib=$(awk '/VmHWM/ { print $2 }' "/proc/$daemon/status")

dd_r=$(rate "$bytes" "$dd_s"); put_r=$(rate "$bytes" "$put_s")
cat_r=$(rate "$member_bytes" "$cat_s"); get_r=$(rate "$bytes" "$get_s")
scrub_r=$(rate "$alloc" "$scrub_s")
echo "size: $size_mib MiB of incompressible data; raidz1 of 4 files, recordsize 1M, compression off"
printf '%-34s %8s MiB/s\n' "dd conv=fsync (plain file)" "$dd_r" "tarn object put --sync" "$put_r"
printf '  write ratio tarn/dd: %s (target >= %s = 0.70 x 3/4)\n' "$(ratio "$put_r" "$dd_r")" 0.53
printf '%-34s %8s MiB/s\n' "cat of used member bytes ($cold)" "$cat_r" "tarn object get ($cold)" "$get_r"
printf '  read ratio tarn/cat: %s\n' "$(ratio "$get_r" "$cat_r")"
printf '%-34s %8s MiB/s (allocated bytes / wall time)\n' "tarn pool scrub ($cold)" "$scrub_r"
printf '  scrub ratio tarn/cat: %s (target >= 0.80)\n' "$(ratio "$scrub_r" "$cat_r")"
cache_mib=$("$tarn" -o json pool iostat 2>/dev/null | awk -F: '/"cache_max_bytes"/ { gsub(/[ ,]/, "", $2); print int($2 / 1048576); exit }')
printf 'daemon peak RSS: %s MiB (bound: block cache %s MiB + dirty 256 MiB + 256 MiB)\n' "$((hwm_kib / 1024))" "${cache_mib:-?}"
"$tarn" daemon stop >/dev/null
