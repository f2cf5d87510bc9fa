"""Sweep launch constants on the GPU machine: `python scripts/tune.py compile GROUP I` compiles config I of a
group (run many at once: Triton's on-disk cache is shared), `python scripts/tune.py time GROUP...` times every
config of the groups in one process and writes $OUT/tune-GROUP.json. Each config sets module constants; the
plans are rebuilt for it. Every result is also checked against stock PyTorch (a config that is fast but wrong
shows as such). The constants chosen from these figures are the modules' defaults; results depend only on the
shape, dtype and these constants, never on timing."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

from gradkern import _runtime, elementwise, reduction
from gradkern.dispatch import use
from gradkern.kernels import pad, prelu, repeat, segment_max, sparsemax
from gradkern.registry import REGISTRY
from gradkern.testing import check_case

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _pad(tile3, warp, split, tile12=4096):
    return (pad, {"_TILE": {1: tile12, 2: tile12, 3: tile3}, "_WARP_ELEMS": warp,
                  "_SPLIT_MIN": (1 << 20) if split else (1 << 62)})


def _red(row, row16, short, long_, warps):
    return (reduction, {"_ROW_BYTES": row, "_ROW_BYTES_16": row16, "_SHORT_TILE_BYTES": short,
                        "_LONG_TILE_BYTES": long_, "_O_WARPS": warps})


def _prelu(tile, tpp, cols_tile, cols_prog, warps, bk):
    return (prelu, {"_TILE_BYTES": tile, "_ROWS_TPP": tpp, "_COLS_TILE": cols_tile,
                    "_COLS_TARGET_PROGRAMS": cols_prog, "_WARPS": warps, "_COLS_BK": bk})


def _seg(bd, tile, small, ws, wl):
    return (segment_max, {"_BD_MAX": bd, "_TILE": tile, "_SMALL_TILE": small, "_WARPS_SMALL": ws, "_WARPS_LARGE": wl})


def _sm(row_tile, warp):
    return (sparsemax, {"_ROW_TILE": row_tile, "_WARP_ELEMS": warp})


GROUPS = {  # name: (ops, dtypes, configs); config 0 is the current default
    "pad3d": (["replication_pad3d_backward"], [F32, BF16],
              [_pad(2048, 1024, True)] + [_pad(t, w, True) for t in (2048, 4096, 8192) for w in (256, 512, 2048)]
              + [_pad(4096, 1024, True), _pad(8192, 1024, True)]
              + [_pad(t, w, False) for t in (2048, 4096) for w in (512, 1024)]),
    "pad12": (["replication_pad1d_backward", "replication_pad2d_backward"], [F32, BF16],
              [_pad(2048, 1024, True, t12) for t12 in (4096, 8192, 16384)]
              + [_pad(2048, 512, True, t12) for t12 in (4096, 8192, 16384)]),
    "repeat": (["repeat_backward"], [F32, BF16],
               [_red(1024, 2048, 8192, 32768, 4), _red(2048, 4096, 8192, 32768, 4), _red(1024, 2048, 16384, 32768, 4),
                _red(1024, 2048, 16384, 32768, 8), _red(2048, 2048, 16384, 65536, 8), _red(512, 1024, 8192, 32768, 4),
                _red(1024, 2048, 32768, 65536, 8), _red(4096, 4096, 16384, 65536, 8)]),
    "prelu": (["prelu_backward"], [F32, BF16],
              [_prelu(8192, 2, 2048, 2048, 4, 256), _prelu(16384, 2, 4096, 4096, 8, 256),
               _prelu(8192, 4, 4096, 4096, 4, 256), _prelu(16384, 1, 4096, 8192, 8, 128),
               _prelu(8192, 2, 2048, 8192, 4, 256), _prelu(8192, 2, 8192, 2048, 8, 256),
               _prelu(16384, 2, 2048, 4096, 4, 64), _prelu(8192, 1, 4096, 4096, 4, 512)]),
    "segment": (["_segment_reduce_backward", "segment_max_forward", "segment_max_backward"], [F32, F16],
                [_seg(128, 4096, 2048, 4, 8), _seg(64, 4096, 2048, 2, 4), _seg(64, 4096, 2048, 1, 4),
                 _seg(128, 2048, 1024, 2, 4), _seg(64, 8192, 4096, 4, 8), _seg(128, 8192, 2048, 2, 8),
                 _seg(32, 4096, 1024, 1, 4)]),
    "sparsemax": (["sparsemax_backward", "sparsemax_forward"], [F32, BF16],
                  [_sm(4096, 256), _sm(8192, 256), _sm(2048, 256), _sm(4096, 128), _sm(4096, 512), _sm(8192, 512),
                   _sm(16384, 512), _sm(2048, 128)]),
}


def _clear() -> None:
    pad._plan.cache_clear()
    sparsemax._plan.cache_clear()
    prelu._plans.clear()
    repeat._views.clear()
    reduction._plans.clear()
    reduction._launchers.clear()
    elementwise._fast_cache.clear()


def _apply(config) -> None:
    module, values = config
    for k, v in values.items():
        setattr(module, k, v)
    _clear()


def _cases(group):
    ops, dtypes, _ = GROUPS[group]
    for op in ops:
        for dtype in dtypes:
            torch.manual_seed(0)
            for case in REGISTRY[op].cases(_runtime.default_device(), dtype, os.environ.get("TUNE_SIZE", "large")):
                yield op, dtype, case


def _ms(fn) -> float:
    if not torch.cuda.is_available():  # a smoke run under the interpreter (TUNE_SIZE=tiny): the numbers mean nothing
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def compile_one(group: str, i: int) -> None:
    _apply(GROUPS[group][2][i])
    for op, _dtype, case in _cases(group):
        try:
            REGISTRY[op].fn(*case.args, **dict(case.kwargs))
        except Exception:  # noqa: BLE001 - reported when timed
            traceback.print_exc()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_group(group: str, out_dir: str) -> None:
    configs = GROUPS[group][2]
    cases = list(_cases(group))
    records = []
    with use(False):
        stock = {}
        for op, dtype, case in cases:
            fn = REGISTRY[op].stock()
            stock[(op, dtype, case.label)] = _ms(lambda: fn(*case.args, **dict(case.kwargs)))
        for i, config in enumerate(configs):
            _apply(config)
            for op, dtype, case in cases:
                fn, a, kw = REGISTRY[op].fn, case.args, dict(case.kwargs)
                try:
                    check_case(op, a, kw, what=f"{op} {case.label}")
                    ok = "ok"
                except Exception as e:  # noqa: BLE001
                    ok = f"{type(e).__name__}: {str(e)[:200]}"
                t = _ms(lambda: fn(*a, **kw))
                base = stock[(op, dtype, case.label)]
                rec = {"config": i, "values": {k: v for k, v in config[1].items()}, "op": op,
                       "dtype": _runtime.DTYPE_NAMES[dtype], "case": case.label, "ms": t, "stock_ms": base,
                       "gbs": case.bytes / t / 1e6, "vs_stock": base / t, "check": ok}
                records.append(rec)
                print(f"{group} cfg{i} {op} {rec['dtype']} {case.label}: {t:.4f} ms {rec['gbs']:.0f} GB/s "
                      f"{rec['vs_stock']:.2f}x {ok[:60]}", flush=True)
        _apply(configs[0])
    with open(os.path.join(out_dir, f"tune-{group}.json"), "w") as f:
        json.dump(records, f, indent=0, default=str)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compile":
        compile_one(sys.argv[2], int(sys.argv[3]))
    elif mode == "list":
        print("\n".join(f"{g} {i}" for g in sys.argv[2:] for i in range(len(GROUPS[g][2]))))
    else:
        out = os.environ.get("OUT", ".")
        for g in sys.argv[2:]:
            time_group(g, out)
