#!/usr/bin/env bash
# Block benchmark: a tarn volume over NBD beside nbdkit and a loop device,
# and over iSCSI beside tgtd; one run, two tables.
#
#   side    what                                              the same workload
#   tarn    a volume (volblocksize 16K, compression off) on   fio --ioengine=nbd
#           raidz1 of four sparse files, NBD on loopback
#   nbdkit  nbdkit's file plugin over one plain file           fio --ioengine=nbd
#   loop    a loop device of one plain file, O_DIRECT          fio --ioengine=libaio
#           (the limit: no network, no parity, no checksum)
#   bound   four plain files like tarn's members, and only     fio --ioengine=libaio
#           the member I/O that raidz1 of 16K blocks needs
#           for the workload (below); no daemon at all
#
# The bound is what the disk allows raidz1 of four members with 16K
# blocks (four data sectors of 4K and two of parity, in columns of 8K,
# 4K, 4K and a parity column of 8K), each checksummed whole (as ZFS
# stores them too): a 1M read reads its bytes (the data columns only, as
# if skipping the parity between them cost nothing: tarn reads through
# it, 1.5 times the bytes, to keep one read per run); a 1M write writes
# 1.5 times its bytes; a cold 4k read reads the three data columns of its
# block (the checksum covers the block); a 4k write into a cold block
# reads those three columns once per block and writes the block and its
# parity (24K) once, reads and writes overlapping. Nothing is checksummed
# and no block is read twice; a read after random writes is taken as
# sequential. It is measured on the same disk in the same pass, so it
# swings with the disk and the host's caches as the other sides do
# (buffered writes most: see docs/performance.md).
#
#   workload                                   unit   target tarn/nbdkit
#   4k random read, queue depth 32             IOPS   >= 1.0
#   4k random write, queue depth 32            IOPS   >= 0.75
#   1M sequential read, queue depth 8          MiB/s  >= 1.0
#     (twice: right after the fill, and after the random writes)
#   1M sequential write, queue depth 8         MiB/s  >= 0.75
#
# iSCSI (second table): the same volume through tarn's iSCSI target, and
# tgtd (Linux's user-space target) exporting one plain file, both driven
# by qemu-img bench over libiscsi (fio has no iSCSI engine here): the same
# four workloads, each a fixed count of requests (one pass of SIZE for
# 1M, SIZE/4 worth for 4k) at the same queue depths, writes ending with a
# flush and writing a non-zero byte pattern (zeros would be holes to tarn). qemu-img bench does not do random offsets: the 4k jobs stride by
# 1009 blocks of 4K (a prime), wrapping at the end, which scatters them
# over the whole device as random I/O would. Reads run after the fill
# with caches dropped, as above.
#
# raidz1 writes a parity share that the plain file does not, hence the
# lower write targets. Every device is filled first (so reads read data,
# not holes). Each job makes one pass over SIZE: reads start cold (the
# kernel's caches dropped, tarn's pool exported and imported so its block
# cache is empty too), writes end with a flush (fio's end_fsync), so every side puts
# its bytes on the same disk. tarn is copy-on-write: its writes always go
# to new places in its member files, where an in-place file rewrites the
# same pages; without the flush a job that fits in the page cache would
# measure only the cache on the other sides.
#
# Not a test: nothing here fails on a timing. Not part of CI. Needs root
# and loop devices; installs fio, nbdkit, libnbd tools, tgt and qemu-utils
# with apt-get when missing. Output: the table on stdout and in OUT.md (OUT defaults to
# target/bench-blocks). Takes a few minutes per pass.
#
# Each figure is the median of PASSES passes (default 3), and the range
# of the passes follows it: one pass on a shared or virtual machine can
# move by a third with the host's load. Passes alternate which side goes
# first. The random write job runs once per pass, so with more passes the
# volume has taken more random writes before the second 1M read (it is
# as scattered after one pass as after three: every block was rewritten).
#
# Usage: scripts/bench-blocks.sh
# Environment: TARN_BIN (default target/release/tarn, built if absent), PASSES,
# SIZE (MiB, default 1024), OUT, WORK (a
# folder on the disk to measure, default a temporary one under target/).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1024}
PASSES=${PASSES:-3}
OUT=${OUT:-target/bench-blocks}
WORK=${WORK:-$(mktemp -d "$PWD/target/bench-blocks.XXXXXX")}
TARN_BIN=${TARN_BIN:-target/release/tarn}

