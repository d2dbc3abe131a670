"""The resume launch of ``tests/workers/lightning_checks.py``: new processes start from its
mid-run checkpoint and must end where its uninterrupted run ended, bitwise."""
import torch
import torch.distributed as dist

from horovod_accordion.ddp import AccordionState
from tests.workers.ddp_checks import assert_same_parameters_on_all_ranks, levels_history
from tests.workers.lightning_checks import COMPRESSION, SHARED, Steps, trainer
from tests.workers.lightning_checks import setup  # noqa: F401 - the runner calls it


def check_resuming_from_the_mid_run_checkpoint_ends_bitwise_as_the_uninterrupted_run():
    state = AccordionState(compression=COMPRESSION, interval=1)
    module = Steps()
    trainer(state).fit(module, ckpt_path=SHARED / "mid-run.ckpt")
    uninterrupted = torch.load(SHARED / "uninterrupted.pt")
    saved = torch.load(SHARED / "mid-run.ckpt", weights_only=True)["accordion"]
    assert [entry["per_rank"]["rank"] for entry in saved] == [0, 1], "every rank's own memories"
    for name, p in module.net.named_parameters():
        q = uninterrupted["net"][name]
        assert torch.equal(p, q), f"{name}: max diff {(p - q).abs().max():.3e}"
    assert_same_parameters_on_all_ranks(module.net)
    history = levels_history(state.accordion_stats())
    assert history == uninterrupted["history"], (history, uninterrupted["history"])
    return {"steps": state.iter, "checks": len(history), "rank": dist.get_rank()}
