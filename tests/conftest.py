import os

# Without a GPU, Triton kernels run in the interpreter; it must be chosen before triton is imported.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Inductor compiles in this process, not in a pool of compile workers per test process: the test
# runs are already one process per core, and a pool's subprocesses are one more thing to hang
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

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


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With `-n N` (xdist's `load`), run each module that has module-scoped fixtures (a training run,
    process groups: minutes to build) on one worker, so that they are built once, and every other
    test on whichever worker is free. xdist's own `xdist_group` marks do not reach its scheduler
    under pytest 9 (it renames `Node._nodeid`, which pytest no longer reads)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared: dict[str, bool] = {}

    class FixtureModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module not in shared:
                path = config.rootpath / module
                shared[module] = path.suffix == ".py" and 'scope="module"' in path.read_text()
            return module if shared[module] else nodeid

    return FixtureModuleScheduling(config, log)
