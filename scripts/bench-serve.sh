#!/usr/bin/env bash
# Serving benchmark: NFSv3 and WebDAV from the daemon on loopback, beside
# raw loopback TCP as the peer, in one run. A raidz1 pool of 4 sparse files,
# dataset bench/fs (recordsize 1M, compression off) shared over both.
#
#   raw TCP        SIZE MiB through one loopback connection (iperf3, nc, or
#                  a small Python socket pair, whichever is installed)
#   nfs write      nfs-bench: 1 MiB UNSTABLE WRITEs + COMMIT, 1 and 8 conns
#   nfs read       nfs-bench: 1 MiB READs of that file, cold, 1 and 8 conns
#   nfs randread   nfs-bench: 4 KiB READs at random offsets, 30 s
#   webdav put     curl -T of SIZE MiB, then `tarn pool sync` (as COMMIT)
#   webdav get     curl -o /dev/null of that file, cold
#
# Reports MiB/s (IOPS for randread), the ratio to raw TCP, and the daemon's
# CPU seconds per GiB moved (utime+stime from /proc). Not a test: nothing
# here fails on a timing. Cold reads need root (drop_caches); without it the
# read figures are warm and the table says so. Client and server share the
# machine's CPUs, so the figures are a loopback bound, not a network one.
#
# Usage: scripts/bench-serve.sh [SIZE_MIB]   (default 1024)
# Env:   BENCH_DIR (where the temp dir goes; default the repo), DEPTH
#        (calls in flight per NFS connection; default 8)
set -euo pipefail
size_mib=${1:-1024}
depth=${DEPTH:-8}
# root, tarn, work, TARN_SOCKET, now, drop/cold, free_port; stops
# $daemon at exit.
. "$(dirname "$0")/bench-common.sh"
nfs_bench=$root/target/release/examples/nfs-bench
# A no-op when both are up to date.
(cd "$root" && cargo build --release -q -p tarn -p tarn-nfs --bin tarn --example nfs-bench)
daemon=

bytes=$((size_mib << 20))
load0=$(cut -d' ' -f1-3 /proc/loadavg)
clk=$(getconf CLK_TCK)
# The daemon's CPU time in clock ticks (utime + stime; fields after "(comm)").
cpu_ticks() { sed 's/.*) //' "/proc/$daemon/stat" | awk '{ print $12 + $13 }'; }

# ----- raw TCP peer ----------------------------------------------------------
# Prints "TOOL SECONDS" for $bytes through one loopback connection.
raw_tcp() {
    local port t0 t1 srv
    port=$(free_port)
    if command -v iperf3 >/dev/null; then
        iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
        srv=$!
        sleep 0.5
        # The receiver's bitrate in MBytes/sec, turned back into seconds.
        iperf3 -c 127.0.0.1 -p "$port" -n "$bytes" -f M 2>/dev/null |
            awk -v b="$bytes" '/receiver/ { for (i = 1; i < NF; i++) if ($(i + 1) == "MBytes/sec") r = $i }
                               END { if (r > 0) printf "iperf3 %.3f\n", b / 1048576 / r; else exit 1 }'
        wait "$srv" 2>/dev/null || true
        return
    fi
    local nc_listen nc_send
    if command -v nc >/dev/null; then
        local help
        help=$(nc -h 2>&1 || true)
        case $help in
            *OpenBSD*) nc_listen=(nc -l 127.0.0.1 "$port"); nc_send=(nc -N 127.0.0.1 "$port") ;;
            *Ncat*) nc_listen=(nc -l 127.0.0.1 "$port"); nc_send=(nc --send-only 127.0.0.1 "$port") ;;
            *"-q secs"*|*"[v1."*) nc_listen=(nc -l -p "$port" -q 0); nc_send=(nc -q 0 127.0.0.1 "$port") ;;
        esac
    fi
    if [ -n "${nc_listen+x}" ]; then
        "${nc_listen[@]}" >/dev/null &
        srv=$!
        sleep 0.5
        t0=$(now)
        head -c "$bytes" /dev/zero | "${nc_send[@]}"
        wait "$srv"
        t1=$(now)
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "nc %.3f\n", b - a }'
        return
    fi
    python3 - "$bytes" <<'EOF'
import os, socket, sys, time
n = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]
pid = os.fork()
if pid == 0:
    c = socket.create_connection(("127.0.0.1", port))
    buf = memoryview(bytes(1 << 20))
    while n > 0:
        k = min(n, len(buf))
        c.sendall(buf[:k])
        n -= k
    c.close()
    os._exit(0)
conn, _ = srv.accept()
buf = bytearray(1 << 20)
got, t0 = 0, time.monotonic()
while True:
    k = conn.recv_into(buf)
    if not k:
        break
    got += k
t = time.monotonic() - t0
os.waitpid(pid, 0)
if got != n:
    sys.exit(f"raw TCP: received {got} of {n} bytes")
print(f"python {t:.3f}")
EOF
}

# ----- setup -------------------------------------------------------------------
member_mib=$((size_mib * 2 / 3 + 768))
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/d$i"; done
nfs_port=$(free_port)
dav_port=$(free_port)
while [ "$dav_port" = "$nfs_port" ]; do dav_port=$(free_port); done
"$tarn" daemon --state-dir "$work/state" --socket "$TARN_SOCKET" \
    --nfs "127.0.0.1:$nfs_port" --webdav "127.0.0.1:$dav_port" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
