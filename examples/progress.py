"""The examples' progress bar (tqdm on rank 0 only, with loss, MB sent and the levels now) and check reports."""
from tqdm import tqdm


def epochs_bar(epochs, rank, desc="train"):
    return tqdm(range(epochs), desc=desc, unit="epoch", disable=rank != 0)


def show(bar, loss, bytes_sent=None, levels=None):
    """``levels``: {layer: level}; only the layers that have a level (compressed kinds) are shown."""
    postfix = {"loss": f"{loss:.4f}"}
    if bytes_sent is not None:
        postfix["MB"] = f"{bytes_sent / 1e6:.3f}"
    if levels and None not in levels.values():
        postfix["levels"] = ",".join(f"{level:g}" for level in levels.values())
    bar.set_postfix(postfix)


def write_checks(bar, checks, epoch):
    """Print rank 0's Accordion checks and LR decays of this epoch (``checks``: the new ones)."""
    for check in checks:
        levels = "  ".join(f"{name}={level}" for name, level in check["levels"].items())
        what = (f"LR decay to {check['lr']:g} in epoch {epoch}" if check["event"] == "lr_decay"
                else f"check after epoch {epoch}")
        bar.write(f"[rank 0] {what}: levels per layer: {levels}")
