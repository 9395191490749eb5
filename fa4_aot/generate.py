#!/usr/bin/env python3
"""Compiles FlashAttention-4 forward kernels ahead of time into C-linkable objects.

Run by `cargo xtask fa4-aot` inside the virtual environment it makes (the packages of
fa4_aot/manifest.toml's [toolchain]); no GPU is needed. For each manifest module of the chosen
architecture it builds FA4's forward kernel for that configuration, wraps it in a fixed entry
point (Q, K, V, O, softmax scale, stream: no optional tensors, so the exported C signature is
plain), compiles it with the CuTe DSL for the architecture the environment names, and exports
`<out>/<name>.o` (SASS for that architecture only) and `<out>/<name>.h` (the module's load,
unload and call functions, prefixed with the module's name). Prints one JSON line per module:
name, files, sha256 of each, seconds.

Shapes stay symbolic: batch, sequence lengths and head counts are runtime values, strides too
(multiples of 8 elements, 16-byte aligned bases); only the head dimension, the ratio of query
heads to key/value heads, causality and the element type are fixed per module.

Usage: generate.py MANIFEST OUT_DIR ARCH [MODULE ...]
"""
import hashlib
import json
import os
import sys
import time
import tomllib

# FA4 reads the target architecture when it is imported; without a GPU it must be told.
ARCH = sys.argv[3] if len(sys.argv) > 3 else ""
os.environ["CUTE_DSL_ARCH"] = f"sm_{ARCH}"

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32  # noqa: E402

ELEMENT = {"f16": cutlass.Float16, "bf16": cutlass.BFloat16}


def sm90_kernel(module):
    """FA4's SM90 forward kernel for a module, with the tiles FA4's own interface picks."""
    from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
    from flash_attn.cute.interface import _tile_size_fwd_sm90

    d = module["head_dim"]
    tiles = _tile_size_fwd_sm90(d, d, module["causal"], False)
    ratio = module["qhead_per_kvhead"]
    return FlashAttentionForwardSm90(
        ELEMENT[module["dtype"]],
        d,
        d,
        ratio,
        is_causal=module["causal"],
        is_local=False,
        pack_gqa=ratio > 1,
        tile_m=tiles.m_block_size,
        tile_n=tiles.n_block_size,
        num_stages=2,
        num_threads=384,
        Q_in_regs=False,
        intra_wg_overlap=tiles.intra_wg_overlap,
        mma_pv_is_rs=tiles.mma_pv_is_rs,
    )


KERNELS = {"90a": sm90_kernel}


def export(module, out_dir):
    kernel = KERNELS[module["arch"]](module)

    @cute.jit
    def entry(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, softmax_scale: Float32,
              stream: cuda.CUstream):
        kernel(mQ, mK, mV, mO, None, softmax_scale, stream=stream)

    element = ELEMENT[module["dtype"]]
    per_16_bytes = 128 // element.width

    def tensor(shape):
        # (batch, sequence, heads, head_dim): the last dimension contiguous, the others any stride
        # that keeps rows 16-byte aligned.
        strides = tuple(cute.sym_int64(divisibility=per_16_bytes) for _ in shape[:-1]) + (1,)
        return cute.runtime.make_fake_tensor(element, shape, stride=strides, assumed_align=16)

    batch, seq_q, seq_kv, heads_q = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    heads_kv = cute.sym_int() if module["qhead_per_kvhead"] > 1 else heads_q
    d = module["head_dim"]
    args = [
        tensor((batch, seq_q, heads_q, d)),
        tensor((batch, seq_kv, heads_kv, d)),
        tensor((batch, seq_kv, heads_kv, d)),
        tensor((batch, seq_q, heads_q, d)),
        Float32(1.0),
        cute.runtime.make_fake_stream(),
    ]
    compiled = cute.compile(entry, *args)
    compiled.export_to_c(out_dir, module["name"], function_prefix=module["name"])


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    manifest_path, out_dir = sys.argv[1], sys.argv[2]
    wanted = set(sys.argv[4:])
    with open(manifest_path, "rb") as f:
        manifest = tomllib.load(f)
    modules = [m for m in manifest["module"] if m["arch"] == ARCH and (not wanted or m["name"] in wanted)]
    if ARCH not in KERNELS:
        sys.exit(f"generate.py: no FA4 forward kernel for sm_{ARCH} here (known: {', '.join(sorted(KERNELS))})")
    os.makedirs(out_dir, exist_ok=True)
    for module in modules:
        start = time.time()
        export(module, out_dir)
        line = {"name": module["name"], "seconds": round(time.time() - start, 1)}
        for ext in ("o", "h"):
            path = os.path.join(out_dir, f"{module['name']}.{ext}")
            with open(path, "rb") as f:
                line[f"{ext}_sha256"] = hashlib.sha256(f.read()).hexdigest()
            line[ext] = path
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
