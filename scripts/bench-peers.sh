#!/usr/bin/env bash
# Peer benchmark: tarn beside kernel btrfs and nfs-ganesha, one run, one table.
#
# Both sides get four sparse files of the same size on the same disk: tarn a
# raidz1 pool of them; the peer a btrfs with data raid5 and metadata raid1
# (mkfs.btrfs -d raid5 -m raid1) on four loop devices made from them (plain
# buffered loop devices: the same host page-cache path as tarn's member
# files). tarn's datasets for the fuse and nfs sections have recordsize=1M
# and compression=off; btrfs mounts with its defaults (no compression).
# nfs-ganesha (FSAL VFS) exports a directory of that btrfs.
#
#   section  workload                                   unit     target tarn/peer
#   fuse     fio seq write bs=1M, SIZE, end_fsync         MiB/s    >= 0.9
#            fio seq read bs=1M, cold                      MiB/s    >= 1.0
#            fio seq read bs=1M, warm (the second read)    MiB/s    >= 0.8
#            fio 4k randread, 16 jobs psync, RUNTIME s     IOPS     >= 1.0
#            create / stat / delete FILES empty files      files/s  >= 0.5 each
#   nfs      1 MiB WRITEs of SIZE + COMMIT, 8 conns        MiB/s    >= 1.0
#            1 MiB READs of it, 8 conns, cold and warm     MiB/s    >= 1.0
#            4k random READs, 8 conns, RUNTIME s, cold     IOPS     >= 1.0
#            READDIRPLUS of a LIST_FILES directory         entries/s >= 1.0
#              (what `ls -l` costs a Linux client; warm: the mean of 10
#              passes; cold: one pass on a fresh server)
#            CREATE of those files, 8 conns                files/s  (no target)
#            daemon peak RSS under 16 NFS connections      MiB      <= cache+dirty+256
#              (write, read and random reads; VmHWM)
#   sync     fio randwrite 4k / 64k, fsync after each      p99 us   no regression
#            write (fsync p99), without and with a log
#            device (a file on tmpfs) added to the pool;
#            as bench-sync.sh: a 64 MiB file, dataset with
#            the default recordsize (128K), sync=standard
#   idle     daemon CPU over IDLE_SECONDS while idle       CPU s    ~ 0
#            bytes written while idle                      bytes    0
#
# Peers: the fuse and sync sections run fio on the btrfs mount and on tarn's
# FUSE mount; the nfs section runs the same client, nfs-bench (the NFSv3 load
# generator in crates/tarn-nfs/examples; it uses C TCP connections with D
# calls in flight each), against nfs-ganesha and against tarn's NFS server.
# "Cold" means a fresh server start (the tarn daemon, or nfs-ganesha) and
# dropped kernel caches (echo 3 > /proc/sys/vm/drop_caches), so a block
# cache inside the daemon is cold too; for the btrfs side it means dropped
# caches. The idle section compares with nfs-ganesha's CPU and the btrfs
# loop devices' writes in the same minute.
#
# NFS setup: nfs-ganesha registers its programs with rpcbind and will not
# start without one (it exits with "Cannot register NFS V3 on TCP", also
# with UDP, NLM and RQUOTA off). So the script makes a private network namespace with
# only loopback up, runs rpcbind (with its own /run, in a mount namespace of
# its own, so it meets no other rpcbind) and nfs-ganesha in it, and runs
# tarn's daemon (its NFS server on 127.0.0.1) and the client there too: both
# servers are measured the same way. nfs-ganesha serves NFSv3 over TCP only
# (no NLM, RQUOTA, UDP), MOUNT on its own port (nfs-bench --mount-port),
# Mount_Path_Pseudo so both exports are /nfs; otherwise its defaults. A
# check with libnfs's nfs-ls first confirms that both exports answer an
# independent client.
#
# Every figure notes what bounded it as far as the run can tell: the share
# of the machine's CPU in use (all cores, /proc/stat), iowait, and the
# server's own CPU in cores (tarn daemon or nfs-ganesha; the kernel's work
# for btrfs is partly in the client's time, partly in kernel threads), and
# the client's (fio or nfs-bench). >= 85% busy reads as CPU-bound, >= 20%
# iowait as disk-bound, else as latency-bound (round trips, one thread);
# iowait shows only while a CPU would otherwise idle, so on a busy machine
# disk waits hide behind the CPU figure.
# The machine's figure counts everything on it: whatever the client and
# server do not explain went to kernel threads or to other work, so run it
# on a quiet machine. Client, servers and disk share one machine: these are
# loopback figures.
#
# Not a test: nothing here fails on a timing. Not part of CI. Needs root,
# /dev/fuse, loop devices and btrfs in the kernel, and network namespaces;
# installs what is missing with apt-get (btrfs-progs, fio, nfs-ganesha,
# nfs-ganesha-vfs, rpcbind, libnfs-utils, iproute2, python3), without
# starting their services (a temporary policy-rc.d during the install).
#
# Output: the table on stdout and in OUT.md, the raw figures in OUT.json
# (OUT defaults to target/bench-peers). 1 GiB takes 10-15 minutes on two
# cores.
#
# Usage: scripts/bench-peers.sh [--only fuse|nfs|sync|idle[,...]]
# Env:   SIZE_MIB (default 1024), FILES (100000), LIST_FILES (20000),
#        RUNTIME (random-read seconds, 30), SYNC_SECONDS (20),
#        IDLE_SECONDS (60), CONNS (8), DEPTH (calls in flight per NFS
#        connection, 8), CACHE_MIB (64) and DIRTY_MIB (256) for the daemon,
#        BENCH_DIR (where the temp dir goes; default the repo), OUT,
#        TARN_BIN, NFS_BENCH.
# A quick pass: SIZE_MIB=256 FILES=10000 RUNTIME=10 SYNC_SECONDS=5 IDLE_SECONDS=20
set -euo pipefail
only=fuse,nfs,idle,sync
while [ $# -gt 0 ]; do
    case $1 in
        --only) only=${2:?--only needs a section}; shift 2 ;;
        --only=*) only=${1#--only=}; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "usage: $0 [--only fuse|nfs|sync|idle[,...]]" >&2; exit 2 ;;
    esac
done
for s in ${only//,/ }; do
    case $s in fuse|nfs|sync|idle) ;; *) echo "bench-peers: unknown section $s" >&2; exit 2 ;; esac
