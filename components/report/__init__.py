"""Stage: the run report (HTML with charts, Markdown summary, scalar metrics) from what the stages committed."""
