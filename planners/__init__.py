"""flowrl planners: driving and robot heads (see issues for the driving and robot work)."""
