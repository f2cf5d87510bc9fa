"""`python -m gradkern bench --sweep`: the case listing (>= 24 per op and dtype, deterministic, nothing built), the
adversarial kinds the generators make, honest bytes, tiny cases against stock, a smoke run's JSON and summary,
failures marked instead of timed, merging runs, and the arguments."""

import collections
import json
import math

import pytest
import torch

import gradkern
from conftest import DEVICE, gpu_only, import_script
from gradkern.registry import REGISTRY
from gradkern.tools import bench_sweep, cli

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _built(op, dtype=torch.float32, full=False, pick=None):
    """(case, built) of every tiny case of `op` (or those whose label `pick` accepts)."""
    return [(c, c.build(DEVICE if not full else "meta")) for c in bench_sweep.sweep_cases(op, dtype, full)
            if pick is None or pick(c.label)]


def _tensors(built) -> list[torch.Tensor]:
    return [t for t in (*built.args, *built.kwargs.values()) if isinstance(t, torch.Tensor)]


def test_list_has_24_cases_per_op_and_dtype_and_builds_nothing(capfd, monkeypatch):
    monkeypatch.setattr(bench_sweep, "measure_case", None)  # (a call would raise)
    monkeypatch.setattr(bench_sweep._Ctx, "__init__", None)  # (so would building a case)
    assert cli.main(["bench", "--sweep", "--list"]) == 0
    lines = capfd.readouterr().out.splitlines()
    per = collections.defaultdict(list)
    for line in lines:
        op, dt, label = line.split(" ", 2)
        per[(op, dt)].append(label)
    assert set(per) == {(op, dt) for op in REGISTRY for dt in DTYPES}
    for key, labels in per.items():
        assert len(labels) >= bench_sweep.MIN_CASES, key
        assert len(set(labels)) == len(labels), key
    # --cases and --ops narrow it
    assert cli.main(["bench", "--sweep", "--list", "--ops", "where_backward", "--dtypes", "bf16", "--cases", "3"]) == 0
    out = capfd.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.startswith("where_backward bf16 ") for line in out)


def test_full_scale_cases_are_listed_the_same_way():
    for op in REGISTRY:
        for dt in DTYPES.values():
            labels = [c.label for c in bench_sweep.sweep_cases(op, dt, full=True)]
            assert len(labels) >= bench_sweep.MIN_CASES and len(set(labels)) == len(labels), op


def test_generators_are_deterministic():
    assert bench_sweep.list_lines(sorted(REGISTRY), list(DTYPES.values())) == \
        bench_sweep.list_lines(sorted(REGISTRY), list(DTYPES.values()))
    for op, idx in (("hardsigmoid_backward", 3), ("segment_max_forward", 10), ("sparsemax_backward", 1)):
        a = bench_sweep.sweep_cases(op, torch.bfloat16, False)[idx].build(DEVICE)
        b = bench_sweep.sweep_cases(op, torch.bfloat16, False)[idx].build(DEVICE)
        assert a.bytes == b.bytes
        for x, y in zip(_tensors(a), _tensors(b), strict=True):
            assert x.stride() == y.stride() and torch.equal(x, y)
    # every dtype sees the same values
    f32 = bench_sweep.sweep_cases("where_backward", torch.float32, False)[1].build(DEVICE)
    f16 = bench_sweep.sweep_cases("where_backward", torch.float16, False)[1].build(DEVICE)
    torch.testing.assert_close(f16.args[0].float(), f32.args[0], atol=2e-3, rtol=1e-3)


