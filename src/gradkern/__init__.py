"""gradkern: deterministic Triton backward kernels for PyTorch.

    import gradkern
    gradkern.enable()            # route covered ATen ops on the GPU through gradkern
    with gradkern.use(): ...     # or only inside a block
    gradkern.ops.hardsigmoid_backward(grad_output, x)   # or call a kernel directly
"""

from . import ops
from ._runtime import default_device as device
from .errors import GradkernError, InvalidProblem, RankUnsupported, Unsupported
from .plan import Plan, plan
from .registry import Guarantee, guarantee, supported_ops
from .routing.dispatch import disable, enable, is_enabled, use

__version__ = "0.1.0"

__all__ = [
    "enable", "disable", "use", "is_enabled", "ops", "device", "guarantee", "supported_ops", "Guarantee", "plan",
    "Plan",
    "GradkernError", "InvalidProblem", "Unsupported", "RankUnsupported", "__version__", "sparsemax", "segment_max",
]
from .kernels.sparsemax import sparsemax  # noqa: E402,I001  (an autograd-aware op PyTorch lacks)
from .kernels.segment_max import segment_max  # noqa: E402,I001  (an autograd-aware op PyTorch lacks)
from .routing import interceptions  # noqa: E402,F401,I001  (declares the Python-level routes enable() installs)
