#!/usr/bin/env bash
# Web page benchmark: how fast the page shows big folders in a real
# browser (headless chromium), beside a plain static web server (Python's
# http.server) serving the same files from a plain directory, in one run.
# A pool of one sparse file, dataset bench/files shared to user bench,
# filled through a FUSE mount; folders opened through share links (no
# login in the way).
#
#   dashboard       an administrator's dashboard: until the pool and the
#                   datasets are shown, median of 5 (no peer)
#   list 20k        a folder of 20,000 files: from the navigation until
#                   the first 20 rows are laid out, and until every row
#                   is (tarn's file page; the peer's directory listing),
#                   median of 5 each
#   grid cold       a folder of 5,000 photos (JPEG, WIDTHxHEIGHT): until
#                   every thumbnail in the window has loaded, the daemon
#                   restarted before each run (no thumbnail made yet),
#                   median of 3; the peer: a page of the same grid showing
#                   the originals (what a page without thumbnails does)
#   grid warm       the same with the daemon's thumbnails made and the
#                   browser's cache emptied, median of 5
#   grid on Wi-Fi   both again with the browser's network held to 100
#                   Mbit/s and 4 ms (chromium's emulation): what a phone on
#                   a home network sees, where the originals' size counts
#   thumbnails      all 5,000 thumbnails made cold by 2 clients: per
#                   second, and the daemon's resident memory before and
#                   after (with the cache's own count of its bytes)
#   metrics cost    a 1 GiB file read over HTTP (curl), median of 9, with
#                   /metrics scraped every 100 ms (150 times the usual
#                   Prometheus interval) and without, taking turns
#
# Not a test: nothing here fails on a timing. Browser and servers share
# the machine's CPUs.
#
# Usage: scripts/bench-web.sh [WIDTH HEIGHT]   (default 1600 1200)
# Env:   BENCH_DIR (where the temp dir goes; default the repo)
set -euo pipefail
width=${1:-1600}
height=${2:-1200}
command -v chromium >/dev/null || { echo "needs chromium (apt-get install chromium)" >&2; exit 1; }
# root, tarn, work, TARN_SOCKET, now, ratio, free_port.
. "$(dirname "$0")/bench-common.sh"
render=$root/target/release/examples/web-render
# A no-op when both are up to date.
(cd "$root" && cargo build --release -q -p tarn --bin tarn --example web-render)

daemon=
peer=
scraper=
cleanup() {
    [ -n "$scraper" ] && kill "$scraper" 2>/dev/null
    [ -n "$peer" ] && kill "$peer" 2>/dev/null
    mountpoint -q "$work/mnt" 2>/dev/null && "$tarn" unmount "$work/mnt" >/dev/null 2>&1
    cleanup_common
}
trap cleanup EXIT

field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$daemon/status"; }
# A gauge of the daemon's metrics.
metric() { curl -fsS "http://127.0.0.1:$metrics_port/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
web_port=$(free_port)
metrics_port=$(free_port)
peer_port=$(free_port)

start_daemon() {
    "$tarn" daemon --state-dir "$work/state" --socket "$TARN_SOCKET" \
        --web "127.0.0.1:$web_port" --metrics "127.0.0.1:$metrics_port" 2>>"$work/daemon.log" &
    daemon=$!
    for _ in $(seq 100); do
        curl -fsS "http://127.0.0.1:$web_port/" -o /dev/null 2>/dev/null && break
        sleep 0.1
    done
    "$tarn" daemon ping >/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
}
stop_daemon() {
    "$tarn" daemon stop >/dev/null
    wait "$daemon" 2>/dev/null || true
    daemon=
}

# ----- setup -------------------------------------------------------------------
echo "setting up (20,000 files, 5,000 photos of ${width}x${height}, a 1 GiB file)..." >&2
truncate -s 12G "$work/d0"
start_daemon
"$tarn" pool create bench "$work/d0" >/dev/null
"$tarn" dataset create -o compression=off bench/files >/dev/null
password=bench-$RANDOM$RANDOM
echo "$password" | "$tarn" user add --password-stdin bench >/dev/null
"$tarn" user admin bench on >/dev/null
"$tarn" share add files bench/files --webdav bench=rw --owner bench >/dev/null
"$render" --jpeg "$width" "$height" "$work/photo.jpg"
mkdir -p "$work/mnt" "$work/plain"
"$tarn" mount bench/files "$work/mnt" >/dev/null
fill() {
    python3 - "$1" "$work/photo.jpg" <<'EOF'
import os, shutil, sys
top, photo = sys.argv[1], sys.argv[2]
os.makedirs(f"{top}/many", exist_ok=True)
os.makedirs(f"{top}/photos", exist_ok=True)
for i in range(20000):
    with open(f"{top}/many/file-{i:05}.txt", "w") as f:
        f.write("x\n")
for i in range(5000):
    shutil.copyfile(photo, f"{top}/photos/photo-{i:04}.jpg")
EOF
}
fill "$work/mnt"
head -c $((1 << 30)) /dev/urandom > "$work/mnt/big.bin"
"$tarn" unmount "$work/mnt" >/dev/null
fill "$work/plain"
# The peer's photo page: the same grid, with the originals.
python3 - "$work/plain" <<'EOF'
import sys
top = sys.argv[1]
tiles = "".join(f'<a class="tile" href="photos/photo-{i:04}.jpg"><img loading="lazy" src="photos/photo-{i:04}.jpg"></a>'
                for i in range(5000))
open(f"{top}/grid.html", "w").write(
    "<!doctype html><meta name=viewport content='width=device-width'><style>"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(110px,1fr));gap:.4rem}"
    ".tile{display:block;aspect-ratio:1;overflow:hidden}.tile img{width:100%;height:100%;object-fit:cover}"
    f"</style><div class=grid>{tiles}</div>")
