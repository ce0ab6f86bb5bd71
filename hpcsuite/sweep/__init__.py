"""Sweeps: one base job over axes of any job key, submitted as one Slurm job array.

:mod:`.spec` reads a sweep file and expands it into elements (a grid, or random draws);
:mod:`.run` checks and plans every element before anything is submitted, writes the sweep
directory (:mod:`.sweepdir`) and submits the array, or one element again;
:mod:`.status` follows the elements; :mod:`.report` ranks them by the sweep's metric
(:mod:`.plots` draws it).
"""
