"""What every example that trains several compressions in one launch prints: no framework."""

import sys


def say(line):
    """Print ``line`` in one write: under ``torchrun`` the ranks share one stream, and ``print``
    writes the text and its newline apart, so another rank's line could land between them."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def announce(rank, compression):
    """Each rank's first line of a run: where one launch trains several compressions in turn, each
    rank's lines of a run follow its own announcement."""
    say(f"[rank {rank}] training with {compression}")
