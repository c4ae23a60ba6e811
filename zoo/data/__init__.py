"""Tasks and loaders: synthetic long-range tasks (built in, no download) and real text/data by path."""