done
want() { [[ ",$only," == *",$1,"* ]]; }

size_mib=${SIZE_MIB:-1024}
nfiles=${FILES:-100000}
list_files=${LIST_FILES:-20000}
runtime=${RUNTIME:-30}
sync_s=${SYNC_SECONDS:-20}
idle_s=${IDLE_SECONDS:-60}
conns=${CONNS:-8}
depth=${DEPTH:-8}
cache_mib=${CACHE_MIB:-64}
dirty_mib=${DIRTY_MIB:-256}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/target/bench-peers}
tarn=${TARN_BIN:-$root/target/release/tarn}
nfs_bench=${NFS_BENCH:-$root/target/release/examples/nfs-bench}

if [ "$(id -u)" -ne 0 ] || [ ! -e /dev/fuse ]; then
    echo "bench-peers: needs root and /dev/fuse" >&2
    exit 1
fi

# ----- what it needs -----------------------------------------------------------
missing=()
for pkg in btrfs-progs fio nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils iproute2 python3; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench-peers: installing ${missing[*]}" >&2
    # Keep the packages' services (nfs-ganesha, rpcbind) from starting.
    policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod +x "$policy"
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [ -z "$policy" ] || rm -f "$policy"
fi
[ -x "$tarn" ] || (cd "$root" && cargo build --release -q -p tarn)
[ -x "$nfs_bench" ] || (cd "$root" && cargo build --release -q -p tarn-nfs --example nfs-bench)

# ----- the stage -----------------------------------------------------------------
work=$(mktemp -d "${BENCH_DIR:-$root}/bench.XXXXXX")
slog=$(mktemp /dev/shm/tarn-bench-slog.XXXXXX)
ns=tarn-bench-$$
nsp=/run/netns/$ns
daemon= ganesha= rpcbind= made_ns=
loops=()
tarn_port=20490 ganesha_port=2049 ganesha_mnt_port=20048
export TARN_SOCKET=$work/tarn.sock

