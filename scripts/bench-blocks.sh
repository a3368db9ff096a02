#!/usr/bin/env bash
# Block benchmark: a tarn volume over NBD beside nbdkit and a loop device,
# one run, one table.
#
#   side    what                                              the same workload
#   tarn    a volume (volblocksize 16K, compression off) on   fio --ioengine=nbd
#           raidz1 of four sparse files, NBD on loopback
#   nbdkit  nbdkit's file plugin over one plain file           fio --ioengine=nbd
#   loop    a loop device of one plain file, O_DIRECT          fio --ioengine=libaio
#           (the limit: no network, no parity, no checksum)
#
#   workload                                   unit   target tarn/nbdkit
#   4k random read, queue depth 32             IOPS   >= 1.0
#   4k random write, queue depth 32            IOPS   >= 0.75
#   1M sequential read, queue depth 8          MiB/s  >= 1.0
#   1M sequential write, queue depth 8         MiB/s  >= 0.75
#
# raidz1 writes a parity share that the plain file does not, hence the
# lower write targets. Every device is filled first (so reads read data,
# not holes). Each job makes one pass over SIZE: reads start cold (caches
# dropped), writes end with a flush (fio's end_fsync), so every side puts
# its bytes on the same disk. tarn is copy-on-write: its writes always go
# to new places in its member files, where an in-place file rewrites the
# same pages; without the flush a job that fits in the page cache would
# measure only the cache on the other sides.
#
# Not a test: nothing here fails on a timing. Not part of CI. Needs root
# and loop devices; installs fio, nbdkit and libnbd tools with apt-get
# when missing. Output: the table on stdout and in OUT.md (OUT defaults to
# target/bench-blocks). Takes a few minutes with the defaults.
#
# Usage: scripts/bench-blocks.sh
# Environment: TARN_BIN (default target/release/tarn, built if absent),
# SIZE (MiB, default 1024), OUT, WORK (a
# folder on the disk to measure, default a temporary one under target/).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1024}
OUT=${OUT:-target/bench-blocks}
WORK=${WORK:-$(mktemp -d "$PWD/target/bench-blocks.XXXXXX")}
TARN_BIN=${TARN_BIN:-target/release/tarn}

need=()
for tool in fio:fio nbdkit:nbdkit nbdinfo:libnbd-bin; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
[ -x "$TARN_BIN" ] || cargo build --release -p tarn >/dev/null
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

TARN_PORT=10811
KIT_PORT=10812
DAEMON_PID=""
KIT_PID=""
LOOP=""
cleanup() {
    [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null || true
    [ -n "$KIT_PID" ] && kill "$KIT_PID" 2>/dev/null || true
    [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

tarn() { "$TARN_BIN" --socket "$WORK/tarn.sock" "$@"; }

# tarn: raidz1 of four files, one volume of SIZE shared over NBD.
# Written whole first, like the disks they stand for: a sparse file would
# make every copy-on-write allocate file blocks on the host too.
for i in 0 1 2 3; do
    dd if=/dev/zero of="$WORK/m$i" bs=1M count="$((SIZE * 2))" status=none
done
"$TARN_BIN" daemon --socket "$WORK/tarn.sock" --state-dir "$WORK/state" \
    --nbd "127.0.0.1:$TARN_PORT" 2>"$WORK/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 100); do tarn daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
tarn pool create tank raidz1 "$WORK"/m0 "$WORK"/m1 "$WORK"/m2 "$WORK"/m3 >/dev/null
tarn volume create -s -V "${SIZE}M" -b 16K -o compression=off tank/vol
tarn share add vol tank/vol --nbd 127.0.0.1/32

# nbdkit: the file plugin over one plain file.
truncate -s "${SIZE}M" "$WORK/kit.img"
nbdkit --exit-with-parent -f -p "$KIT_PORT" -i 127.0.0.1 file "$WORK/kit.img" &
KIT_PID=$!

# loop: a loop device of one plain file.
truncate -s "${SIZE}M" "$WORK/loop.img"
LOOP=$(losetup --show -f "$WORK/loop.img")
for _ in $(seq 50); do nbdinfo "nbd://127.0.0.1:$KIT_PORT" >/dev/null 2>&1 && break; sleep 0.1; done

target() {
    case $1 in
        tarn) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$TARN_PORT/vol" ;;
        nbdkit) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$KIT_PORT" ;;
        loop) echo "--ioengine=libaio --direct=1 --filename=$LOOP" ;;
    esac
}

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# One fio job; prints IOPS or MiB/s.
job() { # side rw bs depth unit
    local side=$1 rw=$2 bs=$3 depth=$4 unit=$5 json flush=0
    case $rw in *write) flush=1 ;; esac
    # shellcheck disable=SC2046
    json=$(fio --name=b $(target "$side") --rw="$rw" --bs="$bs" --iodepth="$depth" \
        --size="${SIZE}M" --end_fsync="$flush" --output-format=json 2>>"$WORK/fio.log") || {
        cat "$WORK/fio.log" >&2
        tail -20 "$WORK/daemon.log" >&2
        exit 1
    }
    printf '%s' "$json" | python3 -c '
import json, sys
text = sys.stdin.read()  # the nbd engine prints a line before the JSON
j = json.loads(text[text.index("{"):])["jobs"][0]
side = j["read"] if "read" in sys.argv[2] else j["write"]
print(round(side["iops"]) if sys.argv[1] == "IOPS" else round(side["bw"] / 1024))
' "$unit" "$rw"
}

for side in tarn nbdkit loop; do
    # shellcheck disable=SC2046
    fio --name=fill $(target "$side") --rw=write --bs=1M --iodepth=8 --size="${SIZE}M" \
        >/dev/null 2>&1
done

declare -A R
for w in "randread 4k 32 IOPS" "randwrite 4k 32 IOPS" "read 1M 8 MiB/s" "write 1M 8 MiB/s"; do
    set -- $w
    for side in tarn nbdkit loop; do
        drop
        R[$1,$side]=$(job "$side" "$1" "$2" "$3" "$4")
    done
done

mkdir -p "$(dirname "$OUT")"
{
    echo "| workload | unit | tarn | nbdkit | loop | tarn/nbdkit | tarn/loop |"
    echo "|---|---|---|---|---|---|---|"
    for w in "randread 4k 32 IOPS" "randwrite 4k 32 IOPS" "read 1M 8 MiB/s" "write 1M 8 MiB/s"; do
        set -- $w
        t=${R[$1,tarn]} k=${R[$1,nbdkit]} l=${R[$1,loop]}
        echo "| $1 $2 qd$3 | $4 | $t | $k | $l | $(python3 -c "print(f'{$t/max($k,1):.2f}')") | $(python3 -c "print(f'{$t/max($l,1):.2f}')") |"
    done
} | tee "$OUT.md"
