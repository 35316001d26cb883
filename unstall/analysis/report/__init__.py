"""Stage 5, report: the `Advice` as JSON, terminal tables, an HTML page and a Chrome trace."""