EOF
python3 -m http.server --bind 127.0.0.1 "$peer_port" --directory "$work/plain" >/dev/null 2>&1 &
peer=$!
many=$("$tarn" link create --as bench files many)
photos=$("$tarn" link create --as bench files photos)
everything=$("$tarn" link create --as bench files)
web=http://127.0.0.1:$web_port
# Let the writes of the setup settle before timing anything.
"$tarn" pool sync bench >/dev/null
sleep 5

visible='(() => { const v = [...document.querySelectorAll(SEL)].filter(i => i.getBoundingClientRect().top < innerHeight); return v.length > 0 && v.every(i => i.complete && i.naturalWidth > 0); })()'
grid_sel="'#grid img'"
peer_sel="'img'"
tarn_grid=${visible//SEL/$grid_sel}
peer_grid=${visible//SEL/$peer_sel}

# ----- phases ------------------------------------------------------------------
echo "list 20k..." >&2
# Both wait for the rows, then for the page's layout (forced by asking
# for its height).
laid_out="document.body.getBoundingClientRect().height > 0"
tarn_list=$("$render" "$web/s/$many" "document.querySelectorAll('#listing .row[data-name]').length === 20000 && $laid_out" --runs 5 | field median_ms)
peer_list=$("$render" "http://127.0.0.1:$peer_port/many/" "document.querySelectorAll('li').length === 20000 && $laid_out" --runs 5 | field median_ms)
# The first screen: 20 rows there and laid out.
tarn_first=$("$render" "$web/s/$many" "document.querySelectorAll('#listing .row[data-name]').length >= 20 && $laid_out" --runs 5 | field median_ms)
peer_first=$("$render" "http://127.0.0.1:$peer_port/many/" "document.querySelectorAll('li').length >= 20 && $laid_out" --runs 5 | field median_ms)

echo "dashboard..." >&2
tarn_dash=$("$render" "$web/" "document.querySelector('#pools .pool') !== null && document.querySelector('#datasets tr') !== null" \
    --runs 5 --login "bench:$password" | field median_ms)

echo "grid cold..." >&2
cold_runs=()
for _ in 1 2 3; do
    stop_daemon
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    start_daemon
    cold_runs+=("$("$render" "$web/s/$photos" "$tarn_grid" --runs 1 --fresh-cache | field median_ms)")
done
tarn_cold=$(printf '%s\n' "${cold_runs[@]}" | sort -n | sed -n 2p)
peer_cold=$("$render" "http://127.0.0.1:$peer_port/grid.html" "$peer_grid" --runs 5 --fresh-cache | field median_ms)

echo "grid warm..." >&2
tarn_warm=$("$render" "$web/s/$photos" "$tarn_grid" --runs 5 --fresh-cache | field median_ms)
echo "grid on Wi-Fi..." >&2
tarn_wifi=$("$render" "$web/s/$photos" "$tarn_grid" --runs 3 --fresh-cache --mbit 100 | field median_ms)
peer_wifi=$("$render" "http://127.0.0.1:$peer_port/grid.html" "$peer_grid" --runs 3 --fresh-cache --mbit 100 | field median_ms)

echo "thumbnails..." >&2
stop_daemon
start_daemon
curl -fsS "$web/s/$photos/f/?list" -o /dev/null
rss0=$(rss_kib)
blocks0=$(metric tarn_cache_bytes)
t0=$(now)
seq -f 'photo-%04g.jpg' 0 4999 |
    xargs -P 2 -I{} curl -fsS "$web/s/$photos/f/{}?thumb" -o /dev/null
t1=$(now)
rss1=$(rss_kib)
blocks1=$(metric tarn_cache_bytes)
cache=$(metric tarn_web_thumbnail_cache_bytes)
made=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", 5000 / (b - a) }')

echo "metrics cost..." >&2
read_big() {
    local t0 t1
    t0=$(now)
    curl -fsS "$web/s/$everything/f/big.bin" -o /dev/null
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", 1024 / (b - a) }'
}
read_big >/dev/null # warm the block cache alike for both sides
# One scraping process keeping its connection (as Prometheus does), so
# what is measured is the daemon's work, not process start-ups; the two
# sides take turns going first, 9 reads each.
scrape() {
    python3 - "$metrics_port" <<'EOF' &
import http.client, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
while True:
    c.request("GET", "/metrics")
    c.getresponse().read()
    time.sleep(0.1)
EOF
    scraper=$!
}
plain=() scraped=()
for k in 1 2 3 4 5 6 7 8 9; do
    if [ $((k % 2)) = 0 ]; then plain+=("$(read_big)"); fi
    scrape
    sleep 0.2
    scraped+=("$(read_big)")
    kill "$scraper"
    wait "$scraper" 2>/dev/null || true
    scraper=
    if [ $((k % 2)) = 1 ]; then plain+=("$(read_big)"); fi
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
plain_m=$(median "${plain[@]}")
scraped_m=$(median "${scraped[@]}")

# ----- report ------------------------------------------------------------------
printf '%-44s %10s %10s %8s\n' "workload" "tarn" "peer" "ratio"
printf '%-44s %8s ms %10s %8s\n' "dashboard (pools and datasets shown)" "$tarn_dash" "-" "-"
printf '%-44s %8s ms %8s ms %8s\n' "list 20,000 files (first screen)" "$tarn_first" "$peer_first" "$(ratio "$tarn_first" "$peer_first")"
printf '%-44s %8s ms %8s ms %8s\n' "list 20,000 files (until every row)" "$tarn_list" "$peer_list" "$(ratio "$tarn_list" "$peer_list")"
printf '%-44s %8s ms %8s ms %8s\n' "5,000 photos, cold (visible tiles loaded)" "$tarn_cold" "$peer_cold" "$(ratio "$tarn_cold" "$peer_cold")"
printf '%-44s %8s ms %8s ms %8s\n' "5,000 photos, thumbnails made" "$tarn_warm" "$peer_cold" "$(ratio "$tarn_warm" "$peer_cold")"
printf '%-44s %8s ms %8s ms %8s\n' "5,000 photos at 100 Mbit/s, thumbnails made" "$tarn_wifi" "$peer_wifi" "$(ratio "$tarn_wifi" "$peer_wifi")"
printf '%-44s %8s /s\n' "thumbnails made, 2 clients" "$made"
# The photos' blocks fill the block cache (bounded by --cache-mib, an
# eighth of the memory by default); what the thumbnails cost is the rest.
printf '%-44s %8s MiB (block cache +%s MiB, thumbnail cache %s MiB)\n' "daemon memory growth, 5,000 thumbnails" \
    "$(awk -v a="$rss0" -v b="$rss1" 'BEGIN { printf "%.0f", (b - a) / 1024 }')" \
    "$(awk -v a="${blocks0:-0}" -v b="${blocks1:-0}" 'BEGIN { printf "%.0f", (b - a) / 1048576 }')" \
    "$(awk -v c="${cache:-0}" 'BEGIN { printf "%.1f", c / 1048576 }')"
printf '%-44s %8s MiB/s %6s MiB/s %6s\n' "1 GiB read, /metrics every 100 ms vs none" "$scraped_m" "$plain_m" "$(ratio "$scraped_m" "$plain_m")"
echo "(peer: Python's http.server over a plain directory; photos ${width}x${height}, $(du -k "$work/photo.jpg" | cut -f1) KiB each)"
