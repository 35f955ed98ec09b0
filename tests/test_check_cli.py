"""`python -m mxfp8_inductor.check`: every mistake ends in one line naming the fix, before any
model is built or compiled."""

import pytest
import torch

from mxfp8_inductor.check.__main__ import main

pytest.importorskip("transformers")


@pytest.mark.parametrize("argv, message", [
    (["qwen3moe"], "unknown model type 'qwen3moe'; did you mean qwen3_moe"),
    (["mixtral", "--recipe", "rowwise"],
     "unknown recipe(s) ['rowwise']: choose from mxfp8, fp8_rowwise, fp8_blockwise, auto"),
    (["no_such_package.models:build"], "no module 'no_such_package.models' to import"),
])
def test_mistakes_give_one_line_naming_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_refused_before_building(capsys):
    with pytest.raises(SystemExit):
        main(["mixtral", "--device", "cuda"])
    assert "sees no CUDA GPU; run with --device cpu" in capsys.readouterr().err


def test_a_dense_model_says_there_is_nothing_to_compare(capsys):
    assert main(["llama"]) == 2
    assert "no routed-expert grouped matmul the pass would rewrite" in capsys.readouterr().err
