"""Stage 3, model: samples/s of a loader configuration from the rates (`Analysis`)."""