stop_daemon() {
    [ -n "$daemon" ] || return 0
    timeout 120 "$tarn" daemon stop >/dev/null 2>&1 || kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    daemon=
}
stop_ganesha() {
    [ -n "$ganesha" ] || return 0
    kill "$ganesha" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$ganesha" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$ganesha" 2>/dev/null || true
    wait "$ganesha" 2>/dev/null || true
    ganesha=
}
cleanup() {
    set +e
    stop_daemon
    for m in "$work/tarn" "$work/tarn-sync"; do mountpoint -q "$m" && umount -l "$m"; done
    stop_ganesha
    if [ -n "$rpcbind" ]; then kill "$rpcbind" 2>/dev/null; wait "$rpcbind" 2>/dev/null; fi
    [ -z "$made_ns" ] || ip netns del "$ns" 2>/dev/null
    if mountpoint -q "$work/btrfs"; then
        umount "$work/btrfs" 2>/dev/null || { sleep 1; umount -l "$work/btrfs"; }
    fi
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
    rm -rf "$work" "$slog"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
in_ns() { nsenter --net="$nsp" "$@"; }
listening() { [ -n "$(in_ns ss -Htln "sport = :$1")" ]; }
clk=$(getconf CLK_TCK)
# CPU time of a process in clock ticks (utime + stime; fields after "(comm)").
ticks() { if [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ]; then sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; else echo 0; fi; }
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
read -r run_tot0 run_busy0 _ < <(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, t - $5 - $6, $6 }' /proc/stat)
run_ck0=$(sed 's/.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }')
member_mib=$((size_mib * 2 + 2048))
ip netns add "$ns"
made_ns=1
ip -n "$ns" link set lo up

# The peer: btrfs raid5 data / raid1 metadata on four loop devices.
mkdir -p "$work/btrfs" "$work/tarn"
for i in 0 1 2 3; do
    truncate -s "${member_mib}M" "$work/b$i"
    loops+=("$(losetup -f --show "$work/b$i")")
done
mkfs.btrfs -q -f -d raid5 -m raid1 "${loops[@]}" >/dev/null 2>"$work/mkfs.log" ||
    { cat "$work/mkfs.log" >&2; exit 1; }
mount -t btrfs "${loops[0]}" "$work/btrfs"
mkdir -p "$work/btrfs/fuse" "$work/btrfs/nfs"

# rpcbind for nfs-ganesha, in the namespace, with a /run of its own (the
# mount namespace is made after the btrfs mount, so nfs-ganesha sees it).
# nsenter, unshare and sh each exec the next: $! is rpcbind itself (and
# below, the daemon and nfs-ganesha themselves).
nsenter --net="$nsp" unshare --mount --propagation private \
    sh -c 'mount -t tmpfs tarn-bench-run /run && mkdir -p /run/rpcbind && exec rpcbind -f -w' \
    2>"$work/rpcbind.log" &
rpcbind=$!
for _ in $(seq 100); do listening 111 && break; sleep 0.1; done
listening 111 || { echo "bench-peers: rpcbind did not start" >&2; cat "$work/rpcbind.log" >&2; exit 1; }

cat > "$work/ganesha.conf" <<EOF
NFS_CORE_PARAM {
    Protocols = 3;
    NFS_Port = $ganesha_port;
    MNT_Port = $ganesha_mnt_port;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
    Mount_Path_Pseudo = true;
}
NFSV4 { Graceless = true; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
    Export_Id = 1;
    Path = $work/btrfs/nfs;
    Pseudo = /nfs;
    Protocols = 3;
    Transports = TCP;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    FSAL { Name = VFS; }
}
EOF
start_ganesha() {
    nsenter --net="$nsp" --mount="/proc/$rpcbind/ns/mnt" ganesha.nfsd -F -f "$work/ganesha.conf" \
        -L "$work/ganesha.log" -N NIV_EVENT -p "$work/ganesha.pid" &
    ganesha=$!
    for _ in $(seq 300); do
        listening "$ganesha_port" && listening "$ganesha_mnt_port" && return 0
        kill -0 "$ganesha" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench-peers: nfs-ganesha did not start; its log:" >&2
    grep -v DBUS "$work/ganesha.log" | tail -20 >&2
    exit 1
}

start_daemon() {
    nsenter --net="$nsp" "$tarn" daemon --state-dir "$work/state" --socket "$TARN_SOCKET" \
        --nfs "127.0.0.1:$tarn_port" --cache-mib "$cache_mib" --dirty-max-mib "$dirty_mib" \
        2>>"$work/daemon.log" &
    daemon=$!
    for _ in $(seq 100); do "$tarn" daemon ping >/dev/null 2>&1 && break; sleep 0.1; done
    "$tarn" daemon ping >/dev/null || { tail "$work/daemon.log" >&2; exit 1; }
}
# After a restart: the pool imported, the dataset mounted, NFS listening.
wait_ready() {
    for _ in $(seq 600); do
        mountpoint -q "$work/tarn" && listening "$tarn_port" && return 0
        sleep 0.1
    done
    echo "bench-peers: the daemon did not bring its mount and NFS back" >&2
    tail "$work/daemon.log" >&2
    exit 1
}
# Cold: a fresh server and no kernel caches.
cold_tarn() { stop_daemon; drop; start_daemon; wait_ready; drop; }
cold_ganesha() { stop_ganesha; drop; start_ganesha; drop; }

start_daemon
for i in 0 1 2 3; do truncate -s "${member_mib}M" "$work/t$i"; done
"$tarn" pool create bench raidz1 "$work"/t0 "$work"/t1 "$work"/t2 "$work"/t3 >/dev/null
"$tarn" dataset create -o recordsize=1M -o compression=off -o "mountpoint=$work/tarn" bench/fs >/dev/null
"$tarn" dataset create -o recordsize=1M -o compression=off bench/nfs >/dev/null
"$tarn" share add nfs bench/nfs --nfs 127.0.0.1/32 --no-root-squash >/dev/null
wait_ready
start_ganesha

# Both exports answer an independent client (libnfs).
for p in "$tarn_port $tarn_port" "$ganesha_port $ganesha_mnt_port"; do
    set -- $p
    in_ns nfs-ls "nfs://127.0.0.1/nfs?nfsport=$1&mountport=$2&version=3" >/dev/null ||
        { echo "bench-peers: nfs-ls cannot list the export on port $1" >&2; exit 1; }
done

# ----- figures and notes ---------------------------------------------------------
# Rows, in order: key, label, unit, peer name, target kind (ratio_ge, ratio_le,
# abs_le, none), target value, target text.
keys=()
declare -A label unit peer_name tkind tval ttext val note
row() {
    keys+=("$1"); label[$1]=$2; unit[$1]=$3; peer_name[$1]=$4
    tkind[$1]=$5; tval[$1]=$6; ttext[$1]=$7
}
# A probe around one measurement: the machine's CPU (all cores) and iowait
# from /proc/stat; the client's CPU (the commands this script ran and
# waited for: its children's times in /proc/$$/stat) and the server's.
# Measure with $(...), not <(...), so the client is waited for at once.
cpu_stat() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, t - $5 - $6, $6 }' /proc/stat; }
child_ticks() { sed 's/.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }'; }
probe_begin() {
    p_pid=${1:-}; p_t0=$(now); p_tk0=$(ticks "$p_pid"); p_ck0=$(child_ticks)
    read -r p_tot0 p_busy0 p_io0 < <(cpu_stat)
}
# Prints the note for the probe, e.g. "CPU-bound: cpu 97% (client 0.4,
# server 1.3 cores), io 1%". What the machine spent beyond client and
# server went to kernel threads (loop devices, btrfs workers) or to others.
probe_end() {
    local t1 tk1 ck1 tot1 busy1 io1
    t1=$(now); tk1=$(ticks "$p_pid"); ck1=$(child_ticks)
    read -r tot1 busy1 io1 < <(cpu_stat)
    awk -v dt="$(awk -v a="$p_t0" -v b="$t1" 'BEGIN { print b - a }')" \
        -v tot=$((tot1 - p_tot0)) -v busy=$((busy1 - p_busy0)) -v io=$((io1 - p_io0)) \
        -v tk=$((tk1 - p_tk0)) -v ck=$((ck1 - p_ck0)) -v clk="$clk" -v srv="${p_pid:+1}" 'BEGIN {
        b = tot ? 100 * busy / tot : 0; w = tot ? 100 * io / tot : 0
        v = b >= 85 ? "CPU-bound" : w >= 20 ? "disk-bound" : "latency-bound"
        s = sprintf("%s: cpu %.0f%% (client %.2f", v, b, ck / clk / dt)
        if (srv) s = s sprintf(", server %.2f", tk / clk / dt)
        print s sprintf(" cores), io %.0f%%", w) }'
}
# put SIDE KEY VALUE NOTE
put() { val[$1.$2]=$3; note[$1.$2]=$4; }