need=()
for tool in fio:fio nbdkit:nbdkit nbdinfo:libnbd-bin tgtd:tgt qemu-img:qemu-utils \
    iscsi-ls:libiscsi-bin; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
[ -x "$TARN_BIN" ] || cargo build --release -p tarn >/dev/null
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

TARN_PORT=10811
KIT_PORT=10812
TARN_ISCSI_PORT=3262
TGT_PORT=3263
TGT_CONTROL=7  # tgtd's management channel, apart from any system tgtd
TARN_IQN=iqn.2026-11.org.tarn:bench
TGT_IQN=iqn.2026-11.org.tarn:bench-tgt
DAEMON_PID=""
KIT_PID=""
TGT_PID=""
LOOP=""
cleanup() {
    [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null || true
    [ -n "$KIT_PID" ] && kill "$KIT_PID" 2>/dev/null || true
    # tgtd ignores SIGTERM while it has targets.
    [ -n "$TGT_PID" ] && kill -9 "$TGT_PID" 2>/dev/null || true
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
    --nbd "127.0.0.1:$TARN_PORT" --iscsi "127.0.0.1:$TARN_ISCSI_PORT" 2>"$WORK/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 100); do tarn daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
tarn pool create tank raidz1 "$WORK"/m0 "$WORK"/m1 "$WORK"/m2 "$WORK"/m3 >/dev/null
tarn volume create -s -V "${SIZE}M" -b 16K -o compression=off tank/vol
tarn share add vol tank/vol --nbd 127.0.0.1/32 --iscsi "$TARN_IQN,client=127.0.0.1/32"

# tgtd: one plain file as LUN 1 (LUN 0 is its controller).
truncate -s "${SIZE}M" "$WORK/tgt.img"
tgtd -f -C "$TGT_CONTROL" --iscsi "portal=127.0.0.1:$TGT_PORT" >"$WORK/tgtd.log" 2>&1 &
TGT_PID=$!
disown "$TGT_PID"  # killed at exit; no job notice
tgtctl() { tgtadm -C "$TGT_CONTROL" --lld iscsi "$@"; }
for _ in $(seq 50); do tgtctl --op show --mode target >/dev/null 2>&1 && break; sleep 0.1; done
tgtctl --op new --mode target --tid 1 -T "$TGT_IQN"
tgtctl --op new --mode logicalunit --tid 1 --lun 1 -b "$WORK/tgt.img"
tgtctl --op bind --mode target --tid 1 -I ALL

# nbdkit: the file plugin over one plain file.
truncate -s "${SIZE}M" "$WORK/kit.img"
nbdkit --exit-with-parent -f -p "$KIT_PORT" -i 127.0.0.1 file "$WORK/kit.img" &
KIT_PID=$!

# loop: a loop device of one plain file.
truncate -s "${SIZE}M" "$WORK/loop.img"
LOOP=$(losetup --show -f "$WORK/loop.img")

# bound: four plain files holding what raidz1 of four keeps of SIZE
# (1.5 times it), written whole like the members.
BOUND_MIB=$((SIZE * 3 / 8))
for i in 0 1 2 3; do
    dd if=/dev/urandom of="$WORK/f$i" bs=1M count="$BOUND_MIB" status=none
done
BOUND_FILES="$WORK/f0:$WORK/f1:$WORK/f2:$WORK/f3"
for _ in $(seq 50); do nbdinfo "nbd://127.0.0.1:$KIT_PORT" >/dev/null 2>&1 && break; sleep 0.1; done

target() {
    case $1 in
        tarn) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$TARN_PORT/vol" ;;
        nbdkit) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$KIT_PORT" ;;
        loop) echo "--ioengine=libaio --direct=1 --filename=$LOOP" ;;
    esac
}

