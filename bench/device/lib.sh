# Sourced by the device scripts: their common set-up, run from the repository root.
#   device_setup NAME   sets $out ($OUT, or /tmp/NAME) and $xtask (the carried release binary),
#                       exports FLASHRT_COMMIT and unpacks the carried pinned tree
#   say TEXT...         prints a line and appends it to $out/summary.txt
#   archive_out NAME    packs $out into $out/all.tgz (the device tool returns few files)
#   archive_at SECONDS NAME  packs $out into $out/all.tgz that many seconds from now, in the
#                       background, so that a call cut off at its time limit still returns what it
#                       had; archive_out stops it
#   results_dir LOG     the results folder an xtask command's log names (its last `results:` line)
#   gemv_windows        the decode GEMV windows, for FRT_<NAME>_SWAP=1

# The decode GEMV windows (tier safe since the exact kernel: parity-clean and faster).
gemv_windows=(INPROJ ATTNQKV HEAD ROUTER SHEXP_FOLD MATVEC)

device_setup() {
    out=${OUT:-/tmp/$1}
    mkdir -p "$out"
    : > "$out/summary.txt"
    xtask=.xtask/device/xtask
    # The device's copy of the tree has stale git metadata: results carry the bundle's commit.
    export FLASHRT_COMMIT=${FLASHRT_COMMIT:-$(cat .xtask/device/commit 2>/dev/null || true)}
    # The verified pinned tree, carried: the device cannot download it.
    "$xtask" host fetch --host-src .xtask/device/llama.cpp.tar.xz > "$out/host-fetch.log" 2>&1 \
        || { cat "$out/host-fetch.log"; return 1; }
}

say() {
    echo "$*" | tee -a "$out/summary.txt"
}

archive_out() {
    if [ -n "${archive_pending:-}" ]; then
        kill "$archive_pending" 2>/dev/null
        archive_pending=
    fi
    local packed status
    packed=$(mktemp "/tmp/$1.XXXXXX.tgz")
    # Status 1: a file changed while it was read (a log still being written when archive_at fires).
    tar -czf "$packed" -C "$out" --exclude=./all.tgz --warning=no-file-changed .
    status=$?
    if [ "$status" -le 1 ]; then
        mv "$packed" "$out/all.tgz"
    else
        rm -f "$packed"
    fi
}

archive_at() {
    (sleep "$1" && archive_out "$2") &
    archive_pending=$!
}

results_dir() {
    sed -n 's/^results: //p' "$1" | tail -1
}
