"""A tiny Django shop whose orders send a receipt through forq, after commit."""
