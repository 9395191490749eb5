#!/usr/bin/env bash
# Prepares .xtask/device/ on a CPU machine for the device scripts (bench/README.md): the release
# xtask, the pinned llama.cpp packed, the commit the results are recorded under, and (unless
# VENDOR=0) the vendor kernel tests, gemv-bench, tail-bench and attn-decode-bench (also traced) built for sm_90a with the pinned
# CUDA toolkit (the pip nvcc xtask installs into .xtask/toolchains), packed as vendor-tests.tar.xz,
# the form ab.sh and diagnose.sh unpack. PROBES=1 also builds bench/tools' probes into .xtask/probe/.
# Objects are kept in .xtask/vendor-objects and rebuilt when their source or a header is newer.
# Usage (repository root): bench/bundle.sh      (~3 min on 2 cores from nothing but the toolkit)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)

echo "==> xtask (release)"
cargo build --release -p xtask
mkdir -p .xtask/device
cp target/release/xtask .xtask/device/
xtask=.xtask/device/xtask

echo "==> the pinned llama.cpp"
"$xtask" host fetch
"$xtask" host pack --out .xtask/device/llama.cpp.tar.xz
git describe --always --dirty > .xtask/device/commit

nvcc_path() {
    local found
    found=$(ls .xtask/toolchains/*/nvidia/cu13/bin/nvcc 2>/dev/null | head -1 || true)
    if [ -z "$found" ]; then
        # The toolkit is installed on first use by a build: the overlay alone is the quickest.
        "$xtask" build --overlay-only --pinned-cuda >&2
        found=$(ls .xtask/toolchains/*/nvidia/cu13/bin/nvcc | head -1)
    fi
    echo "$root/$found"
}

if [ "${VENDOR:-1}" = 1 ]; then
    nvcc=$(nvcc_path)
    cuda_lib=$(dirname "$(dirname "$nvcc")")/lib
    objects=.xtask/vendor-objects
    mkdir -p "$objects"
    flags=(-std=c++17 -O3 -arch=sm_90a -I "$root/vendor/csrc" -I "$root/bench/tools")
    newest_header=$(stat -c %Y vendor/csrc/*.cuh vendor/csrc/tests/*.cuh bench/tools/*.cuh | sort -n | tail -1)
    sources=(vendor/csrc/*.cu vendor/csrc/tests/*.cu bench/tools/gemv-bench.cu bench/tools/tail-bench.cu
        bench/tools/attn-decode-bench.cu)
    echo "==> vendor objects for sm_90a (${#sources[@]} files, $jobs at a time)"
    stale=()
    for src in "${sources[@]}"; do
        obj="$objects/$(basename "$src" .cu).o"
        if [ ! -f "$obj" ] || [ "$(stat -c %Y "$obj")" -lt "$(stat -c %Y "$src")" ] ||
            [ "$(stat -c %Y "$obj")" -lt "$newest_header" ]; then
            stale+=("$src")
        fi
    done
    if [ ${#stale[@]} -gt 0 ]; then
        printf '%s\n' "${stale[@]}" |
            xargs -P "$jobs" -I{} sh -c 'echo "   {}"; "$0" "$@" -c {} -o "'"$objects"'/$(basename {} .cu).o"' \
                "$nvcc" "${flags[@]}"
    fi
    library=()
    for src in vendor/csrc/*.cu; do
        library+=("$objects/$(basename "$src" .cu).o")
    done
    echo "==> linking the vendor tests, gemv-bench, tail-bench and attn-decode-bench"
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    for test in vendor/csrc/tests/*.cu; do
        name=$(basename "$test" .cu)
        "$nvcc" -arch=sm_90a "$objects/$name.o" "${library[@]}" -L "$cuda_lib" -o "$stage/$name"
    done
    for bench in gemv-bench tail-bench attn-decode-bench; do
        "$nvcc" -arch=sm_90a "$objects/$bench.o" "${library[@]}" -L "$cuda_lib" -o "$stage/$bench"
    done
    echo "==> attn-decode-bench-trace (ATTN_DECODE's phase marks)"
    "$nvcc" "${flags[@]}" -DFRT_ATTN_DECODE_TRACE vendor/csrc/decode-attention.cu vendor/csrc/pdl.cu \
        bench/tools/attn-decode-bench.cu -L "$cuda_lib" -o "$stage/attn-decode-bench-trace"
    tar -cf - -C "$stage" . | xz -9 -T "$jobs" > .xtask/device/vendor-tests.tar.xz
fi

if [ "${PROBES:-0}" = 1 ]; then
    nvcc=$(nvcc_path)
    cuda_lib=$(dirname "$(dirname "$nvcc")")/lib
    mkdir -p .xtask/probe
    for probe in fifo-probe pdl-probe graph-launch-probe; do
        echo "==> .xtask/probe/$probe"
        "$nvcc" -std=c++17 -O3 -arch=sm_90a -I bench/tools -I vendor/csrc -L "$cuda_lib" \
            "bench/tools/$probe.cu" -o ".xtask/probe/$probe"
    done
fi

echo "bundle: .xtask/device at $(cat .xtask/device/commit) ($(du -sh .xtask/device | cut -f1); carry it with the device tool)"