# fio: $1 dir, $2 job name, $3.. fio args; prints fio's terse line.
fio_run() {
    local dir=$1 name=$2; shift 2
    fio --name="$name" --directory="$dir" --filename=bench.dat --size="${size_mib}M" \
        --ioengine=psync --output-format=terse --terse-version=3 "$@" 2>>"$work/fio.err"
}
read_mib() { awk -F';' '{ printf "%.0f", $7 / 1024 }'; }
read_iops() { awk -F';' '{ printf "%.0f", $8 }'; }
write_mib() { awk -F';' '{ printf "%.0f", $48 / 1024 }'; }

# Create, stat and delete $nfiles empty files under $1; prints three rates.
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

# ----- FUSE vs kernel btrfs ------------------------------------------------------
if want fuse; then
    row fuse.sw "FUSE seq write 1M, end_fsync" MiB/s btrfs ratio_ge 0.9 "≥ 0.9×"
    row fuse.sr "FUSE seq read 1M, cold" MiB/s btrfs ratio_ge 1.0 "≥ 1.0×"
    row fuse.wr "FUSE seq read 1M, warm" MiB/s btrfs ratio_ge 0.8 "≥ 0.8×"
    row fuse.rr "FUSE 4k randread, 16 jobs" IOPS btrfs ratio_ge 1.0 "≥ 1.0×"
    row fuse.fc "FUSE create $nfiles files" files/s btrfs ratio_ge 0.5 "≥ 0.5×"
    row fuse.fs "FUSE stat $nfiles files" files/s btrfs ratio_ge 0.5 "≥ 0.5×"
    row fuse.fd "FUSE delete $nfiles files" files/s btrfs ratio_ge 0.5 "≥ 0.5×"
    row fuse.rss "daemon peak RSS, 16 fio jobs" MiB "-" abs_le $((cache_mib + dirty_mib + 256)) \
        "≤ $((cache_mib + dirty_mib + 256)) MiB"
    for side in peer tarn; do
        if [ $side = peer ]; then dir=$work/btrfs/fuse; else dir=$work/tarn; fi
        srv() { [ $side = tarn ] && echo "$daemon" || true; }
        echo "fuse: $side" >&2
        drop; probe_begin "$(srv)"
        put $side fuse.sw "$(fio_run "$dir" w --rw=write --bs=1M --end_fsync=1 | write_mib)" "$(probe_end)"
        if [ $side = tarn ]; then cold_tarn; else drop; fi
        probe_begin "$(srv)"
        put $side fuse.sr "$(fio_run "$dir" r --rw=read --bs=1M | read_mib)" "$(probe_end)"
        probe_begin "$(srv)"
        put $side fuse.wr "$(fio_run "$dir" r --rw=read --bs=1M --invalidate=0 | read_mib)" "$(probe_end)"
        if [ $side = tarn ]; then cold_tarn; else drop; fi
        probe_begin "$(srv)"
        put $side fuse.rr "$(fio_run "$dir" rr --rw=randread --bs=4k --numjobs=16 --group_reporting \
            --time_based --runtime="$runtime" | read_iops)" "$(probe_end)"
        [ $side = tarn ] && put tarn fuse.rss $(($(kib "$daemon" VmHWM) / 1024)) "VmHWM since the cold start"
        rm -f "$dir/bench.dat"
        probe_begin "$(srv)"
        r=$(files "$dir")
        n=$(probe_end)
        read -r c s d <<<"$r"
        put $side fuse.fc "$c" "$n"; put $side fuse.fs "$s" "$n"; put $side fuse.fd "$d" "$n"
    done
