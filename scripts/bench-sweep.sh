#!/usr/bin/env bash
# The built-in benchmark's sweep beside fio, in one run: `tarn bench
# --sweep` on a raidz1 pool of four sparse files (recordsize 128K/1M x
# compression off/lz4 x encryption off/aes-256-gcm), then, for each
# combination, fio's figures for the same jobs (psync, --direct=1) on a
# dataset of the same settings, mounted with FUSE. Prints tarn bench's
# table, then fio's, then the ratios. Not a test: nothing fails on a
# timing. Needs root (FUSE) and fio.
#
# Usage: scripts/bench-sweep.sh [SIZE] [RUNTIME]   (default 1G, 10 s)
# Env:   BENCH_DIR (where the temp dir goes; default the repo)
set -euo pipefail
size=${1:-1G}
runtime=${2:-10}
# shellcheck source=bench-common.sh
source "$(dirname "$0")/bench-common.sh"
command -v fio >/dev/null || { echo "bench-sweep: needs fio" >&2; exit 1; }

"$tarn" daemon --state-dir "$work/state" 2> "$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
devs=()
for i in 0 1 2 3; do truncate -s 4G "$work/d$i"; devs+=("$work/d$i"); done
"$tarn" pool create bench raidz1 "${devs[@]}" >/dev/null

sweeps=(--sweep recordsize=128K,1M --sweep compression=off,lz4 --sweep encryption=off,aes-256-gcm)
echo "== tarn bench (size $size, ${runtime}s per random workload)"
"$tarn" bench bench --size "$size" --runtime "$runtime" "${sweeps[@]}"

# fio: the same jobs on a dataset of each combination.
fio_job() { # FILE RW BS JOBS -> "iops bw_MBps"
    fio --name=j --filename="$1" --size="$size" --rw="$2" --bs="$3" --numjobs="$4" --thread \
        --ioengine=psync --direct=1 --time_based --runtime="$runtime" --group_reporting \
        --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; r=j["read"] if j["read"]["io_bytes"] else j["write"]; print(round(r["iops"]), round(r["bw_bytes"]/1e6))'
}
echo
echo "== fio, same jobs (psync, direct)"
printf '%-10s %-12s %-12s %12s %12s %12s %10s %10s\n' RECORDSIZE COMPRESSION ENCRYPTION RANDREAD-QD32 READ-QD1 WRITE-QD32 READ-MB/s CAT-MB/s
i=0
for rs in 128K 1M; do for comp in off lz4; do for enc in off aes-256-gcm; do
    i=$((i + 1))
    ds=bench/fio$i
    opts=(-o "recordsize=$rs" -o "compression=$comp")
    if [ "$enc" != off ]; then
        printf 'a throw-away passphrase\n' | "$tarn" dataset create "${opts[@]}" -o "encryption=$enc" -o keyformat=passphrase "$ds" >/dev/null
    else
        "$tarn" dataset create "${opts[@]}" "$ds" >/dev/null
    fi
    mnt=$work/mnt$i
    mkdir -p "$mnt"
    "$tarn" mount "$ds" "$mnt" >/dev/null
    f=$mnt/fio.dat
    fio --name=lay --filename="$f" --size="$size" --rw=write --bs=1M --ioengine=psync --direct=1 --end_fsync=1 >/dev/null 2>&1
    drop
    read -r _ cat < <(fio_job "$f" read 1M 1)
    drop
    read -r _ seq < <(fio_job "$f" read 1M 4)
    read -r rr _ < <(fio_job "$f" randread 4k 32)
    read -r r1 _ < <(fio_job "$f" randread 4k 1)
    read -r w32 _ < <(fio_job "$f" randwrite 4k 32)
    printf '%-10s %-12s %-12s %12s %12s %12s %10s %10s\n' "$rs" "$comp" "$enc" "$rr" "$r1" "$w32" "$seq" "$cat"
    "$tarn" unmount "$mnt" >/dev/null
    "$tarn" destroy -r "$ds" >/dev/null
done; done; done
