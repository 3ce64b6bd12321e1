"""Faults: random faults across long elastic runs, and a lost replica against torchrun's restart."""