# Before each job: tarn's pool is exported and imported again (its block
# cache starts cold, and a txg backlog of the previous job is committed
# outside any timing), then the kernel's caches are dropped.
drop() { # side
    if [ "$1" = tarn ]; then
        tarn pool export tank >/dev/null
        tarn pool import -d "$WORK" tank >/dev/null
    fi
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# The bound of one workload: the member I/O it needs, done by fio on the
# four plain files (reads O_DIRECT as tarn reads runs, writes through the
# page cache and flushed as tarn writes its members); prints the client's
# IOPS or MiB/s that this I/O would allow. iSCSI's 4k jobs stride (see
# ijob), so they touch fewer blocks per request than fio's random map.
bound() { # rw unit requests blocks
    local rw=$1 unit=$2 requests=$3 blocks=$4 args json
    local files="--ioengine=libaio --filename=$BOUND_FILES"
    local common="$files --size=$((BOUND_MIB * 4))M"
    case $rw in
        # The data only: SIZE over the four files.
        read) args="--name=r $files --size=${SIZE}M --direct=1 --rw=read --bs=1M --iodepth=8" ;;
        write) args="--name=w $common --rw=write --bs=1M --iodepth=8 --end_fsync=1" ;;
        # Three column reads per block: 8K, 4K, 4K.
        randread) args="--name=r $common --direct=1 --rw=randread --bssplit=8k/34:4k/66
            --iodepth=32 --number_ios=$((blocks * 3))" ;;
        # The same reads, and the blocks with their parity written (24K each).
        randwrite) args="--name=r $common --direct=1 --rw=randread --bssplit=8k/34:4k/66
            --iodepth=32 --number_ios=$((blocks * 3))
            --name=w $common --rw=write --bs=1M --iodepth=8 --end_fsync=1
            --io_size=$((blocks * 24))k" ;;
    esac
    # shellcheck disable=SC2086
    json=$(fio $args --output-format=json 2>>"$WORK/fio.log") || {
        tail -20 "$WORK/fio.log" >&2
        exit 1
    }
    # The jobs start together; the longest one's time (the final flush
    # included) is the workload's.
    printf '%s' "$json" | python3 -c '
import json, sys
requests, size, unit = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
text = sys.stdin.read()  # with two jobs fio prints a line before the JSON
secs = max(j["job_runtime"] for j in json.loads(text[text.index("{"):])["jobs"]) / 1000
print(round(requests / secs) if unit == "IOPS" else round(size / secs))
' "$requests" "$SIZE" "$unit"
}
# The bound of a job of the NBD table (fio: the 4k jobs touch every 4K
# of the device once, so every block) or of the iSCSI table (qemu-img
# bench: a quarter of the 4K slots, striding by 1009).
bound_job() { # table rw unit
    local slots=$((SIZE * 256)) n blocks
    case $1 in
        nbd) n=$slots blocks=$((slots / 4)) ;;
        iscsi)
            n=$((slots / 4))
            blocks=$(python3 -c '
import sys
n, slots = int(sys.argv[1]), int(sys.argv[2])
print(len({k * 1009 % slots // 4 for k in range(n)}))
' "$n" "$slots")
            ;;
    esac
    bound "$2" "$3" "$n" "$blocks"
}

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
dd if=/dev/urandom of="$WORK/tgt.img" bs=1M count="$SIZE" conv=notrunc status=none

iscsi_url() {
    case $1 in
        tarn) echo "iscsi://127.0.0.1:$TARN_ISCSI_PORT/$TARN_IQN/0" ;;
        tgt) echo "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/1" ;;
    esac
}

# One qemu-img bench job over iSCSI; prints IOPS or MiB/s.
ijob() { # side rw bs depth unit
    local side=$1 rw=$2 bs=$3 depth=$4 unit=$5 bytes count step secs args=()
    case $bs in 4k) bytes=4096 ;; 1M) bytes=1048576 ;; esac
    case $rw in
        rand*) count=$((SIZE * 1048576 / 4 / bytes)) step=$((1009 * bytes)) ;;
        *) count=$((SIZE * 1048576 / bytes)) step=$bytes ;;
    esac
    # A non-zero pattern: qemu-img bench writes zeros by default, which a
    # volume stores as holes (nothing written) and a plain file writes.
    case $rw in *write) args=(-w "--flush-interval=$count" "--pattern=165") ;; esac
    secs=$(qemu-img bench -f raw -d "$depth" -s "$bytes" -c "$count" -S "$step" "${args[@]}" \
        "$(iscsi_url "$side")" 2>>"$WORK/bench.log" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p') || true
    [ -n "$secs" ] || { cat "$WORK/bench.log" >&2; tail -20 "$WORK/daemon.log" >&2; exit 1; }
    python3 -c '
import sys
count, nbytes, secs, unit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(round(count / secs) if unit == "IOPS" else round(count * nbytes / secs / 1048576))
' "$count" "$bytes" "$secs" "$unit"
}

