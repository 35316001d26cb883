"""Stage 4, recommend: the loader settings to use and the remedies, priced (`Advice`)."""