fi

# ----- NFS vs nfs-ganesha ----------------------------------------------------------
if want nfs; then
    bound=$((cache_mib + dirty_mib + 256))
    row nfs.sw "NFS write 1M x$conns + COMMIT" MiB/s nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.sr "NFS read 1M x$conns, cold" MiB/s nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.wr "NFS read 1M x$conns, warm" MiB/s nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.rr "NFS 4k randread x$conns, cold" IOPS nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.mk "NFS create $list_files files x$conns" files/s nfs-ganesha none 0 "-"
    row nfs.ls "NFS ls -l $list_files files, warm" entries/s nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.lc "NFS ls -l $list_files files, cold" entries/s nfs-ganesha ratio_ge 1.0 "≥ 1.0×"
    row nfs.rss "daemon peak RSS, 16 NFS conns" MiB nfs-ganesha abs_le "$bound" "≤ $bound MiB"
    field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }
    for side in peer tarn; do
        echo "nfs: $side" >&2
        if [ $side = peer ]; then
            nb() { in_ns "$nfs_bench" --server "127.0.0.1:$ganesha_port" --mount-port "$ganesha_mnt_port" \
                --export /nfs --depth "$depth" "$@"; }
            cold() { cold_ganesha; }
            srv() { echo "$ganesha"; }
        else
            nb() { in_ns "$nfs_bench" --server "127.0.0.1:$tarn_port" --export /nfs --depth "$depth" "$@"; }
            cold() { cold_tarn; }
            srv() { echo "$daemon"; }
        fi
        drop; probe_begin "$(srv)"
        r=$(nb --file seq.dat --mode write --size-mib "$size_mib" --conns "$conns" | field mib_per_s)
        put $side nfs.sw "${r%.*}" "$(probe_end)"
        cold; probe_begin "$(srv)"
        r=$(nb --file seq.dat --mode read --size-mib "$size_mib" --conns "$conns" | field mib_per_s)
        put $side nfs.sr "${r%.*}" "$(probe_end)"
        probe_begin "$(srv)"
        r=$(nb --file seq.dat --mode read --size-mib "$size_mib" --conns "$conns" | field mib_per_s)
        put $side nfs.wr "${r%.*}" "$(probe_end)"
        cold; probe_begin "$(srv)"
        r=$(nb --file seq.dat --mode randread4k --conns "$conns" --seconds "$runtime" | field iops)
        put $side nfs.rr "$r" "$(probe_end)"
        probe_begin "$(srv)"
        r=$(nb --file list --mode mkfiles --count "$list_files" --conns "$conns" | field iops)
        put $side nfs.mk "$r" "$(probe_end)"
        nb --file list --mode list >/dev/null
        probe_begin "$(srv)"
        r=$(nb --file list --mode list --passes 10 | field entries_per_s)
        put $side nfs.ls "$r" "$(probe_end)"
        cold; probe_begin "$(srv)"
        r=$(nb --file list --mode list | field entries_per_s)
        put $side nfs.lc "$r" "$(probe_end)"
        # 16 clients on a fresh server: the peak resident set it reaches.
        cold; probe_begin "$(srv)"
        nb --file rss.dat --mode write --size-mib "$size_mib" --conns 16 >/dev/null
        nb --file rss.dat --mode read --size-mib "$size_mib" --conns 16 >/dev/null
        nb --file rss.dat --mode randread4k --conns 16 --seconds "$runtime" >/dev/null
        n=$(probe_end)
        put $side nfs.rss $(($(kib "$(srv)" VmHWM) / 1024)) "$n; VmHWM of a fresh server"
    done