# The jobs in their order: label, fio rw, block size, queue depth, unit.
# The 1M reads run twice: on the volume as the sequential fill left it,
# and after the 4k random writes, which (copy-on-write) moved a quarter
# of its blocks away from their neighbours, as a guest's random writes do.
WORKLOADS=("fresh-read read 1M 8 MiB/s" "randread randread 4k 32 IOPS"
    "randwrite randwrite 4k 32 IOPS" "read read 1M 8 MiB/s" "write write 1M 8 MiB/s")
row_name() { # label rw bs depth
    case $1 in
        fresh-read) echo "read $3 qd$4, after the fill" ;;
        read) echo "read $3 qd$4, after the random writes" ;;
        *) echo "$2 $3 qd$4" ;;
    esac
}

# R[label,side] and I[label,side]: the passes' figures, space-separated.
declare -A R I
for w in "${WORKLOADS[@]}"; do
    set -- $w
    for pass in $(seq "$PASSES"); do
        nbd_sides="tarn nbdkit loop" iscsi_sides="tarn tgt"
        if [ $((pass % 2)) -eq 0 ]; then
            nbd_sides="loop nbdkit tarn" iscsi_sides="tgt tarn"
        fi
        for side in $nbd_sides; do
            drop "$side"
            R[$1,$side]+="$(job "$side" "$2" "$3" "$4" "$5") "
        done
        for side in $iscsi_sides; do
            drop "$side"
            I[$1,$side]+="$(ijob "$side" "$2" "$3" "$4" "$5") "
        done
        drop bound
        R[$1,bound]+="$(bound_job nbd "$2" "$5") "
        drop bound
        I[$1,bound]+="$(bound_job iscsi "$2" "$5") "
    done
done

# "median (min–max)" of the figures given, or the figure alone for one pass.
cell() {
    python3 -c '
import statistics, sys
v = sorted(int(x) for x in sys.argv[1:])
m = round(statistics.median(v))
print(m if len(v) == 1 else f"{m} ({v[0]}–{v[-1]})")
' "$@"
}
# The ratio of two medians.
ratio() { # "figures a" "figures b"
    python3 -c '
import statistics, sys
a, b = (statistics.median(int(x) for x in s.split()) for s in sys.argv[1:3])
print(f"{a / max(b, 1):.2f}")
' "$1" "$2"
}

mkdir -p "$(dirname "$OUT")"
{
    echo "Medians of $PASSES passes (the range in brackets)."
    echo
    echo "| workload | unit | tarn | nbdkit | loop | bound | tarn/nbdkit | tarn/loop | bound/nbdkit |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for w in "${WORKLOADS[@]}"; do
        set -- $w
        t=${R[$1,tarn]} k=${R[$1,nbdkit]} l=${R[$1,loop]} f=${R[$1,bound]}
        # shellcheck disable=SC2086
        echo "| $(row_name "$@") | $5 | $(cell $t) | $(cell $k) | $(cell $l) | $(cell $f) | $(ratio "$t" "$k") | $(ratio "$t" "$l") | $(ratio "$f" "$k") |"
    done
    echo
    echo "| iSCSI workload | unit | tarn | tgt | bound | tarn/tgt | bound/tgt |"
    echo "|---|---|---|---|---|---|---|"
    for w in "${WORKLOADS[@]}"; do
        set -- $w
        t=${I[$1,tarn]} g=${I[$1,tgt]} f=${I[$1,bound]}
        # shellcheck disable=SC2086
        echo "| $(row_name "$@") | $5 | $(cell $t) | $(cell $g) | $(cell $f) | $(ratio "$t" "$g") | $(ratio "$f" "$g") |"
    done
} | tee "$OUT.md"
