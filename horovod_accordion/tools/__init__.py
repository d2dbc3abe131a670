"""Tools beside training: the patched-Horovod installer and the plots of a run's log."""