fi

# ----- idle ------------------------------------------------------------------------
if want idle; then
    row idle.cpu "idle: server CPU over ${idle_s} s" "CPU s" nfs-ganesha abs_le 0.1 "≈ 0 (≤ 0.1 s)"
    row idle.wr "idle: bytes written over ${idle_s} s" bytes "btrfs devices" abs_le 0 "0"
    echo "idle: ${idle_s} s" >&2
    # Let everything written so far reach the disks: a pool sync, then two
    # txg intervals with nothing to do.
    "$tarn" pool sync bench >/dev/null
    sync
    sleep 12
    loop_written() {
        local s=0 l
        for l in "${loops[@]}"; do s=$((s + $(awk '{ print $7 }' "/sys/block/${l#/dev/}/stat"))); done
        echo $((s * 512))
    }
    io_field() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/io"; }
    members() { stat -c '%n %s %y' "$work"/t0 "$work"/t1 "$work"/t2 "$work"/t3; }
    t_tk0=$(ticks "$daemon"); g_tk0=$(ticks "$ganesha")
    t_wb0=$(io_field "$daemon" write_bytes); t_wc0=$(io_field "$daemon" wchar)
    b_wr0=$(loop_written); m0=$(members)
    sleep "$idle_s"
    t_tk1=$(ticks "$daemon"); g_tk1=$(ticks "$ganesha")
    t_wb1=$(io_field "$daemon" write_bytes); t_wc1=$(io_field "$daemon" wchar)
    b_wr1=$(loop_written); m1=$(members)
    changed=$(diff <(echo "$m0") <(echo "$m1") | grep -c '^>' || true)
    cpu_s() { awk -v t="$1" -v c="$clk" 'BEGIN { printf "%.2f", t / c }'; }
    put peer idle.cpu "$(cpu_s $((g_tk1 - g_tk0)))" "nfs-ganesha, idle beside; btrfs is in the kernel"
    put tarn idle.cpu "$(cpu_s $((t_tk1 - t_tk0)))" "daemon with a FUSE mount and an NFS share"
    put peer idle.wr $((b_wr1 - b_wr0)) "sectors written to the four loop devices"
    put tarn idle.wr $((t_wb1 - t_wb0)) "daemon write_bytes; write(2) bytes $((t_wc1 - t_wc0)); members modified: $changed of 4"
