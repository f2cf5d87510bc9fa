"""Sweep launch constants on the GPU machine: `python scripts/tune.py compile GROUP I` compiles config I of a group
(run many at once: Triton's on-disk cache is shared), `python scripts/tune.py time GROUP...` times every config of
the groups in one process and writes $OUT/tune-GROUP.json, one record per (config, op, dtype, case) with the GPU,
torch and Triton versions and the date. The cases are the ops' registry cases (TUNE_SIZE: their size), or with
TUNE_CASES=sweep the `bench --sweep` cases, TUNE_CASES="sweep:D=1 |D=3 " those whose label holds one of the
'|'-separated strings; TUNE_HOT_MS=100 runs each call back to back that long before it is timed (small cases);
TUNE_GPU_TIME=1 adds each call's kernel time (torch.profiler) and host time, which a host-bound call's do_bench
figure does not separate (docs/tuning/README.md, "Timing small cases"). A
config overrides fields of an op family's frozen config object (`gradkern.config.override`); the plans are rebuilt
for it. Every result is also checked against stock PyTorch (a config that is fast but wrong shows as such). The
values chosen from these figures are the families' shipped configs; results depend only on the shape, dtype and the
config, never on timing. Sweep cases are checked as `bench --sweep` checks them (`bench_sweep.check_result`),
registry cases as the tests do (`testing.check_case`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from types import MappingProxyType
from unittest import mock

import torch
import triton
import triton.language as tl

from gradkern import _runtime, config
from gradkern.engines import elementwise, multi_pointwise, reduction
from gradkern.kernels import adaptive_pool, avg_pool, max_pool, pad, prelu, segment_max, sparsemax, upsample
from gradkern.launch import launcher
from gradkern.registry import REGISTRY
from gradkern.routing.dispatch import use
from gradkern.testing import check_case
from gradkern.tools import bench_sweep

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _each_size(block):  # multi_pointwise's flat block, the same for 2-, 4- and 8-byte elements
    return MappingProxyType(dict.fromkeys((2, 4, 8), block))


def _sm(row_tile, warp):  # sparsemax's (forward, backward) row tiles and elements a warp
    return (sparsemax.CONFIG, {"fwd_row_tile": row_tile[0], "bwd_row_tile": row_tile[1],
                               "fwd_warp_elems": warp[0], "bwd_warp_elems": warp[1]})


def _sr(r2, r4, w2, w4):  # segment_reduce's small tiles: register caps and warps, 2- and 4-byte elements
    return (segment_max.CONFIG, {"segred_maxnreg": (((True, 2), r2), ((True, 4), r4), ((False, 2), 64)),
                                 "segred_warps": ((2, w2), (4, w4), (8, 2))})


DEFAULTS = (None, {})  # the families' shipped configs
_TILED = ({"tiled_tile": 0}, {"tiled_warps": 4}, {"tiled_tile": 2048, "tiled_warps": 4})  # both pointwise engines

def _caps(**by_size):  # pad's register caps ((dims, element size, reflect), cap) pairs, both modes alike: d3e2=80
    return tuple(((int(k[1]), int(k[3:]), mode), v) for k, v in by_size.items() for mode in (False, True))


# pad 3d's register caps against the defaults (16-bit replicate 80, reflect 96): none, lower ones for 16-bit and f32
_PAD3D_CAPS = [(pad.CONFIG, {"maxnreg": caps}) for caps in ((), _caps(d3e2=72, d3e4=88), _caps(d3e2=64, d3e4=80))]
_PAD_LATE = (pad.CONFIG, {"early_strips": False, "maxnreg": _caps(d3e2=96)})  # strip values after the barrier
_PAD3D_OPS = ["replication_pad3d_backward", "reflection_pad3d_backward"]
_PAD_OPS = [f"{mode}_pad{d}d_backward" for mode in ("replication", "reflection") for d in (1, 2, 3)]
_PAD_EDGE_OPS = _PAD3D_OPS + ["replication_pad2d_backward", "reflection_pad2d_backward"]  # (the EDGES merge's cases)
_PAD_NO_EDGES = (pad.CONFIG, {"edges": frozenset()})  # column strips stored after the barrier in every dtype
_PAD_EDGES_ALL = (pad.CONFIG, {"edges": frozenset((d, e) for d in (1, 2, 3) for e in (2, 4))})  # ... selected in
# f32 alone; corners per element
_PAD_BEFORE_LANES = (pad.CONFIG, {"edges": frozenset((d, 4) for d in (1, 2, 3)), "corner_lanes": 0})

GROUPS = {  # name: (ops, dtypes, configs); each config overrides only what it names, config 0 is the defaults
    "pad3d": (_PAD3D_OPS, [F32, BF16, F16],
              [DEFAULTS, (pad.CONFIG, {"tile": (2048,) * 3}), (pad.CONFIG, {"warps": 8}),
               (pad.CONFIG, {"unroll": 0}), *_PAD3D_CAPS]),
    "pad3d_caps": (_PAD3D_OPS, [F32, BF16], [DEFAULTS, *_PAD3D_CAPS]),  # the caps alone, faster to run
    "pad12": (["replication_pad1d_backward", "replication_pad2d_backward", "reflection_pad1d_backward",
               "reflection_pad2d_backward"], [F32, BF16],
              [DEFAULTS, (pad.CONFIG, {"tile": (4096,) * 3}),
               (pad.CONFIG, {"maxnreg": _caps(d1e2=96, d2e2=96)}), (pad.CONFIG, {"maxnreg": _caps(d1e2=80, d2e2=80)})]),
    "pad_early": (_PAD3D_OPS + ["replication_pad2d_backward", "reflection_pad1d_backward"], [F32, BF16, F16],
                  [DEFAULTS, _PAD_LATE, (pad.CONFIG, {"maxnreg": _caps(d3e2=96)}), DEFAULTS, _PAD_LATE]),
    "pad_edges": (_PAD_EDGE_OPS, [F32, BF16],
                  [DEFAULTS, _PAD_NO_EDGES, _PAD_EDGES_ALL, DEFAULTS, _PAD_NO_EDGES]),
    "pad_edges32": (_PAD_EDGE_OPS, [F32], [DEFAULTS, _PAD_NO_EDGES, DEFAULTS, _PAD_NO_EDGES]),  # (f32 alone, faster)
    "pad_lanes": (_PAD_OPS, [F32, BF16, F16],  # replicate's corners a source a lane, 16-bit 3d's column strips
                  [DEFAULTS, _PAD_BEFORE_LANES, DEFAULTS, _PAD_BEFORE_LANES]),  # selected in: against neither
    # EDGES on every row width (edges_width 1, before) against multiples of 16; with TUNE_CASES="sweep:text conv|
    # short rows|1-row planes|unbatched|asymmetric|7x7 planes|padded row pitch|many 8^3|prime planes"
    "pad_edges16": (_PAD_OPS, [F32, BF16, F16], [DEFAULTS, (pad.CONFIG, {"edges_width": 1})] * 2),
    "pad_even": (_PAD_OPS, [F32, BF16, F16],  # whole-plane tiles unmasked with GEOM (16-bit 3d), then neither
                 [DEFAULTS, (pad.CONFIG, {"geom": frozenset()})] * 2),
    "segment": (["_segment_reduce_backward", "segment_max_forward", "segment_max_backward"], [F32, F16],
                [DEFAULTS, DEFAULTS]),  # the defaults twice: the spread
    "segfwd": (["segment_max_forward"], [F32, BF16],  # the forward's kernels: as chosen, lane/tile only, no lanes,
               [DEFAULTS, (segment_max.CONFIG, {"rows_max_programs": 0}),  # rows everywhere (tiles 2048, 512)
                (segment_max.CONFIG, {"lanes_max_inner": 0}),
                (segment_max.CONFIG, {"rows_max_programs": 1 << 62, "rows_min_mean": 0}),
                (segment_max.CONFIG, {"rows_max_programs": 1 << 62, "rows_min_mean": 0, "rows_tile": 512}), DEFAULTS]),
    # the segment_reduce backward's rows written side by side (lanes_write_rows), every element size alike: 1 (a
    # lane a segment), 4, 8, 16, 32; with TUNE_CASES="sweep:D=1 lengths u|D=1 lengths e|D=3 "
    "segwrite": (["_segment_reduce_backward"], [F32, BF16],
                 [DEFAULTS] + [(segment_max.CONFIG, {"lanes_write_rows": ((2, r), (4, r), (8, r))})
                               for r in (1, 4, 8, 16, 32)]),
    # the forward tile kernel's columns: as shipped, bd_max (before the line a row), fwd_min_tile 64 and 256; with
    # TUNE_CASES="sweep:D=40 |D=64 |D=100 |D=256 |D=1000 "
    "segcols": (["segment_max_forward"], [F32, BF16],
                [DEFAULTS, (segment_max.CONFIG, {"fwd_row_bytes": 0}), (segment_max.CONFIG, {"fwd_min_tile": 64}),
                 (segment_max.CONFIG, {"fwd_min_tile": 256})]),
    # the forward lane kernel's long-segment tile (lanes_long_tile: 256 shipped, 1024 before, 512); with
    # TUNE_CASES="sweep:D=1 |D=3 "
    "seglong": (["segment_max_forward"], [F32, BF16],
                [DEFAULTS] + [(segment_max.CONFIG, {"lanes_long_tile": t}) for t in (1024, 512)]),
    # the lane kernels' grid bound for segments of 9-64 rows on average (lanes_few_min_programs: 2048 shipped, 3072
    # before, 1024); with TUNE_CASES="sweep:D=1 |D=3 "
    "segfew": (["segment_max_forward", "_segment_reduce_backward"], [F32, BF16],
               [DEFAULTS] + [(segment_max.CONFIG, {"lanes_few_min_programs": n}) for n in (3072, 1024)]),
    # the forward lane kernel for wide rows (fwd_lanes_max_inner: 256 shipped, 8 before); with
    # TUNE_CASES="sweep:D=40|D=64|D=100|D=256|D=1000"
    "segwide": (["segment_max_forward"], [F32, BF16],
                [DEFAULTS, (segment_max.CONFIG, {"fwd_lanes_max_inner": 8})]),
    # the forward's lane kernel for wide rows at unit mean lengths: as shipped (fwd_lanes_unit_mean 1), never (0,
    # before), at every mean up to lanes_max_mean (lanes_max_inner 256); with TUNE_CASES="sweep:D=40 |D=64 |D=100
    # |D=256 |D=1000 |D=16 |D=24 " and TUNE_HOT_MS=100
    "seglanes": (["segment_max_forward"], [F32, BF16],
                 [DEFAULTS, (segment_max.CONFIG, {"fwd_lanes_unit_mean": 0}),
                  (segment_max.CONFIG, {"lanes_max_inner": 256})]),
    # the split for long segments (the forward's; the segment_reduce backward's tile kernel's): as shipped (chunks of
    # 16K elements, combine steps of 1K), off (the twentieth session's start), chunks of 8K and 32K, combine steps of
    # 4K; with TUNE_CASES="sweep:" (every case)
    "segsplit": (["segment_max_forward", "_segment_reduce_backward"], [F32, BF16],
                 [DEFAULTS, (segment_max.CONFIG, {"split_min_elems": 1 << 62})]
                 + [(segment_max.CONFIG, {"split_chunk": n}) for n in (8192, 32768)]
                 + [(segment_max.CONFIG, {"split_combine": 4096})]),
    # the split passes' chunks a program (twenty-sixth session): as shipped (up to 16, 2048 programs kept), a program
    # a chunk (before), up to 16 with 512 programs kept; with TUNE_CASES="sweep:" (every case)
    "segblock": (["segment_max_forward", "_segment_reduce_backward"], [F32, BF16],
                 [DEFAULTS, (segment_max.CONFIG, {"split_block": 1}),
                  (segment_max.CONFIG, {"split_min_programs": 512})]),
    # the forward's wider lane blocks (fwd_lanes_wider, fwd_lanes_wider_cols) and rows up to 1024 columns in lanes
    # (fwd_lanes_max_inner, fwd_lanes_one_min_programs): the rule, main's values (neither), each alone; with
    # TUNE_CASES="sweep:" (every case)
    "segwider": (["segment_max_forward"], [F32, BF16],
                 [DEFAULTS, (segment_max.CONFIG, {"fwd_lanes_wider_cols": (0, 0), "fwd_lanes_max_inner": 256,
                                                  "fwd_lanes_one_min_programs": 0}),
                  (segment_max.CONFIG, {"fwd_lanes_max_inner": 256, "fwd_lanes_one_min_programs": 0}),
                  (segment_max.CONFIG, {"fwd_lanes_wider_cols": (0, 0)})]),
    # the forward's flat lanes (fwd_lanes_flat_idle): as shipped, never, at every mean where a block of several
    # segments would idle 1/8 of its lanes; with TUNE_CASES="sweep:D=3 |D=40 |D=100 " (the widths whose blocks idle)
    "segflat": (["segment_max_forward"], [F32, BF16],
                [DEFAULTS, (segment_max.CONFIG, {"fwd_lanes_flat_idle": (0, 0)}),
                 (segment_max.CONFIG, {"fwd_lanes_flat_idle": (8, 8)})]),
    # the forward's lane blocks on fewer warps (fwd_lanes_a_warp), so that a block's loop ends with its own
    # segments: as shipped (4 warps); a warp a segment at 64 columns (64-lane blocks, one warp, a program a segment
    # allowed); 2 lanes a thread at every block (128 lanes on 2 warps); 128-lane blocks on 2 warps; with
    # TUNE_CASES="sweep:" (every case)
    "segwarp": (["segment_max_forward"], [F32, BF16],
                [DEFAULTS, (segment_max.CONFIG, {"fwd_lanes_wider": 64, "fwd_lanes_a_warp": 64,
                                                 "fwd_lanes_one_min_programs": 0}),
                 (segment_max.CONFIG, {"fwd_lanes_a_warp": 64}),
                 (segment_max.CONFIG, {"fwd_lanes_wider": 128, "fwd_lanes_a_warp": 64})]),
    # the segment_reduce backward's lane kernel as shipped (counting its short segments' ties while writing g,
    # rows written side by side 8 / 8 / 4 for 2- / 4- / 8-byte elements), counting in a pass of its own with the rows
    # before (4 / 8 / 4), and writing while counting 4 / 4 / 4 rows side by side; with TUNE_CASES="sweep:D=1 |D=3 "
    "segredone": (["_segment_reduce_backward"], [F32, BF16],
                  [DEFAULTS, (segment_max.CONFIG, {"segred_lanes_one_pass": frozenset(),
                                                   "lanes_write_rows": ((2, 4), (4, 8), (8, 4))}),
                   (segment_max.CONFIG, {"lanes_write_rows": ((2, 4), (4, 4), (8, 4))})]),
    # the segment_reduce backward's lane kernel for wide rows at unit mean lengths (segred_lanes_unit_inner): as
    # shipped (up to 64 columns), none (the tile kernel), up to 1024; with TUNE_CASES="sweep:lengths unit" and
    # TUNE_GPU_TIME=1 (the small cases are host-bound)
    "segredunit": (["_segment_reduce_backward"], [F32, BF16],
                   [DEFAULTS, (segment_max.CONFIG, {"segred_lanes_unit_inner": 0}),
                    (segment_max.CONFIG, {"segred_lanes_unit_inner": 1024})]),
    # the segment_reduce backward's lane kernel: as shipped (the split's passes for segments longer than a chunk,
    # long segments in tiles of lanes_long_tile elements), no split (split_min_elems past any problem; the tile
    # kernel's cases lose theirs too), tiles of `tile` (4096) elements; with TUNE_CASES="sweep:D=1 |D=3 "
    "segredlanes": (["_segment_reduce_backward"], [F32, BF16],
                    [DEFAULTS, (segment_max.CONFIG, {"split_min_elems": 1 << 62}),
                     (segment_max.CONFIG, {"lanes_long_tile": 4096})]),
    # short tiles and more rows in flight (twenty-first session): as shipped, the tile kernels' tiles of `tile`
    # elements at every mean with the segment_reduce backward's columns not widened, the forward's lanes_few at 4 rows
    # a step, tiles of 256; with TUNE_CASES="sweep:" (every case)
    "segtile": (["segment_max_forward", "_segment_reduce_backward"], [F32, BF16],
                [DEFAULTS, (segment_max.CONFIG, {"short_tile": 4096, "segred_min_tile": 0}),
                 (segment_max.CONFIG, {"fwd_lanes_few_unroll": 4}), (segment_max.CONFIG, {"short_tile": 256})]),
    # replicate pads wider than `unroll`: strip parts a source a lane (loop_lanes 1024 shipped, 256, 4096), or
    # per-element loops (loop_lanes 0) after loop_unroll_3d sources (0, and 4 before the thirteenth session); with
    # TUNE_CASES="sweep:pad (7, 7|pad (7, 2, 1, 0)|pad (7, 1)" (a 3-D pad 7 with 4 compiles for over 40 s)
    "pad_wide": (["replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"],
                 [F32, BF16],
                 [DEFAULTS] + [(pad.CONFIG, {"loop_lanes": n}) for n in (256, 4096)]
                 + [(pad.CONFIG, {"loop_lanes": 0, "loop_unroll_3d": u}) for u in (0, 4)]),
    # sparsemax forward's rows held whole: thresholds an iteration (2 shipped; 4 before), elements a warp (256
    # shipped), the short-row rule off; with TUNE_CASES="sweep:rows of 3)|rows of 40)|rows of 100)|32768x1024|ViT|
    # 21 classes|dim 0|middle dim|10007|transposed"
    "smrows": (["sparsemax_forward"], [F32, BF16],
               [DEFAULTS] + [(sparsemax.CONFIG, v) for v in ({"fwd_thresholds": 4}, {"fwd_warp_elems": 128},
                                                          {"fwd_warp_elems": 64},
                                                          {"fwd_thresholds": 4, "fwd_warp_elems": 128},
                                                          {"fwd_short_row": 0})]
               + [DEFAULTS]),
    # ... and split rows (one launch an iteration): thresholds an iteration (4 shipped), rows held whole up to
    # 16384 (32768 shipped); with TUNE_CASES="sweep:32000|50257|rows of 1M|prime rows|16385|100000|pitch|long
    # strided"
    "smsplit": (["sparsemax_forward"], [F32, BF16],
                [DEFAULTS] + [(sparsemax.CONFIG, {"split_thresholds": g}) for g in (2, 8)]
                + [(sparsemax.CONFIG, {"fwd_row_max": 16384}), DEFAULTS]),
    # the upsampling plane kernel's register cap: the shipped rule (128 on planes of 1024 elements or more), none
    # (as before the cap), 128 and 96 on every plane; with TUNE_CASES="sweep:"
    "upsample_regs": (["upsample_bilinear2d_backward", "upsample_trilinear3d_backward", "upsample_linear1d_backward"],
                      [F32, BF16], [DEFAULTS, (upsample.CONFIG, {"plane_maxnreg": 0})]
                      + [(upsample.CONFIG, {"plane_maxnreg": r, "plane_maxnreg_min": 0}) for r in (128, 96)]),
    # upsampling's loop without mixed flags for tiles that have none (shipped), and every tile on the flagged loop;
    # with TUNE_CASES="sweep:" (or labels)
    "upsample_terms": (["upsample_bilinear2d_backward", "upsample_trilinear3d_backward", "upsample_bicubic2d_backward",
                        "_upsample_bilinear2d_aa_backward", "upsample_linear1d_backward"], [F32, BF16],
                       [DEFAULTS, (upsample.CONFIG, {"unmixed_loop": False})]),
    # max pooling's gather tiles: the slot budget as shipped, the old tiles (4 elements a thread whatever the
    # slots), then fixed tiles of 128 on 4 warps, 256 on 8 and 256 on 4; with TUNE_CASES="sweep:" (every case)
    "maxpool": (["max_pool3d_with_indices_backward", "adaptive_max_pool3d_backward"], [F32, BF16],
                [DEFAULTS, (max_pool.CONFIG, {"slot_budget": 1 << 20})]
                + [(max_pool.CONFIG, {"tile": t, "warps": w}) for t, w in ((128, 4), (256, 8), (256, 4))]),
    # avg_pool3d's overlapping tiles: shipped (a word a thread where W's stride is 1), the old tiles, 128 and 256
    # everywhere; with TUNE_CASES="sweep:"
    "avgpool": (["avg_pool3d_backward"], [F32, BF16, F16],
                [DEFAULTS, (avg_pool.CONFIG, {"shifted_thread_bytes": 1 << 20})]
                + [(avg_pool.CONFIG, {"tile": t}) for t in (128, 256)]),
    # avg_pool3d's rows told W's power of two, its reciprocals a row and a column, the column block padding rows
    # least, the row index split by magic numbers (all shipped), each off, the first two off; with TUNE_CASES="sweep:"
    "avgpool_rows": (["avg_pool3d_backward"], [F32, BF16, F16],
                     [DEFAULTS] + [(avg_pool.CONFIG, c) for c in ({"row_align": False}, {"reciprocals": False},
                                                                  {"min_bw": 1024},
                                                                  {"row_align": False, "reciprocals": False},
                                                                  {"magic": False})]),
    # adaptive average pooling's plane tiles with vector stores (row_align, shipped) and without; with
    # TUNE_CASES="sweep:"
    "adaptive_rows": (["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"], [F32, BF16],
                      [DEFAULTS, (adaptive_pool.CONFIG, {"row_align": False})]),
    # adaptive average pooling's divisions by magic numbers and its reciprocals a row (both shipped), the second off,
    # both off; with TUNE_CASES="sweep:"
    "adaptive_div": (["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"], [F32, BF16],
                     [DEFAULTS] + [(adaptive_pool.CONFIG, c) for c in ({"reciprocals": False},
                                                                       {"magic": False, "reciprocals": False})]),
    # the small tiles' register caps: shipped (f32 40, 16-bit 56), f32 56, none for either (offline sm_90, Triton
    # 3.9: f32 46-56 registers uncapped, 16-24 bytes of stack at 40; tiles that read their lengths spill 112 bytes f32,
    # 296 bf16); with TUNE_CASES="sweep:"
    "segredcap": (["_segment_reduce_backward"], [F32, BF16],
                  [DEFAULTS] + [(segment_max.CONFIG, {"segred_maxnreg": (*caps, ((False, 2), 64))})
                                for caps in ((((True, 2), 56), ((True, 4), 56)), ())]),
    "segred": (["_segment_reduce_backward"], [F32, F16],
               [DEFAULTS] + [_sr(*c) for c in ((48, 32, 1, 2), (64, 40, 2, 1), (56, 48, 2, 4), (56, 40, 1, 2),
                                                (72, 64, 1, 1), (48, 32, 2, 1), (56, 40, 1, 2))]),
    "sparsemax": (["sparsemax_backward", "sparsemax_forward"], [F32, BF16],
                  [DEFAULTS, _sm((2048, 4096), (256, 1024)), DEFAULTS]),
    "smbwd": (["sparsemax_backward"], [F32, BF16],
              [DEFAULTS, _sm((2048, 1024), (256, 256)), _sm((2048, 1024), (256, 128)), _sm((2048, 2048), (256, 1024)),
               _sm((2048, 2048), (256, 512)), _sm((2048, 8192), (256, 512)), _sm((2048, 8192), (256, 1024)),
               _sm((2048, 4096), (256, 1024)), DEFAULTS]),
    "smbwd1": (["sparsemax_backward"], [F32, BF16],  # the defaults against the earlier 4096-element tiles
               [DEFAULTS, _sm((2048, 4096), (256, 512)), _sm((2048, 1024), (256, 512)),
                _sm((2048, 1024), (256, 1024))] * 2),
    "smbwd_cap": (["sparsemax_backward"], [BF16, F32],  # the vector path's register cap: 32, none, 40
                  [DEFAULTS, *[(sparsemax.CONFIG, {"vec_maxnreg": cap}) for cap in (0, 40)], DEFAULTS]),
    "prelu": (["prelu_backward"], [F32, BF16],
              [DEFAULTS] + [(prelu.CONFIG, {"rows_max_partials": MappingProxyType({2: p, 4: p})})
                            for p in (1 << 30, 4096, 8192, 16384)]
              + [(prelu.CONFIG, {"cols_tile": t, "cols_target_programs": p, "cols_min_rows": r})
                 for t, p, r in ((4096, 4096, 0), (4096, 4096, 1024), (2048, 4096, 256), (4096, 792, 0))]),
    "prelu_cols": (["prelu_backward"], [BF16, F32],  # the column kernel's warps and tiles
                   [DEFAULTS] + [(prelu.CONFIG, dict(zip(("cols_warps", "cols_tile", "cols_min_rows"), c)))
                                 for c in ((8, 4096, 256), (2, 2048, 256), (8, 8192, 256), (4, 4096, 512),
                                           (2, 4096, 256), (4, 2048, 128))] + [DEFAULTS]),
    "pdl": (["prelu_backward", "where_backward", "lerp_backward", "repeat_backward", "_segment_reduce_backward",
             "segment_max_forward", "segment_max_backward"], [F32, BF16],
            [DEFAULTS, (launcher, {"PDL": False}), DEFAULTS]),  # kernels with and without PDL (the README's switch)
    "multi": (["lerp_backward", "where_backward"], [F32, BF16],
              [DEFAULTS] + [(multi_pointwise.CONFIG, {"flat_block": _each_size(b), "flat_warps": w})
                            for b, w in ((2048, 4), (2048, 8), (4096, 8), (512, 4), (1024, 8), (4096, 4))]),
    "flat": (["lerp_backward", "where_backward"], [F32, BF16],
             [DEFAULTS] + [(multi_pointwise.CONFIG, {"flat_block": _each_size(b), "flat_warps": w})
                           for b, w in ((1024, 4), (512, 4), (512, 2), (256, 2))] + [DEFAULTS]),
    "rows": (["lerp_backward", "where_backward"], [F32, BF16],
             [DEFAULTS] + [(multi_pointwise.CONFIG, {"rows_tile": t, "rows_max_bc": c, "rows_warps": w})
                           for t, c, w in ((2048, 2048, 4), (8192, 8192, 8), (4096, 4096, 4), (4096, 1024, 4),
                                           (8192, 4096, 16))]),
    "cols": (["where_backward"], [F32, BF16],
             [DEFAULTS] + [(multi_pointwise.CONFIG, {"cols_tile": t, "cols_max_bc": c, "cols_warps": w,
                                                     "cols_programs": p})
                           for t, c, w, p in ((4096, 1024, 4, 1024), (4096, 512, 4, 512), (4096, 1024, 4, 2048),
                                              (2048, 1024, 4, 512), (2048, 2048, 4, 2048))]),
    "repeat_rows": (["repeat_backward"], [BF16, F32],
                    [DEFAULTS] + [(reduction.CONFIG, c) for c in (
                        {"row_bytes_16": 1024}, {"long_tile_bytes": 16384},
                        {"row_bytes_16": 1024, "long_tile_bytes": 16384}, {"o_warps": 8},
                        {"row_bytes_16": 4096, "o_warps": 8})] + [DEFAULTS]),
    # the strided pass's 2-D tiles where an input is read across the output's layout: shipped (4096 on 8 warps),
    # never (the 1-D runs before), 4 warps, 2048 on 4; with TUNE_CASES="sweep:transposed|channels_last|mixed"
    "tiled": (["elu_backward", "hardsigmoid_backward"], [F32, BF16], [DEFAULTS] + [
        (elementwise.CONFIG, c) for c in _TILED]),
    "tiled_multi": (["where_backward", "lerp_backward", "prelu_backward"], [F32, BF16], [DEFAULTS] + [
        (multi_pointwise.CONFIG, c) for c in _TILED]),
    # results summed whole: a partial a program (totals, shipped) against the result at B written and read back;
    # with TUNE_CASES="sweep:mask|per column|scalar|0-d"
    "totals": (["where_backward", "lerp_backward"], [F32, BF16],
               [DEFAULTS, (multi_pointwise.CONFIG, {"totals": False})] * 2),
    # the reduction's tiles: [BT, BI] output tiles where x's unit stride is on a kept dim across the output
    # (tiled_tile 0: never), and ragged rows' tile bytes (ragged_tile_bytes 0: as other rows, 8192, 2048); with
    # TUNE_CASES="sweep:"
    "red_tiles": (["repeat_backward"], [F32, BF16],
                  [DEFAULTS, (reduction.CONFIG, {"tiled_tile": 0})]
                  + [(reduction.CONFIG, {"ragged_tile_bytes": b}) for b in (0, 8192, 2048)]),
    "repeat": (["repeat_backward"], [F32, BF16],  # (the step-sum switch it also tried is gone: step sums stay)
               [DEFAULTS, (reduction.CONFIG, {"min_programs": 1})]),
}

_active = contextlib.ExitStack()  # the override in force (config 0, the defaults: none)


def _apply(group_config) -> None:
    """Make `group_config`, a (Tunable, {field: value}) pair, a (module, {switch: value}) pair or DEFAULTS, the one in
    force; every plan is rebuilt."""
    _active.close()
    target, values = group_config
    if isinstance(target, config.Tunable):
        _active.enter_context(config.override(target, **values))
    elif target is not None:  # a module switch read on every call (launcher.PDL)
        _active.enter_context(mock.patch.multiple(target, **values))
    config.clear_plans()


def refs(out_dir: str) -> None:
    """Copies to compare with: the copy ceiling (2 GB moved), a copy as large as each op case, for pad the
    strided copy of grad_output's interior (the direct sources alone) by ATen, and for repeat (64, 1) a plain read
    of its grad (a read-only stream: no kernel that reads those bytes can take less)."""
    recs, env = [], _env()

    def rec(what, nbytes, fn):
        t = _ms(fn)
        recs.append({**env, "what": what, "ms": t, "gbs": nbytes / t / 1e6})
        print(f"ref {what}: {t:.4f} ms {nbytes / t / 1e6:.0f} GB/s", flush=True)

    for n in (1 << 28, 1 << 24, 1 << 22):
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        rec(f"copy f32 {n} elements ({8 * n >> 20} MB moved)", 8 * n, lambda: y.copy_(x))
    for dtype in (F32, BF16):
        for shape, p in (((8, 32, 32, 64, 64), 2), ((16, 64, 16, 128, 128), 1)):
            gshape = shape[:2] + tuple(s + 2 * p for s in shape[2:])
            g = torch.randn(gshape, device="cuda").to(dtype)
            gi = torch.empty(shape, device="cuda", dtype=dtype)
            interior = g[:, :, p:-p, p:-p, p:-p]
            rec(f"pad3d interior copy {dtype} {shape} pad {p}", (g.numel() + gi.numel()) * g.element_size(),
                lambda: gi.copy_(interior))
    for dtype in (F32, BF16):  # plain reads of repeat (64, 1)'s grad: what reading it alone takes
        x = torch.randn(64 * 4096 * 256, device="cuda").to(dtype)
        for chunk, block, w in ((1 << 14, 2048, 4), (1 << 14, 4096, 8), (1 << 15, 4096, 8), (1 << 16, 4096, 8)):
            out = torch.empty(x.numel() // chunk, device="cuda")
            rec(f"read alone {dtype} {x.numel() * x.element_size() >> 20} MB (repeat (64, 1)'s grad) chunk {chunk} "
                f"block {block} warps {w}", x.numel() * x.element_size(),
                lambda: _read[(x.numel() // chunk,)](x, out, BLOCK=block, CHUNK=chunk, num_warps=w))
    with open(os.path.join(out_dir, "tune-refs.json"), "w") as f:
        json.dump(recs, f, indent=0)


@triton.jit
def _read(x, out, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """Sum each CHUNK of x into one fp32 value: reads x once, writes almost nothing."""
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, CHUNK, BLOCK):
        acc += tl.load(x + pid * CHUNK + s + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid, tl.sum(acc, 0))


@dataclass(frozen=True)
class _SweepCase:  # a `bench --sweep` case, built, as a registry Case's fields (stock: its own stock call, if any)
    label: str
    args: tuple
    kwargs: dict
    bytes: int
    stock: tuple | None


def _cases(group):
    ops, dtypes, _ = GROUPS[group]
    source, _, labels = os.environ.get("TUNE_CASES", "registry").partition(":")
    for op in ops:
        for dtype in dtypes:
            torch.manual_seed(0)
            if source == "sweep":
                for c in bench_sweep.sweep_cases(op, dtype, torch.cuda.is_available()):
                    if any(part in c.label for part in labels.split("|")):
                        b = c.build(_runtime.default_device())
                        yield op, dtype, _SweepCase(c.label, b.args, b.kwargs, b.bytes, b.stock)
                continue
            for case in REGISTRY[op].cases(_runtime.default_device(), dtype, os.environ.get("TUNE_SIZE", "large")):
                yield op, dtype, case


def _ms(fn) -> float:
    if not torch.cuda.is_available():  # a smoke run under the interpreter (TUNE_SIZE=tiny): the numbers mean nothing
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    # TUNE_HOT_MS: calls back to back, unsynchronised, for that long first: without it small cases (< 50 us) read up
    # to 1.4-5x their time in a fresh process (docs/tuning/README.md, "Timing small cases")
    bench_sweep.run_hot(fn, float(os.environ.get("TUNE_HOT_MS", 0)))
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


def _env() -> dict:
    """The columns every record carries, so that figures from different cards and versions stay apart."""
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
            "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def time_group(group: str, out_dir: str) -> None:
    configs = GROUPS[group][2]
    env = _env()
    cases = list(_cases(group))
    records = []
    gpu_time, stock_gpu_host = torch.cuda.is_available() and bool(os.environ.get("TUNE_GPU_TIME")), {}
    with use(False):
        stock = {}
        for op, dtype, case in cases:
            fn, a, kw = getattr(case, "stock", None) or (REGISTRY[op].stock(), case.args, dict(case.kwargs))
            stock[(op, dtype, case.label)] = _ms(lambda: fn(*a, **kw))
            if gpu_time and stock[(op, dtype, case.label)] < bench_sweep.SLOW_MS:  # (stock's slowest take seconds)
                stock_gpu_host[op, dtype, case.label] = bench_sweep.gpu_host_us(lambda: fn(*a, **kw))
        for i, group_config in enumerate(configs):
            _apply(group_config)
            for op, dtype, case in cases:
                fn, a, kw = REGISTRY[op].fn, case.args, dict(case.kwargs)
                try:
                    if isinstance(case, _SweepCase):  # (checked as the sweep checks it)
                        ok = bench_sweep.check_result(op, dtype, a, kw, fn(*a, **kw)) or "ok"
                    else:
                        check_case(op, a, kw, what=f"{op} {case.label}")
                        ok = "ok"
                except Exception as e:  # noqa: BLE001
                    ok = f"{type(e).__name__}: {str(e)[:200]}"
                t = _ms(lambda: fn(*a, **kw))
                base = stock[(op, dtype, case.label)]
                rec = {**env, "group": group, "config": i, "family": getattr(group_config[0], "name", "defaults"),
                       "values": {k: repr(v) for k, v in group_config[1].items()}, "op": op,
                       "dtype": _runtime.DTYPE_NAMES[dtype], "case": case.label, "ms": t, "stock_ms": base,
                       "gbs": case.bytes / t / 1e6, "vs_stock": base / t, "check": ok}
                if gpu_time:
                    rec["gpu_us"], rec["host_us"] = bench_sweep.gpu_host_us(lambda: fn(*a, **kw))
                    rec["stock_gpu_us"], rec["stock_host_us"] = stock_gpu_host.get((op, dtype, case.label),
                                                                                   (None, None))
                records.append(rec)
                extra = f" gpu {rec['gpu_us']:.1f} us host {rec['host_us']:.1f} us" if gpu_time else ""
                print(f"{group} cfg{i} {op} {rec['dtype']} {case.label}: {t:.4f} ms {rec['gbs']:.0f} GB/s "
                      f"{rec['vs_stock']:.2f}x{extra} {ok[:60]}", flush=True)
        _apply(configs[0])
    with open(os.path.join(out_dir, f"tune-{group}.json"), "w") as f:
        json.dump(records, f, indent=0, default=str)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compile":
        compile_one(sys.argv[2], int(sys.argv[3]))
    elif mode == "list":
        print("\n".join(f"{g} {i}" for g in sys.argv[2:] if g in GROUPS for i in range(len(GROUPS[g][2]))))
    else:
        out = os.environ.get("OUT", ".")
        for g in sys.argv[2:]:
            refs(out) if g == "refs" else time_group(g, out)