"$tarn" daemon ping >/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
"$tarn" pool create bench raidz1 "$work"/d0 "$work"/d1 "$work"/d2 "$work"/d3 >/dev/null
"$tarn" dataset create -o compression=off -o recordsize=1M bench/fs >/dev/null
password=bench-$RANDOM$RANDOM
echo "$password" | "$tarn" user add --password-stdin bench >/dev/null
# uid and gid of user "bench" from the JSON list (no jq needed).
read -r uid gid < <("$tarn" -o json user list | tr -d ' \n' | sed 's/},{/}\n{/g' | grep '"name":"bench"' |
    sed -E 's/.*"uid":([0-9]+).*"gid":([0-9]+).*/\1 \2/; s/.*"gid":([0-9]+).*"uid":([0-9]+).*/\2 \1/')
[ -n "${uid:-}" ] && [ -n "${gid:-}" ] || { echo "cannot find user bench's uid/gid" >&2; exit 1; }
"$tarn" share add fs bench/fs --nfs 127.0.0.1/32 --all-squash --anon-uid "$uid" --anon-gid "$gid" \
    --webdav bench=rw --owner bench >/dev/null
head -c "$bytes" /dev/urandom > "$work/data"

# ----- phases ------------------------------------------------------------------
# Each phase records: label, figure, unit, MiB/s for the ratio (or -), bytes moved, CPU ticks.
labels=() figures=() units=() rates=() moved=() ticks=()
record() { labels+=("$1"); figures+=("$2"); units+=("$3"); rates+=("$4"); moved+=("$5"); ticks+=("$6"); }
field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

read -r tool raw_s < <(raw_tcp) || true
[ -n "${raw_s:-}" ] || { echo "raw TCP measurement failed" >&2; exit 1; }
raw_rate=$(awk -v b="$bytes" -v s="$raw_s" 'BEGIN { printf "%.0f", b / 1048576 / s }')
record "raw TCP ($tool, 1 conn)" "$raw_rate" "MiB/s" "$raw_rate" "$bytes" -

nfs() { "$nfs_bench" --server "127.0.0.1:$nfs_port" --export /fs --file nfs.dat --depth "$depth" "$@"; }
for conns in 1 8; do
    c0=$(cpu_ticks)
    out=$(nfs --size-mib "$size_mib" --conns "$conns" --mode write)
    c1=$(cpu_ticks)
    r=$(field mib_per_s <<<"$out")
    record "nfs write 1M x$conns conn (+COMMIT)" "${r%.*}" "MiB/s" "$r" "$bytes" $((c1 - c0))
    drop
    c0=$(cpu_ticks)
    out=$(nfs --size-mib "$size_mib" --conns "$conns" --mode read)
    c1=$(cpu_ticks)
    r=$(field mib_per_s <<<"$out")
    record "nfs read 1M x$conns conn ($cold)" "${r%.*}" "MiB/s" "$r" "$bytes" $((c1 - c0))
done
drop
c0=$(cpu_ticks)
out=$(nfs --conns 4 --mode randread4k --seconds 30)
c1=$(cpu_ticks)
ops=$(field ops <<<"$out")
record "nfs randread 4k x4 conn ($cold)" "$(field iops <<<"$out")" "IOPS" - $((ops * 4096)) $((c1 - c0))

# WebDAV: the NFS file goes first, so the pool needs room for one copy only.
dav=http://127.0.0.1:$dav_port/fs
curl -fsS -u "bench:$password" -X DELETE "$dav/nfs.dat"
"$tarn" pool sync bench >/dev/null
cat "$work/data" > /dev/null # the source in page cache: time the server, not our disk
c0=$(cpu_ticks); t0=$(now)
curl -fsS -u "bench:$password" -T "$work/data" "$dav/dav.dat" -o /dev/null
"$tarn" pool sync bench >/dev/null
t1=$(now); c1=$(cpu_ticks)
r=$(awk -v b="$bytes" -v a="$t0" -v z="$t1" 'BEGIN { printf "%.1f", b / 1048576 / (z - a) }')
record "webdav PUT (+pool sync)" "${r%.*}" "MiB/s" "$r" "$bytes" $((c1 - c0))
drop
c0=$(cpu_ticks); t0=$(now)
got=$(curl -fsS -u "bench:$password" -o /dev/null -w '%{size_download}' "$dav/dav.dat")
t1=$(now); c1=$(cpu_ticks)
[ "$got" = "$bytes" ] || { echo "webdav GET returned $got of $bytes bytes" >&2; exit 1; }
r=$(awk -v b="$bytes" -v a="$t0" -v z="$t1" 'BEGIN { printf "%.1f", b / 1048576 / (z - a) }')
record "webdav GET ($cold)" "${r%.*}" "MiB/s" "$r" "$bytes" $((c1 - c0))

# ----- report ------------------------------------------------------------------
echo "size: $size_mib MiB; raidz1 of 4 files, recordsize 1M, compression off; NFS depth $depth per conn"
echo "load before/after: $load0 / $(cut -d' ' -f1-3 /proc/loadavg); CPUs: $(nproc)"
printf '%-34s %10s %-6s %8s %14s\n' workload figure unit "vs TCP" "daemon CPU s/GiB"
for i in "${!labels[@]}"; do
    ratio=- cpu=-
    [ "${rates[$i]}" != - ] && ratio=$(awk -v a="${rates[$i]}" -v b="$raw_rate" 'BEGIN { printf "%.2f", a / b }')
    [ "${ticks[$i]}" != - ] && cpu=$(awk -v t="${ticks[$i]}" -v c="$clk" -v b="${moved[$i]}" \
        'BEGIN { printf "%.2f", t / c / (b / 1073741824) }')
    printf '%-34s %10s %-6s %8s %14s\n' "${labels[$i]}" "${figures[$i]}" "${units[$i]}" "$ratio" "$cpu"
done
