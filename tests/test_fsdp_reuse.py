"""Under FSDP2 a reused quantization of an expert weight follows every write into the sharded
weight, whatever its route: in place into `state_dict()`'s tensors, a torch.distributed.checkpoint
load into a state dict in place (fresh, or one held across loads), `load_state_dict`, `copy_` on
the parameter, an optimizer step (docs/design.md, "Weight cache" and "FSDP2: FP8 all-gather").

Both kinds of reuse, on 2 gloo ranks, compiled, with transposed expert weights:
`fsdp_fp8_all_gather=True` (each shard's FP8 form) and `weight_cache=True` (each unsharded
weight's quantization). tests/fsdp_reuse_worker.py flips the sign of the weights by each route
20 times in a row, a forward after each: every forward must compute with the weights of that
moment, while forwards without a write between them reuse what was quantized.
"""

import fsdp_reuse_worker
import pytest

pytestmark = pytest.mark.slow  # spawned ranks, two compiled models: about a minute on two cores


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return fsdp_reuse_worker.spawn(2, tmp_path_factory.mktemp("reuse"))


def _result(results: dict, mode: str) -> dict:
    result = results[mode]
    if "error" in result:
        pytest.fail(f"{mode} raised:\n{result['error']}", pytrace=False)
    return result


@pytest.mark.parametrize("route", fsdp_reuse_worker.ROUTES)
@pytest.mark.parametrize("mode", fsdp_reuse_worker.MODES)
def test_every_write_is_seen_by_the_next_forward(results, mode, route):
    seen = _result(results, mode)[route]
    assert len(seen) == fsdp_reuse_worker.TRIALS and all(seen), (
        f"forwards that computed with the weights before the write: {[i for i, ok in enumerate(seen) if not ok]}")


@pytest.mark.parametrize("mode", fsdp_reuse_worker.MODES)
def test_forwards_without_writes_reuse_the_quantization(results, mode):
    """Each weight is quantized in the first forward only, though every forward gathers it anew
    (into the same storage, resized to nothing between forwards)."""
    first, *later = _result(results, mode)["quantizations"]
    assert first > 0 and later == [0] * (fsdp_reuse_worker.REUSED_FORWARDS - 1), (first, later)
