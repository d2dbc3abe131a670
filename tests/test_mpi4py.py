"""Horovod on an mpi4py communicator, with process sets from ``MPI.COMM_WORLD.Split``:
``mpirun -np 4`` (4 ranks on 2 cores, oversubscribed), two sets of 2 training their own models,
in torch and in TensorFlow."""
import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env


@pytest.mark.multiworker
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_two_mpi4py_process_sets_decide_alike_inside_and_independently_across(framework, tmp_path):
    mpirun = subprocess.run(
        ["mpirun", "-np", "4", "--oversubscribe", sys.executable, "-m", "tests.workers.mpi4py_process_sets_job",
         framework, str(tmp_path)], cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert mpirun.returncode == 0, mpirun.stdout[-3000:] + mpirun.stderr[-3000:]
    ranks = [json.loads((pathlib.Path(tmp_path) / f"rank{r}.json").read_text()) for r in range(4)]
    sets = {0: [ranks[0], ranks[2]], 1: [ranks[1], ranks[3]]}
    for color, members in sets.items():
        assert [m["set"] for m in members] == [color, color] and members[0]["set_ranks"] == [color, color + 2]
        assert [m["set_rank"] for m in members] == [0, 1], members
        assert members[0]["checks"] == members[1]["checks"] and len(members[0]["checks"]) == 12, color
        assert members[0]["weights"] == members[1]["weights"], f"set {color}: the ranks' models differ"
    # Each set followed its own data: their models and their decisions are their own.
    assert sets[0][0]["weights"] != sets[1][0]["weights"]
    assert sets[0][0]["checks"] != sets[1][0]["checks"]