fi

# ----- fsync latency ---------------------------------------------------------------
if want sync; then
    echo "sync: ${sync_s} s per run" >&2
    # As in bench-sync.sh: a dataset of its own with the default recordsize
    # (128K), sync=standard, and a 64 MiB file on each side.
    mkdir -p "$work/tarn-sync" "$work/btrfs/sync"
    "$tarn" dataset create -o compression=off -o sync=standard -o "mountpoint=$work/tarn-sync" bench/sync >/dev/null
    for _ in $(seq 100); do mountpoint -q "$work/tarn-sync" && break; sleep 0.1; done
    mountpoint -q "$work/tarn-sync" || { echo "bench-peers: bench/sync is not mounted" >&2; exit 1; }
    # ops/s and fsync p99 (us) of one fio run, from its JSON.
    sync_run() {
        local dir=$1 bs=$2 json=$work/fio-sync.json
        fio --name="sync-$bs" --directory="$dir" --filename=sync.dat --size=64M \
            --rw=randwrite --bs="$bs" --fsync=1 --ioengine=psync \
            --runtime="$sync_s" --time_based --output-format=json >"$json" 2>>"$work/fio.err"
        rm -f "$dir/sync.dat"
        python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print("%.0f %.0f" % (j["write"]["iops"], j["sync"]["lat_ns"].get("percentile", {}).get("99.000000", 0) / 1000))' "$json"
    }
    for bs in 4k 64k; do
        row sync.$bs "fsync p99, randwrite $bs" us btrfs none 0 "no regression"
        row slog.$bs "fsync p99, randwrite $bs, log device" us btrfs none 0 "no regression"
        probe_begin
        r=$(sync_run "$work/btrfs/sync" $bs)
        n=$(probe_end)
        read -r ops p99 <<<"$r"
        put peer sync.$bs "$p99" "$ops writes+fsyncs/s; $n"
        put peer slog.$bs "$p99" "$ops writes+fsyncs/s (no log device); $n"
        probe_begin "$daemon"
        r=$(sync_run "$work/tarn-sync" $bs)
        read -r ops p99 <<<"$r"
        put tarn sync.$bs "$p99" "$ops writes+fsyncs/s; $(probe_end)"
    done
    truncate -s 256M "$slog"
    "$tarn" pool add bench log "$slog" >/dev/null
    for bs in 4k 64k; do
        probe_begin "$daemon"
        r=$(sync_run "$work/tarn-sync" $bs)
        read -r ops p99 <<<"$r"
        put tarn slog.$bs "$p99" "$ops writes+fsyncs/s, log on tmpfs; $(probe_end)"
    done
fi

