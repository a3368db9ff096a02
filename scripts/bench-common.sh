# Sourced by the bench scripts: where the release binary and a scratch
# folder are, and the helpers they time and report with. Sets root, tarn,
# work (removed at exit, after stopping $daemon if set) and TARN_SOCKET.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tarn=${TARN_BIN:-$root/target/release/tarn}
[ -x "$tarn" ] || (cd "$root" && cargo build --release -q)
work=$(mktemp -d "${BENCH_DIR:-$root}/bench.XXXXXX")
export TARN_SOCKET=$work/tarn.sock
# Stops $daemon (exporting its pools; killed if it does not answer) and
# removes the scratch folder; a script with more to stop calls it from
# its own exit trap.
cleanup_common() {
    if [ -n "${daemon:-}" ]; then
        "$tarn" daemon stop >/dev/null 2>&1 || kill "$daemon" 2>/dev/null || true
        wait "$daemon" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup_common EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
# MiB/s of $1 bytes in $2 seconds.
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1048576 / s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "-"; else printf "%.2f", a / b }'; }
# A free TCP port on 127.0.0.1 (random, checked with ss).
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        [ -z "$(ss -Htln "sport = :$p")" ] && { echo "$p"; return; }
    done
}
# Drops the kernel's caches (root only); $cold says whether it could.
cold=warm
drop() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then cold=cold; fi; }