def test_the_adversarial_kinds_are_there():
    pw = _built("hardsigmoid_backward")
    assert any(b.args[0].numel() % 16 for _, b in pw)  # numel not a multiple of 16
    assert any(t.dim() == 2 and t.stride(0) == 1 and t.stride(1) > 1 for _, b in pw for t in _tensors(b))  # transposed
    assert any(t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
               for _, b in pw for t in _tensors(b))
    assert any(0 in t.stride() for _, b in pw for t in _tensors(b))  # expanded
    assert any(b.args[0].shape != b.args[1].shape for _, b in pw)  # broadcast
    assert any(b.args[0].stride() != b.args[1].stride() for _, b in pw)  # operands of different layouts
    assert any(t.storage_offset() % 2 for _, b in pw for t in _tensors(b))  # misaligned
    pads = [b.args[2] for _, b in _built("replication_pad2d_backward")]
    assert any(min(p) < 0 for p in pads) and any(len(set(p)) > 1 for p in pads) and any(max(p) == 7 for p in pads)
    assert any(min(p) < 0 for p in (b.args[2] for _, b in _built("reflection_pad1d_backward")))
    offsets = [b.args[1] for _, b in _built("segment_max_forward")]
    assert any((o.diff() == 0).any() for o in offsets)  # an empty segment
    assert any((o.diff() == 1).all() for o in offsets)  # unit lengths
    widths = {b.args[0].shape[-1] for _, b in _built("segment_max_forward")}
    assert {1, 3, 40, 64, 100, 256} <= widths
    dims = {(b.args[0].dim(), b.args[1] % b.args[0].dim()) for _, b in _built("sparsemax_forward")}
    assert (2, 0) in dims and (3, 1) in dims and (2, 1) in dims  # first, middle and last dims
    labels = [c.label for c in bench_sweep.sweep_cases("sparsemax_forward", torch.float32, True)]
    assert any("1048576" in lab for lab in labels) and any(lab.endswith("(rows of 100)") for lab in labels)


