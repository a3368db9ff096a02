#!/usr/bin/env bash
# Filesystem benchmark: fio and a small-file workload on a FUSE mount of a
# tarn dataset (raidz1 of 4 files) beside the same on a plain directory of
# the same disk, in one run. Reports each figure and its ratio to the plain
# directory. Not a test: nothing here fails on a timing. Needs root and
# /dev/fuse (FUSE), and fio.
#
#   seqwrite  fio bs=1M, 1 GiB, end_fsync          MiB/s
#   seqread   fio bs=1M, the same file, cold       MiB/s
#   randread  fio bs=4k, 30 s on that file, cold   IOPS
#   files     create, stat, delete N small files   files/s each
#
# Usage: scripts/bench-fs.sh [SIZE_MIB] [FILES]   (defaults 1024, 100000)
set -euo pipefail
size_mib=${1:-1024}
nfiles=${2:-100000}
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
now() { date +%s.%N; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "-"; else printf "%.2f", a / b }'; }

member_mib=$((size_mib * 2 / 3 + 512))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done
"$tarn" daemon --state-dir "$work/state" 2>"$work/daemon.log" &
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" pool create bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3
mkdir -p "$work/tarn" "$work/plain"
"$tarn" dataset create -o recordsize=1M -o compression=off "-o" "mountpoint=$work/tarn" bench/fs

# fio figure: $1 dir, $2 job name, $3.. fio args; prints bw MiB/s or iops.
fio_bw() {
    local dir=$1 name=$2; shift 2
    fio --name="$name" --directory="$dir" --filename=bench.dat --size="${size_mib}M" \
        --ioengine=psync --output-format=terse --terse-version=3 "$@" 2>/dev/null
}
seq_write() { fio_bw "$1" w --rw=write --bs=1M --end_fsync=1 | awk -F';' '{ printf "%.0f", $48 / 1024 }'; }
seq_read() { fio_bw "$1" r --rw=read --bs=1M | awk -F';' '{ printf "%.0f", $7 / 1024 }'; }
rand_read() { fio_bw "$1" rr --rw=randread --bs=4k --time_based --runtime=30 | awk -F';' '{ print $8 }'; }

files() {
    local dir=$1/small t0 t1 t2 t3
    mkdir -p "$dir"
    t0=$(now)
    (cd "$dir" && seq "$nfiles" | xargs touch)
    t1=$(now)
    (cd "$dir" && find . -type f -print0 | xargs -0 stat --format=%s > /dev/null)
    t2=$(now)
    rm -rf "$dir"
    t3=$(now)
    awk -v n="$nfiles" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" \
        'BEGIN { printf "%.0f %.0f %.0f\n", n / (b - a), n / (c - b), n / (d - c) }'
}

declare -A r
for target in plain tarn; do
    dir=$work/$target
    drop; r[$target.sw]=$(seq_write "$dir")
    drop; r[$target.sr]=$(seq_read "$dir")
    drop; r[$target.rr]=$(rand_read "$dir")
    rm -f "$dir/bench.dat"
    read -r c s d < <(files "$dir")
    r[$target.fc]=$c; r[$target.fs]=$s; r[$target.fd]=$d
done

printf "%-22s %12s %12s %8s\n" "workload" "plain dir" "tarn FUSE" "ratio"
row() { printf "%-22s %12s %12s %8s\n" "$1" "${r[plain.$2]}" "${r[tarn.$2]}" "$(ratio "${r[tarn.$2]}" "${r[plain.$2]}")"; }
row "seq write MiB/s" sw
row "seq read MiB/s" sr
row "4k rand read IOPS" rr
row "create files/s" fc
row "stat files/s" fs
row "delete files/s" fd
