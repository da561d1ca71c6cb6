"""Process infrastructure: the fit worker pool and the spool files that carry large bodies to it."""