# families whose builders run no kernel can be built on the meta device at full scale: their largest cases move
# more than 256 MB in every dtype
@pytest.mark.parametrize("op", ["hardsigmoid_backward", "hardshrink", "where_backward", "lerp_backward",
                                "prelu_backward", "_prelu_kernel_backward", "replication_pad1d_backward",
                                "reflection_pad2d_backward", "replication_pad3d_backward", "repeat_backward",
                                "sparsemax_forward", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"])
def test_full_scale_spans_64k_elements_to_over_256mb(op):
    if op not in REGISTRY:
        pytest.skip(f"{op} is not registered")
    for dt in (torch.float16, torch.float32):
        sizes = [b.bytes for _, b in _built(op, dt, full=True)]
        assert max(sizes) > 256e6, (op, dt)
        assert min(sizes) < 4e6, (op, dt)


def test_bytes_are_the_minimum_the_op_moves():
    el = {torch.float32: 4, torch.bfloat16: 2}
    for dt, e in el.items():
        (_, b), = _built("hardsigmoid_backward", dt, pick=lambda lab: lab.startswith("4096 "))
        assert b.bytes == 3 * 4096 * e
        (_, b), = _built("hardshrink", dt, pick=lambda lab: lab.startswith("4096 "))
        assert b.bytes == 2 * 4096 * e
    # where: grad and condition (1 byte) read, grad_self (64x80) and grad_other (64x1) written; self/other not read
    (_, b), = _built("where_backward", pick=lambda lab: lab == "64x80 other per row")
    assert b.bytes == 64 * 80 * (4 + 1 + 4) + 64 * 4
    # lerp with a Python weight: grad read, grad_self and grad_end written
    (_, b), = _built("lerp_backward", pick=lambda lab: lab == "64x64 64K")
    assert b.bytes == 3 * 64 * 64 * 4
    # prelu: grad_output, self read, grad_input written; the 8 weights read and grad_weight written
    (_, b), = _built("prelu_backward", pick=lambda lab: lab == "2x8x14x14 contiguous (ResNet)")
    assert b.bytes == (3 * 2 * 8 * 14 * 14 + 2 * 8) * 4
    # pad: grad_output (1x3x26x28) read, grad_input (1x3x20x22) written; an expanded grad_output once per batch
    (_, b), = _built("replication_pad2d_backward", pick=lambda lab: lab.endswith("(CycleGAN stem)"))
    assert b.bytes == (3 * 26 * 28 + 3 * 20 * 22) * 4
    (_, b), = _built("replication_pad2d_backward", pick=lambda lab: "expanded" in lab)
    assert b.bytes == (4 * 11 * 12 + 2 * 4 * 9 * 10) * 4
    # repeat: grad (8x10x16) read, the input (1x10x16) written
    (_, b), = _built("repeat_backward", pick=lambda lab: "DETR" in lab)
    assert b.bytes == (8 * 10 * 16 + 10 * 16) * 4
    # sparsemax backward: y read and dx written in full, grad only on the support
    for case, b in _built("sparsemax_backward", pick=lambda lab: "rows of 100" in lab):
        g, y, _dim = b.args
        assert b.bytes == (2 * y.numel() + int((y > 0).sum())) * 4 and b.extra["support"] == int((y > 0).sum())
        assert ("whole-row" in case.label) == (b.bytes == 3 * y.numel() * 4)
    # segment max: data and the offsets read, values and int64 indices written; backward: grad and the indices
    # read, every row of grad_data written (the offsets not counted)
    (case, b), = _built("segment_max_forward", pick=lambda lab: lab.startswith("N=300 D=1 lengths unit"))
    n, s = 300, 300
    assert b.bytes == n * 4 + s * (4 + 8) + (s + 1) * 8
    (case, b), = _built("segment_max_backward", pick=lambda lab: lab.startswith("N=300 D=1 lengths unit"))
    assert b.bytes == s * (4 + 8) + n * 4
    (case, b), = _built("_segment_reduce_backward", pick=lambda lab: lab.startswith("N=300 D=1 lengths unit"))
    assert b.bytes == s * 4 * 2 + n * 4 + s * 8 + n * 4


# (interpreter: each op's first case and a layout case from the middle of its list; on a GPU, more)
@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_tiny_cases_match_stock(op):
    cases = bench_sweep.sweep_cases(op, torch.float32, False)
    picks = [cases[0], cases[len(cases) // 2]] if gradkern.device().type == "cpu" else cases[:8]
    for case in picks:
        rec = bench_sweep.measure_case(case, DEVICE, False, 1.0, False)
        assert rec["status"] == "ok", (case.label, rec["status"])
        assert rec["bytes"] > 0 and rec["gradkern_ms"] > 0 and rec["aten_ms"] > 0


def test_16_bit_cases_match_stock():
    for op, dt in (("where_backward", torch.bfloat16), ("sparsemax_forward", torch.float16),
                   ("_segment_reduce_backward", torch.bfloat16)):
        rec = bench_sweep.measure_case(bench_sweep.sweep_cases(op, dt, False)[0], DEVICE, False, 1.0, False)
        assert rec["status"] == "ok", (op, rec["status"])


def test_f16_nll_mean_past_65504_elements_is_checked_in_float32():
    """Stock's nll_loss2d_forward sums total_weight in the input's dtype, so an f16 mean over more than 65504
    elements divides by inf and is 0 (CPU and CUDA alike); gradkern's is the mean. The sweep's check compares with
    a float32 reference rounded to f16 (total_weight inf on both sides): before, every such sweep case was marked
    wrong."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 200, 200, generator=g).half().to(DEVICE)  # 80000 elements
    t = torch.randint(0, 5, (2, 200, 200), generator=g).to(DEVICE)
    args = (x, t, None, 1, -100)
    ours = gradkern.ops.nll_loss2d_forward(*args)
    assert float(ours[0]) != 0.0 and torch.isinf(ours[1])
    assert bench_sweep.check_result("nll_loss2d_forward", torch.float16, args, {}, ours) is None


def test_f16_prelu_weight_gradient_is_checked_in_float32():
    """Stock's prelu backward rounds each g * x term of grad_weight to f16 before summing; where the terms cancel,
    its f16 sum misses by many of the result's ulps (the sweep's f16 1-D one-weight case: 0.195 against 0.08
    allowed). gradkern sums the exact products. Here pairs of terms -(1 + 2^-9 + 2^-20) and 1 + 2^-9 sum to -2^-10
    exactly, to 0 when rounded first. The check compares with a float32 reference rounded to f16."""
    n = 2048
    g = torch.tensor([1 + 2 ** -10, -(1 + 2 ** -9)] * (n // 2)).half().to(DEVICE)
    x = torch.tensor([-(1 + 2 ** -10), -1.0] * (n // 2)).half().to(DEVICE)
    w = torch.tensor([0.25]).half().to(DEVICE)
    ours = gradkern.ops.prelu_backward(g, x, w)
    assert float(ours[1]) == -(2 ** -10)
    assert bench_sweep.check_result("prelu_backward", torch.float16, (g, x, w), {}, ours) is None


def test_a_reference_that_raises_on_the_device_is_run_on_cpu_copies(monkeypatch):
    """Where stock raises on the device (torch 2.11's CUDA reflection_pad1d_backward at 65536 planes of one channel),
    the check's reference comes from CPU copies of the arguments; one that raises on the CPU too still raises."""
    seen = []

    def ref(x, scale=1.0):
        seen.append(x)
        if len(seen) == 1:
            raise RuntimeError("CUDA error: invalid argument")
        return x * scale
    x = torch.arange(6.0)
    monkeypatch.setattr(bench_sweep, "_off_cpu", lambda args, kwargs: True)  # (as if x were on a GPU)
    assert torch.equal(bench_sweep._reference(ref, (x,), {"scale": 2.0}), 2 * x)
    assert seen[0] is x and seen[1] is not x
    monkeypatch.setattr(bench_sweep, "_off_cpu", lambda args, kwargs: False)  # (all on the CPU already)
    seen.clear()
    with pytest.raises(RuntimeError, match="invalid argument"):
        bench_sweep._reference(ref, (x,), {})


@gpu_only
def test_reflection_pad1d_case_where_stock_cannot_launch_is_checked():
    case = next(c for c in bench_sweep.sweep_cases("reflection_pad1d_backward", torch.float32, True)
                if c.label.startswith("65536x1x64"))
    rec = bench_sweep.measure_case(case, DEVICE, True, 1.0, False)
    assert rec["status"] == "ok", rec["status"]


def test_fallback_for_an_op_without_a_generator(monkeypatch):
    monkeypatch.delitem(bench_sweep.GENERATORS, "hardshrink")
    cases = bench_sweep.sweep_cases("hardshrink", torch.float32, False)
    assert cases and all(c.label.startswith("registry small: ") for c in cases)
    assert {c.label.rsplit("(", 1)[1] for c in cases} == {"as given)", "strided)"}  # (1-D: not transposed)
    rec = bench_sweep.measure_case(cases[1], DEVICE, False, 1.0, False)
    assert rec["status"] == "ok"
    assert rec["bytes"] == REGISTRY["hardshrink"].cases(DEVICE, torch.float32, "small")[0].bytes


def test_smoke_run_writes_json_table_and_plot(tmp_path, capfd):
    path, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["bench", "--sweep", "--ops", "hardsigmoid_backward", "--dtypes", "f32", "--cases", "2", "--json",
            str(path), "--plot", str(png)]
    assert cli.main(argv) == 0
    out = capfd.readouterr().out
    assert "vs ATen min / geomean" in out and "hardsigmoid_backward" in out and "% copy" in out
    assert png.stat().st_size > 0
    result = json.loads(path.read_text())
    assert {"benchmark", "device", "torch", "triton", "gradkern", "date", "copy_ceiling_gbs", "timing", "complete",
            "variants", "summary", "records"} <= result.keys()
    assert result["benchmark"] == "sweep" and result["complete"] and result["copy_ceiling_gbs"] > 0
    recs = result["records"]
    assert len(recs) == 2
    gpu = gradkern.device().type != "cpu"
    for r in recs:
        assert r["op"] == "hardsigmoid_backward" and r["status"] == "ok" and r["bytes"] > 0
        for key in ("gradkern_ms", "aten_ms", "pct_copy", "speedup_vs_aten", "gradkern_gbs") + (
                ("compile_ms", "speedup_vs_compile") if gpu else ()):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert r["compile_kernel"] == ("inductor" if gpu else None)  # (Inductor makes its own pointwise kernel)
        assert r["speedup_vs_aten"] == pytest.approx(r["aten_ms"] / r["gradkern_ms"])
        assert r["pct_copy"] == pytest.approx(100 * r["bytes"] / (r["gradkern_ms"] * 1e-3) / 1e9
                                              / result["copy_ceiling_gbs"])
    (op_row,) = result["summary"]["per_op"]
    for key in ("vs_aten_min", "vs_aten_geomean", "vs_compile_min", "vs_compile_geomean", "pct_copy_min",
                "pct_copy_geomean", "large_pct_copy_geomean", "large_pct_copy_min", "large_cases", "variants",
                "vs_aten_min_case", "cases", "ok", "failed"):
        assert key in op_row, key
    assert op_row["cases"] == op_row["ok"] == len(recs) and op_row["failed"] == 0
    assert op_row["vs_aten_min"] == min(r["speedup_vs_aten"] for r in recs)
    speedups = [r["speedup_vs_aten"] for r in recs]
    assert op_row["vs_aten_geomean"] == pytest.approx(math.prod(speedups) ** (1 / len(speedups)))
    assert {r["dtype"] for r in result["summary"]["per_op_dtype"]} == {r["dtype"] for r in recs}


def test_a_wrong_result_is_marked_not_timed(monkeypatch, capfd):
    real = gradkern.ops.hardsigmoid_backward
    monkeypatch.setattr(gradkern.ops, "hardsigmoid_backward", lambda g, x: real(g, x) + 1)
    assert cli.main(["bench", "--sweep", "--ops", "hardsigmoid_backward", "--cases", "1", "--dtypes", "f32"]) == 1
    out = capfd.readouterr().out
    assert "FAIL" in out and "1 case(s) not ok" in out  # (one case: the first, in f32 alone, on a GPU too)
    rec = bench_sweep.measure_case(bench_sweep.sweep_cases("hardsigmoid_backward", torch.float32, False)[0], DEVICE,
                                   False, 1.0, False)
    assert rec["status"].startswith("FAIL") and rec["gradkern_ms"] is None and rec["speedup_vs_aten"] is None


def _record(op, dt, case, ours, aten, comp=None, kind=None, nbytes=1 << 27, status="ok"):
    rec = {"op": op, "family": bench_sweep.family_of(op), "dtype": dt, "case": case, "index": 0, "status": status,
           "bytes": nbytes, "gradkern_ms": ours, "aten_ms": aten, "compile_ms": comp, "compile_kernel": kind}
    bench_sweep._derive(rec, 3000.0)
    return rec


def _result(records):
    return {"benchmark": "sweep", "device": "test GPU", "copy_ceiling_gbs": 3000.0, "elapsed_s": 1.0,
            "complete": True, "variants": {"where_backward": 3}, "records": records}


def test_summary_compile_only_where_inductor_made_a_kernel_and_merge(tmp_path, capfd):
    a = [_record("where_backward", "f32", "c1", 1.0, 2.0, 3.0, "inductor"),
         _record("where_backward", "f32", "c2", 1.0, 0.5, 0.25, "fallback (aten.where)"),
         _record("where_backward", "bf16", "c1", 1.0, 4.0, 2.0, "mixed (aten.sort)", nbytes=1000)]
    b = [_record("replication_pad2d_backward", "f32", "c1", 2.0, 1.0, 1.0, "fallback (aten.x)"),
         _record("replication_pad2d_backward", "f32", "c2", None, None, status="FAIL: output 0: values differ")]
    pa, pb, out, png = (tmp_path / n for n in ("a.json", "b.json", "all.json", "all.png"))
    pa.write_text(json.dumps(_result(a)))
    pb.write_text(json.dumps(_result(b)))
    assert cli.main(["bench", "--sweep", "--merge", f"{pa},{pb}", "--json", str(out), "--plot", str(png)]) == 1
    printed = capfd.readouterr().out
    assert "FAIL" in printed and png.stat().st_size > 0
    merged = json.loads(out.read_text())
    assert len(merged["records"]) == 5 and merged["merged_from"] == [str(pa), str(pb)]
    rows = {r["op"]: r for r in merged["summary"]["per_op"]}
    w = rows["where_backward"]
    assert w["vs_aten_min"] == 0.5 and w["vs_aten_geomean"] == pytest.approx((2 * 0.5 * 4) ** (1 / 3))
    assert w["compile_cases"] == 2 and w["vs_compile_min"] == 2.0 and w["compile_fallback_cases"] == 1
    assert w["large_cases"] == 2 and w["variants"] == 3
    p = rows["replication_pad2d_backward"]
    assert p["failed"] == 1 and p["ok"] == 1 and p["compile_cases"] == 0 and p["vs_compile_min"] is None


def test_classify_compiled():
    own = "triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', '''...''')\n"
    fb = "buf0 = torch.ops.aten.replication_pad2d_backward.default(arg0_1, arg1_1, [1, 1, 1, 1])\n"
    assert bench_sweep.classify_compiled(own) == "inductor"
    assert bench_sweep.classify_compiled(fb) == "fallback (aten.replication_pad2d_backward)"
    assert bench_sweep.classify_compiled(own + "buf1 = aten.sort.stable(x)\n") == "mixed (aten.sort)"
    assert bench_sweep.classify_compiled("extern_kernels.mm(a, b, out=c)") == "fallback (aten.mm)"
    assert bench_sweep.classify_compiled("") == "none"
    # the stock op kept as a fallback beside a helper kernel (a copy, a zero fill) is a fallback
    kept = own + "buf1 = torch.ops.aten._adaptive_avg_pool2d_backward.default(x, y)\n"
    assert bench_sweep.classify_compiled(kept, "_adaptive_avg_pool2d_backward").startswith(
        "fallback (aten._adaptive_avg_pool2d_backward; 1 helper kernel")
    assert bench_sweep.classify_compiled(kept).startswith("mixed")


@pytest.mark.parametrize("argv", [
    ["bench", "--sweep", "--models"],
    ["bench", "--sweep", "--size", "small"],
    ["bench", "--sweep", "--cases", "0"],
    ["bench", "--sweep", "--time-limit", "-1"],
    ["bench", "--sweep", "--compile-cases", "x"],
    ["bench", "--compile-cases", "2"],
    ["bench", "--cases", "2"],  # (only with --sweep)
    ["bench", "--gpu-time"],
    ["bench", "--merge", "a.json"],
    ["bench", "--sweep", "--merge", "/nonexistent-gradkern-dir/a.json"],
    ["bench", "--sweep", "--merge", "a.json", "--ops", "hardshrink"],
    ["bench", "--sweep", "--json", "/nonexistent-gradkern-dir/sweep.json"],
])
def test_bad_sweep_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_gpu_time_speedup_and_host_bound_cases_in_the_summary(capfd):
    """With GPU times the records carry the speedup on GPU time and whether gradkern's host is the slower side;
    the summary gives their min / geomean and count, and the table a column for them (none without)."""
    recs = [_record("where_backward", "f32", "c1", 0.1, 0.2), _record("where_backward", "f32", "c2", 0.1, 0.1),
            _record("where_backward", "f32", "c3", 0.1, 0.3)]
    for rec, (ours, host, aten) in zip(recs, ((10.0, 30.0, 20.0), (40.0, 20.0, 20.0), (5.0, 1.0, None)),
                                       strict=True):
        rec.update(gradkern_gpu_us=ours, gradkern_host_us=host, aten_gpu_us=aten)
        bench_sweep._derive(rec, 3000.0)
    assert recs[0]["speedup_gpu_vs_aten"] == 2.0 and recs[0]["host_bound"]
    assert recs[1]["speedup_gpu_vs_aten"] == 0.5 and not recs[1]["host_bound"]
    assert "speedup_gpu_vs_aten" not in recs[2]  # (stock's call was not profiled)
    (row,) = bench_sweep.summarize(recs)["per_op"]
    assert (row["gpu_vs_aten_min"], row["gpu_vs_aten_min_case"]) == (0.5, "f32 c2")
    assert row["gpu_vs_aten_geomean"] == pytest.approx(1.0)
    assert (row["gpu_cases"], row["host_bound_cases"]) == (2, 1)
    bench_sweep.print_summary(bench_sweep.summarize(recs))
    assert "GPU time vs ATen" in capfd.readouterr().out
    bench_sweep.print_summary(bench_sweep.summarize([_record("where_backward", "f32", "c1", 0.1, 0.2)]))
    assert "GPU time vs ATen" not in capfd.readouterr().out


def test_busy_time_counts_overlapping_kernels_once_and_gaps_not_at_all():
    assert bench_sweep.busy_us([]) == 0.0
    assert bench_sweep.busy_us([(10.0, 14.0), (0.0, 5.0), (3.0, 6.0), (12.0, 13.0), (20.0, 21.0)]) == 11.0


@gpu_only
def test_gpu_time_records_both_sides():
    case = bench_sweep.sweep_cases("hardsigmoid_backward", torch.float32, True)[0]
    rec = bench_sweep.measure_case(case, DEVICE, True, 1.0, False, gpu_time=True)
    for key in ("gradkern_gpu_us", "gradkern_host_us", "aten_gpu_us", "aten_host_us", "speedup_gpu_vs_aten"):
        assert rec[key] > 0, key


def test_cli_help_states_the_interpreter_case_count():
    assert cli._SWEEP_INTERP_CASES == bench_sweep.INTERP_CASES


def test_records_say_who_serves_a_case_under_enable_and_its_speedup_there():
    """A case whose route sends it to stock (activation backwards: route=False) counts 1.0x as enable() routes
    it; one gradkern serves keeps the kernel's speedup; the summary has both."""
    recs = [bench_sweep.measure_case(bench_sweep.sweep_cases(op, torch.float32, False)[0], DEVICE, False, 1.0, False)
            for op in ("hardsigmoid_backward", "_adaptive_avg_pool2d_backward")]
    assert [r["route"] for r in recs] == ["stock", "gradkern"]
    assert recs[0]["speedup_routed"] == 1.0 and recs[1]["speedup_routed"] == recs[1]["speedup_vs_aten"]
    rows = {r["op"]: r for r in bench_sweep.summarize(recs)["per_op"]}
    assert rows["hardsigmoid_backward"]["routed_min"] == 1.0 and rows["hardsigmoid_backward"]["routed_stock_cases"] == 1
    assert rows["_adaptive_avg_pool2d_backward"]["routed_geomean"] == pytest.approx(recs[1]["speedup_vs_aten"])


@gpu_only
def test_calls_of_seconds_are_timed_twice_not_by_do_bench(monkeypatch):
    """A call of at least SLOW_MS is timed twice and the faster kept (do_bench makes 8 calls at the least: minutes
    for stock's slowest segment cases); a short one goes to do_bench."""
    import time

    calls, long_s = [], bench_sweep.SLOW_MS * 1.5e-3

    def call():  # (host time between the two events counts: the kernel is queued after the sleep)
        calls.append(1)
        time.sleep(long_s if len(calls) <= 2 else 0.0)
        torch.empty(1, device="cuda").zero_()
    assert bench_sweep._time_ms(call, True) >= bench_sweep.SLOW_MS and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(bench_sweep, "SLOW_MS", 1e9)
    bench_sweep._time_ms(call, True)
    assert len(calls) > 2


def test_run_case_script_runs_one_sweep_case_for_a_profiler(capsys, monkeypatch):
    """scripts/run_case.py (the case a profiler catches): the first case whose label holds the text, gradkern's op
    or the sweep's stock call, under a config override (restored after); exit 2 where no case matches."""
    run_case = import_script("run_case")
    from gradkern import config
    from gradkern.kernels import segment_max as sm

    seen = []
    real = config.override

    def spy(tunable, *a, **changes):
        seen.append((tunable.name, changes))
        return real(tunable, *a, **changes)

    monkeypatch.setattr(config, "override", spy)
    assert run_case.main(["_segment_reduce_backward", "f32", "D=1 lengths u", "--repeat", "1",
                          "--config", "segment_max", "lanes_write_rows=((4, 2),)"]) == 0
    assert seen == [("segment_max", {"lanes_write_rows": ((4, 2),)})]
    assert sm.CONFIG.current is sm.CONFIG.default
    assert run_case.main(["segment_max_forward", "bf16", "D=3 lengths u", "--stock", "--repeat", "1"]) == 0
    assert run_case.main(["segment_max_forward", "bf16", "no such case"]) == 2
    out = capsys.readouterr()
    assert "ran gradkern 1x" in out.out and "ran stock 1x" in out.out and "no such case" in out.err
