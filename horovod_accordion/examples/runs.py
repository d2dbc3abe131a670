"""What every example that trains several compressions in one launch prints: no framework."""


def announce(rank, compression):
    """Each rank's first line of a run: where one launch trains several compressions in turn, each
    rank's lines of a run follow its own announcement."""
    print(f"[rank {rank}] training with {compression}", flush=True)
