"""The job's spine: how one `python train.py` runs, end to end. Stages (plan, build, fit), launching
ranks, the command line and its overrides, validation, the run record, checkpoint I/O and resume, errors
and the model card. Nothing imports run/ but train.py (and bench/, scripts/)."""
