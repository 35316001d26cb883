"""Stage 2, rates: G, the workers' CPU and storage per sample, stall shares (`Derived`)."""
