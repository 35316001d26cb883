"""Stage 1, measure: the runs of a job and the machine they ran on (`Measurement`)."""
