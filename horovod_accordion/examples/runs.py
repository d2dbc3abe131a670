"""What every example that trains several compressions in one launch prints: no framework."""


def announce(rank, compression):
    """Rank 0's first line of a run: where one launch trains several compressions in turn, each
    run's lines follow its own."""
    if rank == 0:
        print(f"[rank 0] training with {compression}", flush=True)
