import os

# Without a GPU, Triton kernels run in the interpreter; it must be chosen before triton is imported.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# the shared helpers (helpers.py, models.py) for the tests in every subfolder
sys.path.insert(0, str(pathlib.Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    # with a GPU, Triton compiles for it and cannot take the CPU tensors of the interpreter tests;
    # test_gpu.py checks the same kernels bit for bit on the GPU
    marker, why = ("interpreter", "runs Triton kernels on CPU tensors (the interpreter, as in CI)") if (
        torch.cuda.is_available()) else ("gpu", "needs a CUDA GPU")
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs on a CUDA GPU only (the H200 runs)")
    config.addinivalue_line("markers", "interpreter: runs Triton kernels on CPU tensors, so only without a GPU")
    config.addinivalue_line("markers", "slow: sweeps, fuzzing, training and multi-process runs (minutes each; "
                                       ".ci/run runs them, the README's test command does not)")
