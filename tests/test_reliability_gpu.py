"""GPU-only reliability checks (they skip under the interpreter): 1,000 runs with identical bits for every op,
tensors on a second GPU, tensors of more than 2^31 elements, and a two-GPU DDP step under enable()."""

import os
import socket

import pytest
import torch

import gradkern
from conftest import gpu_only
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, check_case

pytestmark = gpu_only
RUNS = int(os.environ.get("GRADKERN_DETERMINISM_RUNS", "1000"))
two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA GPUs")


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_thousand_runs_same_bits(name):
    """`deterministic` in every guarantee, checked: RUNS launches on the same inputs give the same bits."""
    info = REGISTRY[name]
    for dtype in (torch.float32, torch.bfloat16):
        if dtype not in info.dtypes:
            continue
        torch.manual_seed(0)
        case = info.cases("cuda", dtype, "check")[0]
        first = info.fn(*case.args, **case.kwargs)
        for i in range(RUNS):  # compared as they come: 1,000 kept outputs of every op at once exhaust the GPU
            assert_bitwise_equal(info.fn(*case.args, **case.kwargs), first, f"{name} {dtype} run {i}")


@two_gpus
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_second_gpu(name):
    """Tensors on cuda:1 run on cuda:1 (device guard), whatever the current device, and match the reference."""
    info = REGISTRY[name]
    torch.manual_seed(0)
    case = info.cases("cuda", torch.float32, "tiny")[0]
    args, kwargs = _to(case.args, "cuda:1"), _to(dict(case.kwargs), "cuda:1")
    with torch.cuda.device(0):
        out = check_case(name, args, kwargs, what=f"{name} on cuda:1")
    for t in (out if isinstance(out, (tuple, list)) else [out]):
        if isinstance(t, torch.Tensor):
            assert t.device == torch.device("cuda:1"), f"{name}: output on {t.device}"


IN_TURN = ((0, 1), (1, 0), (0, 1))  # (the tensors' GPU, the current GPU) of each run


@two_gpus
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_gpus_in_turn_same_bits(name):
    """Every case of an op on cuda:0, then cuda:1, then cuda:0 again, with the other GPU current each time: the
    compiled kernels and plans cached for one device must not be launched for the other (its relaunch caches
    are keyed by device), and both GPUs (the same model) give the same bits."""
    info = REGISTRY[name]
    for dtype in (torch.float32, torch.bfloat16):
        if dtype not in info.dtypes:
            continue
        torch.manual_seed(0)
        for case in info.cases("cuda", dtype, "small"):
            outs = []
            for dev, current in IN_TURN:
                args, kwargs = _to(case.args, f"cuda:{dev}"), _to(dict(case.kwargs), f"cuda:{dev}")
                with torch.cuda.device(current):
                    out = check_case(name, args, kwargs, what=f"{name} {dtype} {case.label} on cuda:{dev}")
                outs.append(_to(out, "cpu"))
            for i, (dev, _) in enumerate(IN_TURN[1:], 1):
                assert_bitwise_equal(outs[i], outs[0], f"{name} {dtype} {case.label}: run {i} (cuda:{dev})")


@two_gpus
def test_mixed_devices_are_a_named_error():
    g = torch.randn(8, device="cuda:0")
    x = torch.randn(8, device="cuda:1")
    with pytest.raises(gradkern.Unsupported, match="device"):
        gradkern.ops.hardsigmoid_backward(g, x)


def _free_bytes() -> int:
    free, _ = torch.cuda.mem_get_info()
    return free


def test_pointwise_over_2_pow_31_elements_bf16():
    n = 2**31 + 4099
    if _free_bytes() < 4 * n * 2 + (1 << 30):
        pytest.skip("not enough GPU memory")
    g = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 4
    out = gradkern.ops.hardsigmoid_backward(g, x)
    ref = torch.ops.aten.hardsigmoid_backward(g, x)  # selection/exact scaling: bit-exact on the GPU too
    assert torch.equal(out, ref)
    del out, ref
    # strided path with int64 offsets: a transposed view of > 2^31 elements
    gt = g[: 2**31].view(2**16, 2**15).t()
    xt = x[: 2**31].view(2**16, 2**15).t()
    out = gradkern.ops.hardshrink_backward(gt, xt, 0.5)
    assert torch.equal(out, torch.ops.aten.hardshrink_backward(gt, xt, 0.5))


def _ddp_worker(rank: int, world: int, port: int, results):
    import torch.distributed as dist
    import torch.nn as nn

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    grads = {}
    for mode in ("stock", "gradkern"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.CELU(0.7), nn.Linear(64, 64), nn.Hardsigmoid(),
                              nn.Linear(64, 32), nn.Softshrink(0.1)).cuda(rank)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        torch.manual_seed(100 + rank)
        x = torch.randn(16, 32, device=f"cuda:{rank}") * 3
        with gradkern.use(mode == "gradkern"):
            ddp(x).square().sum().backward()
        grads[mode] = [p.grad.detach().cpu() for p in model.parameters()]
    results[rank] = all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(grads["stock"],
                                                                                      grads["gradkern"]))
    dist.destroy_process_group()


@two_gpus
def test_ddp_two_gpus_same_gradients_as_stock():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_ddp_worker, args=(2, port, results), nprocs=2, join=True)
    assert dict(results) == {0: True, 1: True}
