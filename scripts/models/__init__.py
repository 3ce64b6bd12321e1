"""Models: the sync and optimizer rules in one process, on a virtual clock or in lockstep, to
choose a design before racing it."""
