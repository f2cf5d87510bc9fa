#!/usr/bin/env python
"""Where a training step's deterministic-mode cost goes, on a CUDA GPU (docs/tuning/routing.md, "What deterministic
mode still costs"):

    PYTHONPATH=src python3 scripts/det_cost.py vnet,psp-seg f32,bf16 [small,large] [ROUNDS]

For each model of the model benchmark (`gradkern.tools.bench_models`), size and dtype, five modes train copies of
the same model from the same seed, timed in rounds as the benchmark times its two (one run of ~40 ms of steps a
mode a round, in turns): stock with deterministic mode off, gradkern with it off, gradkern with it on, gradkern
with it on but `torch.utils.deterministic.fill_uninitialized_memory` off, and stock likewise. Per mode: the fastest
and median run's ms a step, CPU issue ms, CUDA kernel launches a step (profiler), and the median over rounds of
stock det-off's run / this mode's run. Then the launches that differ between stock det-off and gradkern det-on
without the fill (what deterministic mode still changes in ops gradkern does not serve), and those the fill adds.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before its first handle

import torch  # noqa: E402

from gradkern import _runtime  # noqa: E402
from gradkern.routing.dispatch import use  # noqa: E402
from gradkern.tools import bench_models as bm  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# (name, deterministic mode, NaN fill of uninitialized memory, whose ops)
MODES = (("stock det-off", False, True, "stock"), ("gradkern det-off", False, True, "gradkern"),
         ("gradkern det-on", True, True, "gradkern"), ("gradkern det-on, no fill", True, False, "gradkern"),
         ("stock det-on, no fill", True, False, "stock"))
RUN_MS = 40.0  # ms of steps a timed run


def launches(step) -> collections.Counter:
    """CUDA kernels (and memsets, copies) a step, by name: the mean over three steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    count = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            count[e.name] += 1 / 3
    return count


class Mode:
    def __init__(self, spec, cls, size: str, dtype: torch.dtype):
        self.name, self.det, self.fill, whose = spec
        self.ctx = bm.stock_pytorch if whose == "stock" else use
        torch.manual_seed(0)
        cfg = cls.configs[size]
        self.step = bm._step_fn(cls.make(cfg.batch, dtype, "cuda", **cfg.kw))
        self.wall, self.issue, self.error = [], [], None

    def run(self, fn):
        """fn() in this mode's settings (restored after); None once the mode has raised."""
        if self.error:
            return None
        torch.use_deterministic_algorithms(self.det)
        torch.utils.deterministic.fill_uninitialized_memory = self.fill
        try:
            with self.ctx():
                return fn()
        except RuntimeError as e:
            self.error = str(e).splitlines()[0][:80]
            return None
        finally:
            torch.use_deterministic_algorithms(False)
            torch.utils.deterministic.fill_uninitialized_memory = True


def _diff(a: collections.Counter, b: collections.Counter, most: int) -> str:
    keys = sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k]))[:most]
    return "; ".join(f"{b[k] - a[k]:+.0f} {k.removeprefix('void ')[:60]}" for k in keys if abs(b[k] - a[k]) >= 0.5)


def measure(cls, size: str, dtype: torch.dtype, rounds: int) -> None:
    modes = [Mode(spec, cls, size, dtype) for spec in MODES]
    estimates = []
    for m in modes:
        m.run(lambda m=m: [m.step() for _ in range(bm.WARMUP + 2)])
        est = m.run(lambda m=m: bm._time(m.step, 3, True)[0])
        if est:
            estimates.append(est)
    n = max(3, min(400, int(RUN_MS / max(estimates))))
    for _ in range(rounds):
        for m in modes:  # in turns, as the benchmark's rounds
            t = m.run(lambda m=m: bm._timed_run(m.step, n, bm.RUN_WARMUP, True))
            if t:
                m.wall.append(t[0])
                m.issue.append(t[1])
    counts = {m.name: m.run(lambda m=m: launches(m.step)) for m in modes}
    print(f"\n{cls.name} {size} {_runtime.DTYPE_NAMES[dtype]}: {n} steps a run, {rounds} rounds", flush=True)
    base = modes[0]
    for m in modes:
        if m.error:
            print(f"  {m.name:26s} raises: {m.error}")
            continue
        paired = statistics.median(s / x for s, x in zip(base.wall, m.wall, strict=True))
        print(f"  {m.name:26s} ms a step: fastest {min(m.wall):7.3f}, median {statistics.median(m.wall):7.3f}; "
              f"issue {min(m.issue):7.3f}; launches {sum(counts[m.name].values()):5.0f}; "
              f"stock det-off / this {paired:.2f}x")
    off, on, nofill = (counts[k] for k in ("stock det-off", "gradkern det-on", "gradkern det-on, no fill"))
    if off and nofill:
        print(f"  launches, gradkern det-on without the fill - stock det-off: {_diff(off, nofill, 6) or 'none'}")
    if on and nofill:
        print(f"  launches the fill adds: {_diff(nofill, on, 3) or 'none'}")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not torch.cuda.is_available():
        print(__doc__)
        return 2
    names, dtypes = argv[0].split(","), [DTYPES[d] for d in argv[1].split(",")]
    sizes = argv[2].split(",") if len(argv) > 2 else ["small"]
    rounds = int(argv[3]) if len(argv) > 3 else 11
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in names:
        for size in sizes:
            for dtype in dtypes:
                measure(bm.MODELS[name], size, dtype, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