# ----- the table ---------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }
met() {
    local k=$1 t=${val[tarn.$1]:-} r=$2
    case ${tkind[$k]} in
        ratio_ge) [ "$r" = - ] && echo - || awk -v r="$r" -v x="${tval[$k]}" 'BEGIN { print (r >= x) ? "yes" : "no" }' ;;
        abs_le) [ -z "$t" ] && echo - || awk -v t="$t" -v x="${tval[$k]}" 'BEGIN { print (t <= x) ? "yes" : "no" }' ;;
        *) echo - ;;
    esac
}
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
# The whole run: the machine's busy share and this benchmark's own (its
# waited-for children, the live daemon, nfs-ganesha and rpcbind).
read -r run_tot1 run_busy1 _ < <(cpu_stat)
run_ours=$(( $(child_ticks) - run_ck0 + $(ticks "$daemon") + $(ticks "$ganesha") + $(ticks "$rpcbind") ))
run_cpu=$(awk -v t=$((run_tot1 - run_tot0)) -v b=$((run_busy1 - run_busy0)) -v o="$run_ours" \
    'BEGIN { printf "machine %.0f%% busy, this benchmark'"'"'s processes %.0f%%", 100 * b / t, 100 * o / t }')
{
    echo "# tarn beside btrfs and nfs-ganesha"
    echo
    echo "$(date -u +%F) tarn $commit; size $size_mib MiB; raidz1 of 4 files (recordsize 1M, compression off)"
    echo "vs btrfs raid5/raid1 on 4 loop devices ($(mkfs.btrfs --version 2>/dev/null | head -1 | awk '{ print $NF }')," \
        "kernel $(uname -r)); nfs-ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha 2>/dev/null) (FSAL VFS);"
    echo "NFS client nfs-bench, $conns conns x $depth calls in flight; CPUs $(nproc);" \
        "load before/after $load0 / $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "CPU over the run: $run_cpu (the rest: kernel threads and other work on the machine)"
    echo
    echo "| workload | unit | peer | peer figure | tarn figure | tarn/peer | target | met | what limits it |"
    echo "|---|---|---|---:|---:|---:|---|---|---|"
    for k in "${keys[@]}"; do
        p=${val[peer.$k]:--} t=${val[tarn.$k]:--}
        r=$(ratio "$t" "$p")
        echo "| ${label[$k]} | ${unit[$k]} | ${peer_name[$k]} | $p | $t | $r | ${ttext[$k]} | $(met "$k" "$r") |" \
            "tarn: ${note[tarn.$k]:--}; peer: ${note[peer.$k]:--} |"
    done
} | tee "$out.md"
{
    printf '{\n  "date": "%s", "commit": "%s", "size_mib": %s, "files": %s, "list_files": %s,\n' \
        "$(date -u +%FT%TZ)" "$commit" "$size_mib" "$nfiles" "$list_files"
    printf '  "runtime_s": %s, "conns": %s, "depth": %s, "cache_mib": %s, "dirty_mib": %s, "cpus": %s,\n' \
        "$runtime" "$conns" "$depth" "$cache_mib" "$dirty_mib" "$(nproc)"
    printf '  "load_before": "%s", "load_after": "%s", "cpu_over_run": "%s",\n' \
        "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$run_cpu"
    printf '  "rows": [\n'
    sep=
    num() { [[ $1 =~ ^-?[0-9.]+$ ]] && echo "$1" || echo null; }
    for k in "${keys[@]}"; do
        p=${val[peer.$k]:-} t=${val[tarn.$k]:-}
        r=$(ratio "$t" "$p")
        printf '%s    {"key": "%s", "workload": "%s", "unit": "%s", "peer": "%s", "peer_value": %s, "tarn_value": %s, "ratio": %s, "target": "%s", "met": "%s", "tarn_note": "%s", "peer_note": "%s"}' \
            "$sep" "$k" "${label[$k]}" "${unit[$k]}" "${peer_name[$k]}" "$(num "$p")" "$(num "$t")" "$(num "$r")" \
            "${ttext[$k]}" "$(met "$k" "$r")" "${note[tarn.$k]:-}" "${note[peer.$k]:-}"
        sep=$',\n'
    done
    printf '\n  ]\n}\n'
} > "$out.json"
echo "written: $out.md $out.json" >&2
