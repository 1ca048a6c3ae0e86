"""``--gres=gpu:-1`` was read as GPU *type* ``-1`` (one GPU of it): the job was created
and rejected ``ExceedsCapacity(... gpu_types=-1 ...)``. A part that looks like a number
is a count, never a type, so ``gpu:-1`` and ``gpu:1.5`` get the refusal ``gpu:0`` gets;
an empty TYPE (``gpu::2``, ``-G :2``) and a non-ASCII digit are refused too; MIG-like
types that start with a digit (``1g.10gb``) are still types."""

from __future__ import annotations

import pytest

from gpushepherd.cli.sbatch import SbatchError, parse_options


@pytest.mark.parametrize("args", [["--gres=gpu:-1"], ["--gres=gpu:0"], ["--gres=gpu:1.5"], ["--gres=gpu:a100:0"],
                                  ["--gres=gpu:a100:1.5"], ["--gres=gpu:a100:-1"], ["--gres=gpu:"],
                                  ["--gres=gpu:a100:"], ["-G", "-1"], ["-G", "0"], ["-G", "a100:0"]])
def test_a_bad_count_is_refused_as_a_count(args):
    with pytest.raises(SbatchError, match="a GPU count >= 1"):
        parse_options(args, "job.sh")


@pytest.mark.parametrize("args", [["--gres=gpu::2"], ["--gres=gpu:-x:1"], ["--gres=gpu:1:2"], ["-G", ":2"],
                                  ["-G", "-1:2"], ["-G", "1.5:2"]])
def test_a_bad_type_is_refused_naming_it(args):
    with pytest.raises(SbatchError, match="the GPU TYPE '.*' is no type name"):
        parse_options(args, "job.sh")


@pytest.mark.parametrize("args", [["--gres=gpu:\u00b2"], ["-G", "\u00b2"], ["-n", "\u00b2"],
                                  ["--gpus-per-task", "\u0661"]])
def test_a_non_ascii_digit_is_no_count(args):
    with pytest.raises(SbatchError, match="is not allowed"):
        parse_options(args, "job.sh")


def test_good_requests_still_parse():
    assert parse_options(["--gres=gpu:1g.10gb:2"], "x")[0] == {"gpus": 2, "gpu_type": ["1g.10gb"]}
    assert parse_options(["--gres=gpu:a100"], "x")[0] == {"gpus": 1, "gpu_type": ["a100"]}
    assert parse_options(["--gres=gpu:3"], "x")[0] == {"gpus": 3, "gpu_type": []}
    assert parse_options(["-G", "h100-80gb:2"], "x")[0] == {"gpus": 2, "gpu_type": ["h100-80gb"]}
