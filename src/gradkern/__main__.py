import os
import sys

import torch


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():  # (as _runtime reads it)
        # No GPU: run the kernels through Triton's interpreter on CPU. Triton reads the variable when gradkern's
        # kernels are defined (at import, which `python -m gradkern` has already done), so start afresh with it.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "gradkern", *sys.argv[1:]])
    from gradkern.tools.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
