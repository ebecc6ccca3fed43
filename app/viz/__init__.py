"""Live visualisation of speculative decoding: draft tree, plots, planner."""
