#!/usr/bin/env bash
# What encryption costs: fio on a FUSE mount of an aes-256-gcm dataset
# beside the same on an unencrypted dataset of the same pool (raidz1 of 4
# files, recordsize=1M, compression off, random data), in one run, with one
# core's AES-GCM throughput (the limit) printed below. Not a test: nothing
# here fails on a timing. Needs root and /dev/fuse, and fio.
#
#   seqwrite  fio bs=1M, SIZE MiB, end_fsync                    MiB/s
#   coldread  fio bs=1M, after export + import, caches dropped  MiB/s
#   warmread  fio bs=1M, again (tarn's block cache warm)        MiB/s
#   randread  fio bs=4k, 16 jobs, 20 s, cold                    IOPS
#
# Each figure is the median of PASSES passes (default 3), each pass
# alternating which dataset goes first; every pass's figures are printed.
#
# Usage: scripts/bench-crypt.sh [SIZE_MIB]   (default 1024)
set -euo pipefail
size_mib=${1:-1024}
root=$(cd "$(dirname "$0")/.." && pwd)
tarn=${TARN_BIN:-$root/target/release/tarn}
[ -x "$tarn" ] || (cd "$root" && cargo build --release -q)
work=$(mktemp -d "${BENCH_DIR:-$root}/bench.XXXXXX")
cleanup() {
    "$tarn" daemon stop >/dev/null 2>&1 || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export TARN_SOCKET=$work/tarn.sock

drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "-"; else printf "%.2f", a / b }'; }

# Both datasets' files fit, with parity, twice over.
member_mib=$((size_mib * 4 / 3 + 1024))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done
"$tarn" daemon --state-dir "$work/state" 2>"$work/daemon.log" &
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" pool create bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3
mkdir -p "$work/plain" "$work/crypt"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/key"
"$tarn" dataset create -o recordsize=1M -o compression=off -o "mountpoint=$work/plain" bench/plain
"$tarn" dataset create -o recordsize=1M -o compression=off -o "mountpoint=$work/crypt" \
    -o encryption=aes-256-gcm -o keyformat=hex -o "keylocation=file://$work/key" bench/crypt

fio_run() {
    local dir=$1 name=$2; shift 2
    fio --name="$name" --directory="$dir" --filename=bench.dat --size="${size_mib}M" \
        --output-format=terse --terse-version=3 --group_reporting "$@" 2>/dev/null
}
seq_write() {
    fio_run "$1" w --ioengine=psync --rw=write --bs=1M --end_fsync=1 --refill_buffers \
        | awk -F';' '{ printf "%.0f", $48 / 1024 }'
}
seq_read() { fio_run "$1" r --ioengine=psync --rw=read --bs=1M | awk -F';' '{ printf "%.0f", $7 / 1024 }'; }
rand_read() {
    fio_run "$1" rr --ioengine=psync --rw=randread --bs=4k --numjobs=16 --time_based \
        --runtime=20 | awk -F';' '{ print $8 }'
}
# Cold: the pool exported and imported (tarn's cache empty; the file key
# loads itself), the kernel's caches dropped.
cold() {
    "$tarn" pool export bench
    drop
    "$tarn" pool import -d "$work" bench >/dev/null
}

declare -A r
# PASSES passes (default 3), alternating which dataset goes first, and
# the median of each kept: on a virtual disk one pass can be 2-3x another
# (the member files' page cache), which a single pass mistakes for the
# cost of encryption.
passes=${PASSES:-3}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A all
for p in $(seq "$passes"); do
    if [ $((p % 2)) -eq 1 ]; then order="plain crypt"; else order="crypt plain"; fi
    for target in $order; do
        # Each write starts on a quiet pool: the last one's txgs (and the
        # frees of the file it replaces) committed, or the second writer
        # of a pass pays for the first.
        rm -f "$work/$target/bench.dat"; sync
        "$tarn" pool sync bench; sleep 1; "$tarn" pool sync bench
        all[$target.sw]+=" $(seq_write "$work/$target")"
        "$tarn" pool sync bench
        cold; all[$target.cr]+=" $(seq_read "$work/$target")"
        all[$target.wr]+=" $(seq_read "$work/$target")"
        cold; all[$target.rr]+=" $(rand_read "$work/$target")"
    done
done
for k in "${!all[@]}"; do r[$k]=$(echo "${all[$k]}" | median); done
echo "passes (plain | crypt):"
for w in sw cr wr rr; do echo "  $w:${all[plain.$w]} |${all[crypt.$w]}"; done

printf "%-22s %12s %12s %8s %8s\n" "workload" "unencrypted" "aes-256-gcm" "ratio" "target"
row() {
    printf "%-22s %12s %12s %8s %8s\n" "$1" "${r[plain.$2]}" "${r[crypt.$2]}" \
        "$(ratio "${r[crypt.$2]}" "${r[plain.$2]}")" "$3"
}
row "seq write MiB/s" sw ">= 0.90"
row "cold seq read MiB/s" cr ">= 0.90"
row "warm seq read MiB/s" wr ">= 0.90"
row "4k rand read IOPS" rr ">= 0.80"
echo
echo "one core (the limit of a single reader or writer):"
(cd "$root" && cargo test --release -q -p tarn-block --test crypt_speed -- --ignored --nocapture \
    2>/dev/null | grep 'GB/s') || true
